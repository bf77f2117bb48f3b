"""Pre- and post-processing for the model families users run most: image presets (imagenet, yolo, scale01,
none) chosen from the model's metadata or ``--preprocess``, letterboxing, top-k with ImageNet labels, YOLOv8
detection decoding with NMS, and drawing the boxes. docs/PREPROCESSING.md describes them. The letterbox
geometry itself is onnxaccel/image_geometry.py (the feed readers use it too).
"""
