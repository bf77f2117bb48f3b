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
    img = Image.open(photo("coffee.png")).convert("RGB")
    # Sizes whose scaled side lands on an exact half (Python's round goes to even): imagenet 224 on 685x512
    # (342.5), yolo 224 on 448x301 (150.5); and a file whose EXIF says "rotate 90" (neither path rotates).
    for name, size in (("half-imagenet", (685, 512)), ("half-yolo", (448, 301))):
        img.resize(size).save(folder / f"{name}.jpg", "JPEG", quality=90)
        paths.append(str(folder / f"{name}.jpg"))
    # Photographs already at the model's size (both sizes the tests use): fed as they are, never resized or cropped.
    for name, size in (("exact-224", (224, 224)), ("exact-256x320", (320, 256))):
        img.resize(size).save(folder / f"{name}.jpg", "JPEG", quality=90)
        paths.append(str(folder / f"{name}.jpg"))
    exif = Image.Exif()
    exif[0x0112] = 6
    img.resize((300, 500)).save(folder / "exif-rotated.jpg", "JPEG", quality=90, exif=exif)
    paths.append(str(folder / "exif-rotated.jpg"))
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


class _FailingPipe:
    """Stands in for a DALI GPU pipeline (none can run here without a GPU) whose batch fails to decode."""

    def feed_input(self, name, data):
        self.fed = (name, len(data))

    def run(self):
        raise RuntimeError("Critical error in pipeline: nvJPEG could not decode sample 3")


class _RecordingFallback:
    library = "nvimgcodec"
    phases = {"images": 0, "read_s": 0.0, "decode_s": 0.0, "resize_s": 0.0, "copy_s": 0.0}

    def __init__(self):
        self.phases = dict(self.phases)
        self.calls = []

    def decode_device(self, paths):
        self.calls.append(list(paths))
        self.phases["images"] += len(paths)
        self.phases["decode_s"] += 0.25
        return "pixels", {1: "cannot decode JPEG"}


def _decoder(monkeypatch, build):
    from onnxaccel.prepost.dali import DaliDecoder

    dec = object.__new__(DaliDecoder)
    dec.pipe, dec.batch, dec._fallback, dec.torch, dec.fallback_images = None, 0, _RecordingFallback(), None, 0
    dec.min_batch = 64
    dec.phases = {"images": 0, "read_s": 0.0, "decode_s": 0.0, "resize_s": 0.0, "copy_s": 0.0}
    monkeypatch.setattr(dec, "_build", build)
    return dec


def test_dali_batch_that_fails_goes_through_the_fallback_and_counts_in_the_report(monkeypatch):
    def build(batch):
        dec.pipe, dec.batch = _FailingPipe(), batch

    dec = _decoder(monkeypatch, build)
    paths = [f"/data/{k}.jpg" for k in range(4)]
    assert dec.decode_device(paths) == ("pixels", {1: "cannot decode JPEG"})
    assert dec._fallback.calls == [paths] and dec.pipe is None  # rebuilt at the next batch
    assert dec.phases["images"] == 4 and dec.phases["decode_s"] == 0.25  # the job's report sees the fallback's work
    dec.decode_device(["/data/a.png"])  # other formats: the fallback, without DALI
    assert dec._fallback.calls[-1] == ["/data/a.png"] and dec.phases["images"] == 5
    # The job's report does not say "through DALI" alone when another library decoded images.
    from onnxaccel.scale.decode_sources import _DeviceDecodeSource

    source = object.__new__(_DeviceDecodeSource)
    source.decoders = [dec]
    (note,) = source.phase_note()
    assert note.startswith("nvJPEG through DALI") and "5 of them through nvImageCodec" in note, note


def test_dali_pipeline_that_cannot_be_built_is_an_error_not_a_silent_fallback(monkeypatch):
    def build(batch):
        raise RuntimeError("DALI: CUDA driver version is insufficient for CUDA runtime version")

    dec = _decoder(monkeypatch, build)
    with pytest.raises(RuntimeError, match="CUDA driver"):
        dec.decode_device(["/data/0.jpg"])
    assert dec._fallback.calls == []


