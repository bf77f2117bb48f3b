"""The DALI decoder's geometry (prepost/dali.py: imagenet as one region-of-interest resize, yolo as resize + slice
with the fill, none as a resize) against the reference matrices of prepost/resample.py, on real photographs
re-encoded as JPEG, with DALI's CPU backend (the GPU pipeline runs the same operators on the device)."""

import numpy as np
import pytest
from PIL import Image

from onnxaccel.inputs_files import ImagePreprocess
from onnxaccel.prepost.resample import geometry_plan, resample_numpy

PHOTOS = ["astronaut.png", "coffee.png", "chelsea.png", "motorcycle_left.png", "rocket.jpg"]


@pytest.fixture(scope="module")
def jpegs(photo, tmp_path_factory):
    folder = tmp_path_factory.mktemp("dali-jpegs")
    paths = []
    for k, name in enumerate(PHOTOS):
        img = Image.open(photo(name)).convert("RGB")
        for j, side in enumerate((None, 150)):  # as shipped, and small (upscaled by the geometry)
            shown = img if side is None else img.resize((side, round(side * img.height / img.width)))
            path = folder / f"{k}-{j}.jpg"
            shown.save(path, "JPEG", quality=90, progressive=bool(k % 2))
            paths.append(str(path))
    return paths


@pytest.mark.parametrize("preset", ["imagenet", "yolo", "none"])
@pytest.mark.parametrize("size", [(224, 224), (256, 320)])
def test_dali_geometry_equals_the_reference(jpegs, preset, size):
    pytest.importorskip("nvidia.dali")
    from onnxaccel.prepost.dali import cpu_pipeline_images

    height, width = size
    pre = ImagePreprocess(preset=preset)
    got, decoded = cpu_pipeline_images(jpegs, height, width, pre)
    for path, pixels, image in zip(jpegs, got, decoded):
        want = resample_numpy(image, height, width, pre).astype(int)
        diff = np.abs(pixels.astype(int) - want)
        assert pixels.shape == (height, width, 3) and pixels.dtype == np.uint8
        # At the image's own edges DALI repeats the edge pixel where Pillow and torch drop the taps outside and
        # renormalise: output rows/columns whose taps reach an edge may differ by a few levels; none other by > 1.
        (fy, wy), (fx, wx), _ = geometry_plan(image.shape[0], image.shape[1], height, width, pre)
        edge_rows = (fy == 0) | (fy + wy.shape[1] >= image.shape[0])
        edge_cols = (fx == 0) | (fx + wx.shape[1] >= image.shape[1])
        assert diff[~edge_rows][:, ~edge_cols].max() <= 1, (path, preset)
        assert diff.max() <= 16 and diff.mean() < 0.01, (path, preset, diff.max(), diff.mean())
