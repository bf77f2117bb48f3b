"""The batched GPU geometry's matrices (prepost/resample.py) against Pillow's resize, crop and letterbox of real
photographs: the CPU reference (resample_numpy) applies the same tap plans the GPU's BatchResampler sends."""

import numpy as np
import pytest
from PIL import Image

from onnxaccel.inputs_files import ImagePreprocess, apply_geometry
from onnxaccel.prepost.resample import aa_taps, axis_plan, dense, geometry_plan, resample_numpy

PHOTOS = ["astronaut.png", "coffee.png", "chelsea.png", "motorcycle_left.png", "rocket.jpg"]


@pytest.mark.parametrize("in_size,out_size", [(500, 256), (375, 292), (224, 224), (100, 224), (641, 97)])
def test_taps_are_a_normalised_band(in_size, out_size):
    first, weights = aa_taps(in_size, out_size)
    assert np.allclose(weights.sum(1), 1.0, atol=1e-6)
    assert (weights >= 0).all() and (first >= 0).all()
    m = dense((first, weights), in_size)  # every tap inside the image
    assert m.shape == (out_size, in_size) and np.allclose(m.sum(1), 1.0)


def test_same_size_is_the_identity():
    assert np.array_equal(dense(axis_plan(224, 224, 224, 0), 224), np.eye(224))


@pytest.mark.parametrize("preset", ["imagenet", "yolo", "none"])
@pytest.mark.parametrize("size", [(224, 224), (256, 320)])
@pytest.mark.parametrize("name", PHOTOS)
def test_matches_pillow_on_photographs(photo, name, preset, size):
    img = Image.open(photo(name)).convert("RGB")
    height, width = size
    pre = ImagePreprocess(preset=preset)
    want = np.asarray(apply_geometry(img, height, width, pre)[0])
    got = resample_numpy(np.asarray(img), height, width, pre)
    diff = np.abs(got.astype(int) - want.astype(int))
    assert got.shape == want.shape == (height, width, 3)
    # Pillow rounds between its two passes (uint8), the matrices do not (as torch's antialiased interpolate)
    assert diff.max() <= 1 and diff.mean() < 0.25, (diff.max(), diff.mean())


def test_upscaled_small_image_matches_pillow(photo):
    img = Image.open(photo("chelsea.png")).convert("RGB").resize((90, 60), Image.BILINEAR)
    for preset in ("imagenet", "yolo", "none"):
        pre = ImagePreprocess(preset=preset)
        want = np.asarray(apply_geometry(img, 224, 224, pre)[0]).astype(int)
        diff = np.abs(resample_numpy(np.asarray(img), 224, 224, pre).astype(int) - want)
        assert diff.max() <= 1, (preset, diff.max())


def test_letterbox_rows_outside_the_image_show_no_image():
    (first_y, wy), (first_x, wx), pad = geometry_plan(300, 600, 224, 224, ImagePreprocess(preset="yolo"))
    shown = wy.sum(1) > 0
    assert pad == 114.0 and shown.sum() == 112 and not shown[:56].any() and not shown[168:].any()
    assert (wx.sum(1) > 0).all()


def test_batch_resampler_equals_the_reference_on_mixed_sizes(photo):
    """BatchResampler (torch; on the CPU here where torch is installed, on the GPU in `batch`) on photographs of
    different sizes in one batch: each row as the per-image reference, for every preset."""
    torch = pytest.importorskip("torch")
    from onnxaccel.prepost.resample import BatchResampler

    imgs = [np.asarray(Image.open(photo(n)).convert("RGB")) for n in PHOTOS]
    imgs.append(np.asarray(Image.open(photo("coffee.png")).convert("RGB").resize((90, 60))))  # upscaled
    for preset in ("imagenet", "yolo", "none"):
        pre = ImagePreprocess(preset=preset)
        got = BatchResampler(torch, "cpu", 224, 256, pre)([torch.from_numpy(i.copy()).permute(2, 0, 1) for i in imgs])
        assert got.shape == (len(imgs), 224, 256, 3) and got.dtype == torch.uint8
        for k, img in enumerate(imgs):
            diff = np.abs(got[k].numpy().astype(int) - resample_numpy(img, 224, 256, pre).astype(int))
            assert diff.max() <= 1 and diff.mean() < 0.01, (preset, k, diff.max(), diff.mean())


def test_batch_resampler_chunks_large_batches_the_same(photo, monkeypatch):
    """A batch whose padded copy would pass MAX_BATCH_BYTES is resampled in consecutive chunks: same rows."""
    torch = pytest.importorskip("torch")
    from onnxaccel.prepost.resample import BatchResampler

    imgs = [torch.from_numpy(np.asarray(Image.open(photo(n)).convert("RGB")).copy()).permute(2, 0, 1)
            for n in PHOTOS]
    pre = ImagePreprocess(preset="imagenet")
    whole = BatchResampler(torch, "cpu", 224, 224, pre)(imgs)
    chunked = BatchResampler(torch, "cpu", 224, 224, pre)
    monkeypatch.setattr(chunked, "MAX_BATCH_BYTES", 2 * 660 * 660 * 12)  # two of the largest photographs at most
    calls = []
    real = chunked._resample
    monkeypatch.setattr(chunked, "_resample", lambda im, sz: calls.append(len(im)) or real(im, sz))
    assert torch.equal(chunked(imgs), whole) and len(calls) > 1 and sum(calls) == len(imgs)