def test_dali_pipeline_is_built_at_the_jobs_batch(monkeypatch):
    """DALI builds a pipeline per batch size: a decoder made for a job at batch 256 (``min_batch``, which its
    warm-up runs at) builds at 256 for any unit up to that, so the job never rebuilds after the warm-up (warmed at
    64 and run at 256, a GPU ran 4,811 rows/s against 11,169 at batch 64); a larger unit still gets its size."""
    built = []

    def build(batch):
        built.append(batch)
        dec.pipe, dec.batch = _FailingPipe(), batch

    dec = _decoder(monkeypatch, build)
    dec.min_batch = 256
    dec.decode_device([f"/data/{k}.jpg" for k in range(40)])  # the last, short unit of a job
    dec.decode_device([f"/data/{k}.jpg" for k in range(300)])
    assert built == [256, 300]


class _HostTorch:
    """torch as CpuFallback uses it (from_numpy, .to(device)), on the host: there is no torch on this machine."""

    @staticmethod
    def from_numpy(array):
        return type("Tensor", (), {"to": lambda self, device: array})()


def test_dali_without_a_gpu_fallback_library_decodes_refused_files_on_the_cpu(monkeypatch, photo, tmp_path):
    """--decoder dali where neither nvImageCodec nor torchvision is installed: files DALI refuses (not JPEG, or in a
    batch it failed) are decoded by Pillow and copied to the device, a bad file a row with its message, instead of
    the job failing at the first such file with "No module named 'torchvision'"."""
    import sys

    from onnxaccel.prepost import cpu_decode, dali, nvjpeg

    def no_library(*args, **kwargs):
        raise ImportError("No module named 'torchvision'", name="torchvision")

    monkeypatch.setattr(nvjpeg, "NvjpegDecoder", no_library)
    monkeypatch.setitem(sys.modules, "torch", _HostTorch)
    dec = object.__new__(dali.DaliDecoder)
    dec.height, dec.width, dec.pre, dec.device_id, dec.device = 64, 64, ImagePreprocess(preset="imagenet"), 0, "cuda:0"
    dec._fallback, dec.fallback_images, dec.torch = None, 0, None
    dec.phases = {"images": 0, "read_s": 0.0, "decode_s": 0.0, "resize_s": 0.0, "copy_s": 0.0}
    good = tmp_path / "coffee.png"
    Image.open(photo("coffee.png")).convert("RGB").save(good)
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"not an image")
    pixels, errors = dec.decode_device([str(good), str(bad)])
    assert isinstance(dec._fallback, dali.CpuFallback) and dec.fallback_images == 2
    assert pixels.shape == (2, 64, 64, 3) and not pixels[1].any() and list(errors) == [1]
    assert np.array_equal(pixels[0], cpu_decode.decode_pixels(good, 64, 64, dec.pre)) and pixels[0].std() > 10
    assert "Cannot read image" in errors[1] and dec.phases["images"] == 2


def test_dali_decoder_is_made_and_warmed_for_the_jobs_batch(monkeypatch):
    """DaliDecoder(..., batch=256) warms up with a batch of 256 (its pipeline is built at that size before the
    job); at batch 16 it still warms with 64 (the warm-up's own count) and builds at 64."""
    pytest.importorskip("nvidia.dali")
    import sys

    from onnxaccel.prepost.dali import DaliDecoder

    cuda = type("Cuda", (), {"Stream": staticmethod(lambda device: None)})
    monkeypatch.setitem(sys.modules, "torch", type("FakeTorch", (), {"cuda": cuda}))
    warmed = []
    monkeypatch.setattr(DaliDecoder, "warm_up", lambda self, count: warmed.append(count))
    assert DaliDecoder(224, 224, ImagePreprocess(preset="imagenet"), 0, batch=256).min_batch == 256
    assert DaliDecoder(224, 224, ImagePreprocess(preset="imagenet"), 0, batch=16).min_batch == 64
    assert warmed == [256, 64]
