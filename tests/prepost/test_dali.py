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

    def schedule_run(self):
        pass

    def share_outputs(self):
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

    monkeypatch.setattr(DaliDecoder, "_device_setup", lambda self, device: None)
    monkeypatch.setattr(DaliDecoder, "warm_up", lambda self, count: None)
    dec = DaliDecoder(224, 224, ImagePreprocess(preset="imagenet"))
    dec._fallback = _RecordingFallback()
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
    from onnxaccel.scale.pipeline import _DeviceDecodeSource

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


class _CpuDaliDecoder:
    """prepost/dali.py's DaliDecoder with DALI's CPU decoder (same pipeline shape, the same batches-ahead driving:
    feed_input + schedule_run, share_outputs + release_outputs) and numpy outputs: what can run here without a GPU."""

    @staticmethod
    def make(monkeypatch, ahead: int):
        from nvidia.dali import fn, math as dmath, pipeline_def, types

        from onnxaccel.prepost.dali import DaliDecoder, geometry

        class Cpu(DaliDecoder):
            AHEAD = ahead

            def _device_setup(self, device):
                pass

            def warm_up(self, count):
                pass

            def _pipeline(self, batch):
                height, width, pre = self.height, self.width, self.pre

                @pipeline_def(batch_size=batch, num_threads=2, device_id=None, prefetch_queue_depth=max(1, ahead))
                def images():
                    names = fn.external_source(name="paths", dtype=types.UINT8, ndim=1)
                    encoded = fn.io.file.read(names)
                    decoded = fn.decoders.image(encoded, device="cpu", output_type=types.RGB,
                                                adjust_orientation=False)
                    return geometry(fn, types, dmath, encoded, decoded, height, width, pre)

                return images()

            def _take(self, out, rows):
                return np.stack([np.asarray(out.at(k)) for k in range(rows)]), {}

        dec = Cpu(224, 224, ImagePreprocess(preset="imagenet"))
        dec._fallback = _RecordingFallback()
        return dec


@pytest.mark.parametrize("ahead", [1, 3])
def test_dali_batches_ahead_come_back_in_order_and_equal_one_at_a_time(jpegs, monkeypatch, tmp_path, ahead):
    """Units submitted ahead (up to 3 in flight, as `batch`'s reader starts them) come back each with its own
    pixels, equal to the same files run one batch at a time; a batch that fails in DALI (a truncated JPEG) goes
    through the fallback decoder with the batches that were in flight behind it, and the pipeline is rebuilt for
    the next ones; a larger batch rebuilds the pipeline after taking what the old one held."""
    pytest.importorskip("nvidia.dali")
    from onnxaccel.prepost.dali import cpu_pipeline_images

    pre = ImagePreprocess(preset="imagenet")
    broken = tmp_path / "truncated.jpg"
    broken.write_bytes(open(jpegs[0], "rb").read()[:300])
    batches = [jpegs[0:3], jpegs[3:5], jpegs[5:9], jpegs[9:10], [jpegs[1], str(broken)], jpegs[2:4], jpegs[4:7]]
    want = {k: np.stack(cpu_pipeline_images(b, 224, 224, pre)[0]) for k, b in enumerate(batches) if k != 4}
    dec = _CpuDaliDecoder.make(monkeypatch, ahead)
    tickets, got = [], {}
    for k, batch in enumerate(batches):
        tickets.append(dec.submit(batch))
        if len(tickets) - len(got) >= max(1, ahead):  # the reader collects the oldest once `ahead` are in flight
            oldest = len(got)
            got[oldest] = dec.collect(tickets[oldest])
    while len(got) < len(batches):
        got[len(got)] = dec.collect(tickets[len(got)])
    assert got[4] == ("pixels", {1: "cannot decode JPEG"}) and dec._fallback.calls[0] == batches[4]
    for k, pixels in want.items():
        if (ahead, k) in ((3, 5), (3, 6)):  # were in flight behind the failed batch: the fallback took them
            assert got[k][0] == "pixels" and batches[k] in dec._fallback.calls
        else:
            assert np.array_equal(got[k][0], pixels), k
    first = dec.submit(jpegs[:2])
    assert dec.pipe is not None  # rebuilt after the failure
    dec.submit(jpegs[2:4])
    bigger = dec.submit(jpegs * 6)  # more files than the pipeline's batch: rebuilt, the two before taken first
    assert dec.batch >= len(jpegs) * 6
    assert np.array_equal(dec.collect(first)[0], np.stack(cpu_pipeline_images(jpegs[:2], 224, 224, pre)[0]))
    assert dec.collect(bigger)[0].shape == (len(jpegs) * 6, 224, 224, 3)
    with pytest.raises(KeyError):
        dec.collect(first)
