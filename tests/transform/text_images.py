"""Real-ish inputs for the pretrained PP-OCR text-direction classifier: rendered text lines, half upside down.

The classifier (x[N,3,48,192], PaddleOCR preprocessing (x/255 - 0.5) / 0.5) tells 0 from 180 degrees; on these
renders the FP32 model is right about 92% of the time, so they exercise its real decision boundary.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

WORDS = ("the quick brown fox jumps over lazy dog invoice total amount date receipt model runtime "
         "accelerate 2024 ONNX 12.50 hello world").split()
#: --mean/--std/--resize that make onnxaccel's image loader match PaddleOCR's classifier preprocessing.
PREPROCESS_ARGS = ["--mean", "0.5,0.5,0.5", "--std", "0.5,0.5,0.5", "--resize", "48"]


def render(index: int, width: int = 192, height: int = 48) -> tuple[Image.Image, bool]:
    rng = random.Random(index)
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3)))
    font = ImageFont.load_default(size=rng.randint(18, 30))
    image = Image.new("RGB", (width, height), tuple(rng.randint(200, 255) for _ in range(3)))
    ImageDraw.Draw(image).text((rng.randint(0, 20), rng.randint(0, 12)), text,
                               fill=tuple(rng.randint(0, 60) for _ in range(3)), font=font)
    upside_down = index % 2 == 1
    return (image.rotate(180) if upside_down else image), upside_down


def write_folder(folder: Path, start: int, count: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(start, start + count):
        render(i)[0].save(folder / f"{i:04d}.png")
    return folder


def tensor(image: Image.Image) -> np.ndarray:
    array = (np.asarray(image, np.float32) / 255.0 - 0.5) / 0.5
    return array.transpose(2, 0, 1)[None]
