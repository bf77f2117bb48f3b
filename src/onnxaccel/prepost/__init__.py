"""Pre- and post-processing for the model families users run most: image presets (imagenet, yolo, scale01,
none) chosen from the model's metadata or ``--preprocess``, letterboxing, top-k with ImageNet labels, YOLOv8
detection decoding with NMS, and drawing the boxes. docs/PREPROCESSING.md describes them.

Nothing is imported here on purpose: ``inputs_files`` imports ``prepost.letterbox`` and ``prepost.presets``
imports ``inputs_files``, so an eager import in this file would make a cycle.
"""
