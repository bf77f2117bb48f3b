"""The pipelined in-process `batch` (scale/pipeline.py): uint8 pixels into a model with embedded preprocessing
give the float host path's outputs on real photographs, the report breaks time down by stage, bad JPEGs become
error rows, and a SIGKILLed pipelined run over images resumes with every row exactly once."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from onnxaccel.scale import BatchJob, load_results, run_batch
from onnxaccel.scale.stages import StageTimes
from tests.scale.conftest import BATCH_APP, kill_after_shards

PHOTOS = ("astronaut.png", "coffee.png", "chelsea.png", "motorcycle_left.png", "rocket.jpg")


def write_photo_jpegs(photo, folder: Path, count: int) -> Path:
    """``count`` JPEGs re-encoded from scikit-image's sample photographs at ImageNet-like sizes and qualities."""
    folder.mkdir(parents=True, exist_ok=True)
    sources = [Image.open(photo(name)).convert("RGB") for name in PHOTOS]
    for i in range(count):
        img = sources[i % len(sources)]
        side = 500 - 40 * ((i // len(sources)) % 4)
        scale = side / max(img.size)
        img = img.resize((round(img.width * scale), round(img.height * scale)), Image.BILINEAR)
        buffer = io.BytesIO()
        img.save(buffer, "JPEG", quality=75 + 5 * (i % 4))
        (folder / f"photo-{i:04d}.jpg").write_bytes(buffer.getvalue())
    return folder


def _embedded(model: str) -> str:
    """The cached copy of ``model`` with ImageNet preprocessing embedded, as `batch --embed-preprocess` runs it."""
    from onnxaccel.transform.embed_preprocess import embedded_copy

    return embedded_copy(model, "imagenet")


def test_embedded_pixels_match_the_float_host_path(tmp_path, squeezenet, photo):
    data = write_photo_jpegs(photo, tmp_path / "jpegs", 10)
    fast = run_batch(BatchJob(_embedded(squeezenet), str(data), str(tmp_path / "u8"), target="cpu", batch=4,
                              decoder="cpu-pool"))
    slow = run_batch(BatchJob(squeezenet, str(data), str(tmp_path / "f32"), target="cpu", batch=4))
    assert fast.embedded["dtype"] == "uint8" and slow.embedded is None
    assert fast.stages["decoder"] == "cpu-pool" and slow.stages["decoder"] == "host-float"
    got, want = load_results(tmp_path / "u8"), load_results(tmp_path / "f32")
    assert got.row_ids == want.row_ids and len(got.row_ids) == 10
    a, b = got.outputs["softmaxout_1"], want.outputs["softmaxout_1"]
    # Reduced-size decoding moves pixels by ~1 level: class probabilities stay within a few hundredths, and the
    # top class agrees on most photos.
    assert np.abs(a - b).max() < 0.08, np.abs(a - b).max()
    assert (a.argmax(1) == b.argmax(1)).mean() >= 0.8
    # A second run finds the embedded copy in the cache; the model file it ran is the same.
    again = run_batch(BatchJob(_embedded(squeezenet), str(data), str(tmp_path / "u8b"), target="cpu", batch=4,
                               decoder="cpu"))
    assert again.stages["decoder"] == "cpu"
    np.testing.assert_allclose(load_results(tmp_path / "u8b").outputs["softmaxout_1"], a, atol=1e-6)


def test_report_breaks_time_down_by_stage(tmp_path, squeezenet, photo):
    data = write_photo_jpegs(photo, tmp_path / "jpegs", 6)
    report = run_batch(BatchJob(_embedded(squeezenet), str(data), str(tmp_path / "out"), target="cpu", batch=4,
                                decoder="cpu"))
    stages = report.to_dict()["stages"]
    assert set(stages["stages"]) == {"read", "decode", "wait_for_device", "starved", "run", "write"}
    assert stages["stages"]["decode"]["s"] > 0 and stages["stages"]["run"]["s"] > 0
    assert stages["stages"]["write"]["s"] > 0 and stages["units"] == 2
    assert stages["bottleneck"] in ("read", "decode", "run", "write")
    assert 0 < stages["stages"]["run"]["pct_of_wall"] <= 100


def test_shutdown_is_left_out_of_the_steady_rate_like_start_up(tmp_path, squeezenet, photo, monkeypatch):
    """Seconds after the last rows are written (closing decoders and sessions: a DALI pipeline's teardown took
    ~0.4 s on a GPU machine, a quarter of a 10,000-image run) are a cost per run, reported as shutdown_s and left out of
    rows_per_s as start-up is; rows_per_s_wall still counts every second."""
    import time

    from onnxaccel.scale import worker as worker_module

    real_close = worker_module.BatchWorker.close

    def slow_close(self):
        time.sleep(0.8)
        real_close(self)

    monkeypatch.setattr(worker_module.BatchWorker, "close", slow_close)
    data = write_photo_jpegs(photo, tmp_path / "jpegs", 6)
    report = run_batch(BatchJob(_embedded(squeezenet), str(data), str(tmp_path / "out"), target="cpu", batch=4,
                                decoder="cpu"))
    d = report.to_dict()
    assert d["shutdown_s"] >= 0.8 and report.startup_s + report.shutdown_s < report.wall_s
    steady = report.wall_s - report.startup_s - report.shutdown_s
    assert d["rows_per_s"] == pytest.approx(6 / steady)
    assert d["rows_per_s_wall"] == pytest.approx(6 / report.wall_s) and d["rows_per_s_wall"] < d["rows_per_s"] / 2


@pytest.mark.parametrize("library,threads", [("nvimgcodec", 2), ("torchvision", 3), ("dali", 3)])
def test_gpu_decoding_threads_follow_the_library(monkeypatch, library, threads):
    """Each nvJPEG library gets the thread count measured best for it (prepost/decode.py DECODE_THREADS), and the
    job's stage breakdown divides the decoding time by that many threads."""
    from onnxaccel.prepost import decode
    from onnxaccel.scale import decode_sources

    monkeypatch.setattr(decode.NvjpegDecoder, "LIBRARY", library)
    monkeypatch.setattr(decode, "nvimgcodec_missing", lambda: "")  # "nvimgcodec" must resolve to itself here
    assert decode.gpu_decode_threads() == threads
    monkeypatch.setattr(decode_sources, "GPU_DECODE_THREADS", None)
    source = decode_sources._DeviceDecodeSource.__new__(decode_sources._DeviceDecodeSource)
    made = []
    monkeypatch.setattr(decode_sources, "GPU_DECODER_CLASS", f"{__name__}:_CpuAsGpuOnDevice")
    monkeypatch.setattr(_CpuAsGpuOnDevice, "__init__", lambda self, *a, **k: made.append(k["batch"]) or None)
    worker = SimpleNamespace(spec=SimpleNamespace(batch=96))  # each decoder is made for the job's batch size
    decode_sources._DeviceDecodeSource.__init__(source, worker=worker, inline=(224, 224, None, 0))
    assert made == [96] * threads and source.threads._max_workers == threads
    source.close()


def test_bottleneck_is_the_busiest_stage():
    times = StageTimes(wall_s=10, decode_s=72, decode_workers=8, run_s=4, write_s=1)
    assert times.bottleneck() == "decode"  # 72 s over 8 processes: 90% of their capacity
    times = StageTimes(wall_s=10, decode_s=8, decode_workers=8, run_s=9.5)
    assert times.bottleneck() == "run" and round(times.to_dict()["stages"]["run"]["pct_of_wall"]) == 95


def test_bad_jpeg_is_an_error_row_in_the_pixel_path(tmp_path, squeezenet, photo, cli):
    data = write_photo_jpegs(photo, tmp_path / "jpegs", 5)
    (data / "photo-0002.jpg").write_bytes(b"\xff\xd8 truncated")
    result = cli(squeezenet, "--input", str(data), "--output", str(tmp_path / "out"), "--target", "cpu",
                 "--batch", "4", "--embed-preprocess", "imagenet", "--decoder", "cpu-pool", "--json")
    assert result.exit_code == 3, result.output
    report = json.loads(result.stdout)
    assert report["rows"] == {"total": 5, "done": 4, "skipped": 0, "failed": 1}
    assert [e["file"] for e in report["errors"]] == ["photo-0002.jpg"]
    assert load_results(tmp_path / "out").row_ids == [f"photo-{i:04d}.jpg" for i in (0, 1, 3, 4)]


def test_killed_pipelined_image_run_resumes_exactly_once(tmp_path, squeezenet, photo):
    data = write_photo_jpegs(photo, tmp_path / "jpegs", 64)
    out = tmp_path / "out"
    cmd = [sys.executable, "-c", BATCH_APP, "batch", squeezenet, "--input", str(data), "--output", str(out),
           "--target", "cpu", "--batch", "4", "--images-per-shard", "4", "--embed-preprocess", "imagenet",
           "--decoder", "cpu-pool", "--json"]
    killed_at = kill_after_shards(cmd, out)
    assert 2 <= killed_at < 16

    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert report["shards"] == {"total": 16, "done": 16 - killed_at, "skipped": killed_at}
    assert report["rows"]["done"] + report["rows"]["skipped"] == 64
    assert not [p.name for p in out.iterdir() if ".tmp-" in p.name]
    resumed = load_results(out)
    assert sorted(resumed.row_ids) == [f"photo-{i:04d}.jpg" for i in range(64)]
    assert len(set(resumed.row_ids)) == len(resumed.row_ids) == 64
    clean = tmp_path / "clean"
    run_batch(BatchJob(_embedded(squeezenet), str(data), str(clean), target="cpu", batch=4, images_per_shard=4,
                       decoder="cpu"))
    reference = load_results(clean)
    assert resumed.row_ids == reference.row_ids
    np.testing.assert_allclose(resumed.outputs["softmaxout_1"], reference.outputs["softmaxout_1"], atol=1e-6)


def test_a_failing_write_stops_the_pipeline_and_is_raised(tmp_path, mlp_path, npy_data):
    import pytest

    from onnxaccel.scale.datasets import open_dataset, plan_units
    from onnxaccel.plan import PlanRequest, plan_execution
    from onnxaccel.scale.pipeline import run_pipelined
    from onnxaccel.scale.worker import WorkerSpec
    from onnxaccel.target import parse_target
    from onnxaccel import load_model

    bound = load_model(str(mlp_path)).bind(None, batch=4)
    dataset = open_dataset(str(npy_data), bound)
    units = plan_units(dataset, [s.index for s in dataset.shards], 4)
    seen = []

    def sink(result):
        seen.append(result.unit)
        if len(seen) == 2:
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        plan = plan_execution(parse_target("cpu"), PlanRequest(command="batch", batch=4))
        run_pipelined(WorkerSpec(str(mlp_path), plan, dataset), units, sink)
    assert seen == units[:2]  # in order, and nothing handed over after the failure


def test_stop_at_a_bad_jpeg_keeps_the_shards_before_it(tmp_path, squeezenet, photo):
    import pytest

    from onnxaccel.errors import InputError

    data = write_photo_jpegs(photo, tmp_path / "jpegs", 12)
    (data / "photo-0009.jpg").write_bytes(b"\xff\xd8 truncated")
    with pytest.raises(InputError, match=r"stopped at photo-0009.jpg.*--on-error stop"):
        run_batch(BatchJob(_embedded(squeezenet), str(data), str(tmp_path / "out"), target="cpu", batch=4,
                           images_per_shard=4,
                           decoder="cpu-pool", on_error="stop"))
    kept = load_results(tmp_path / "out")
    assert kept.row_ids == [f"photo-{i:04d}.jpg" for i in range(8)]


def test_scale_reads_the_metadata_key_transform_writes():
    from onnxaccel.scale.job import META_EMBEDDED as read
    from onnxaccel.transform.embed_preprocess import META_EMBEDDED as written

    assert read == written


class _SlowWorker:
    """A worker whose two instances finish units out of order (the later unit first) to check the pipeline's
    ordering: each instance is a real thread, the runs sleep."""

    instances = 2
    planned_instances = 2  # every instance in service from the start: nothing to join

    def __init__(self, fail_at: int | None = None):
        from concurrent.futures import ThreadPoolExecutor

        self.threads = [ThreadPoolExecutor(1) for _ in range(2)]
        self.fail_at = fail_at

    def infer_async(self, unit, data, index):
        import time as _time

        def run():
            _time.sleep(0.03 if unit % 2 == 0 else 0.001)  # even units slow: odd ones finish first
            if unit == self.fail_at:
                raise RuntimeError(f"unit {unit} failed")
            from onnxaccel.scale.worker import UnitResult

            return UnitResult(unit, [str(unit)], {}, 0.0, 0.01, f"instance {index}", [])

        return self.threads[index].submit(run)


class _Source:
    def __init__(self):
        self.released = []

    def start(self, unit):
        return unit

    def finish(self, unit, times):
        return unit, None, f"slot-{unit}"

    def release(self, slot):
        self.released.append(slot)


def test_two_instances_in_flight_write_units_in_order_and_stop_after_a_failure():
    import pytest

    from onnxaccel.scale.stages import _pump

    written, source, times = [], _Source(), StageTimes()
    _pump(_SlowWorker(), source, list(range(9)), lambda r: written.append(r.unit), 4, times)
    assert written == list(range(9)) and sorted(source.released) == sorted(f"slot-{u}" for u in range(9))
    assert times.units_run == 9
    # A failure in unit 5: units 0-4 are written (their shards finish), none after it, every slot comes back.
    written, source = [], _Source()
    with pytest.raises(RuntimeError, match="unit 5 failed"):
        _pump(_SlowWorker(fail_at=5), source, list(range(9)), lambda r: written.append(r.unit), 4, StageTimes())
    assert written == [0, 1, 2, 3, 4]
    assert len(set(source.released)) == len(source.released) and "slot-5" in source.released


class _CpuAsGpu:
    """nvJPEG's decode interface (prepost/decode.py NvjpegDecoder: made with (height, width, pre, device),
    ``decode(paths, out)``) done by the CPU decode, so the GPU decoding process and the hybrid split run here
    (no GPU, no torchvision): each row must land where its file is, bad rows included. The pipeline's GPU
    process makes it by name (scale/pipeline.py GPU_DECODER_CLASS)."""

    def __init__(self, height, width, pre, device=0, batch=64):
        self.height, self.width, self.pre = height, width, pre
        self.phases = {"images": 0, "decode_s": 0.0}

    def decode(self, paths, out=None):
        from onnxaccel.errors import InputError
        from onnxaccel.prepost.cpu_decode import decode_pixels

        bad = {}
        self.phases["images"] += len(paths)
        self.phases["decode_s"] += 0.5  # so the report's rate is known: images / (0.5 s per call)
        for i, path in enumerate(paths):
            try:
                out[i] = decode_pixels(path, self.height, self.width, self.pre)
            except InputError as exc:
                bad[i] = exc.message
        return out, bad


class _OnDevice(np.ndarray):
    """A decoded batch as a GPU decoder hands it on (``__cuda_array_interface__``); here in host memory, so the CPU
    session can run it as it is (the device-to-device copy itself: tests/engines/test_pool.py)."""

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "strides": None, "data": (self.ctypes.data, False),
                "version": 3}


class _CpuAsGpuOnDevice(_CpuAsGpu):
    """nvJPEG's in-process interface (``decode_device(paths)``: the batch on the device, bad rows zero) done by
    the CPU decode; records the threads it decoded on."""

    threads: set = set()

    def decode_device(self, paths):
        import threading

        type(self).threads.add(threading.current_thread().name)
        out = np.zeros((len(paths), self.height, self.width, 3), np.uint8)
        _, bad = self.decode(paths, out)
        for i in bad:
            out[i] = 0
        return out.view(_OnDevice), bad


@pytest.mark.parametrize("decoder", ["nvjpeg", "hybrid"])
def test_nvjpeg_in_the_jobs_process_hands_batches_on_the_device(tmp_path, squeezenet, photo, monkeypatch, decoder):
    """Where the runs take direct copies, nvJPEG decodes in the job's own process (one CUDA context with the
    model: no time-slicing) on two threads and hands each batch on as device memory; ``hybrid`` splits each unit
    between the CPU pool (host rows first) and nvJPEG (device rows after them), and the run takes both parts.
    Every row lands with its file, bad files on either side are error rows, the outputs equal the CPU pool's,
    and the report says what ran."""
    from onnxaccel.scale import decode_sources, host_sources, pipeline

    data = write_photo_jpegs(photo, tmp_path / "jpegs", 11)
    (data / "photo-0009.jpg").write_bytes(b"\xff\xd8 truncated")  # unit 3's second row: nvJPEG's side
    (data / "photo-0000.jpg").write_bytes(b"\xff\xd8 truncated")  # unit 1's first row: the CPU pool's in hybrid
    want = run_batch(BatchJob(_embedded(squeezenet), str(data), str(tmp_path / "pool"), target="cpu", batch=4,
                              decoder="cpu-pool"))
    fed = []
    real_infer = pipeline.BatchWorker._infer

    def infer(self, unit, data, index):
        parts = data[1] if isinstance(data[1], list) else [data[1]]
        fed.append(tuple(hasattr(next(iter(p.values())), "__cuda_array_interface__") for p in parts))
        return real_infer(self, unit, data, index)

    monkeypatch.setattr(pipeline.BatchWorker, "_infer", infer)
    monkeypatch.setattr(decode_sources, "choose_decoder", lambda device, wanted, guard=None: (decoder, "test"))
    monkeypatch.setattr(decode_sources, "GPU_DECODER_CLASS", f"{__name__}:_CpuAsGpuOnDevice")
    monkeypatch.setattr(_CpuAsGpuOnDevice, "threads", set())  # this test's threads only
    monkeypatch.setattr(decode_sources, "_direct_copies", lambda worker, every=False: "")
    monkeypatch.setattr(host_sources, "_direct_copies", lambda worker, every=False: "")
    monkeypatch.setattr(decode_sources, "NVJPEG_IN_PROCESS", True)  # the default (a test may run after one that changed it)
    monkeypatch.setattr(decode_sources, "GPU_DECODE_THREADS", 2)  # not the installed library's count
    got = run_batch(BatchJob(_embedded(squeezenet), str(data), str(tmp_path / "gpu"), target="cpu", batch=4,
                             decoder=decoder))
    assert len(_CpuAsGpuOnDevice.threads) >= 1 and all(t.startswith("onnxaccel-batch-nvjpeg")
                                                     for t in _CpuAsGpuOnDevice.threads)
    if decoder == "nvjpeg":
        assert got.stages["host_copies"].startswith("direct: decoded on the GPU in this process")
        assert fed == [(True,)] * 3
        assert any(n.startswith("nvJPEG in this process (2 threads): 11 images") for n in got.stages["notes"])
    else:  # the first unit split half and half: host rows, then device rows
        assert fed[0] == (False, True) and len(fed) == 3, fed
        assert all(f in {(False, True), (True,), (False,)} for f in fed), fed  # host rows first, then device rows
        [summary] = [n for n in got.stages["notes"] if n.startswith("hybrid decode: nvJPEG")]
        assert "CPU pool 0;" not in summary and not summary.startswith("hybrid decode: nvJPEG 0 "), summary
        assert "nvJPEG's rows decoded on the GPU in this process" in got.stages["host_copies"] or \
            got.stages["host_copies"].startswith("joined on the host (page-locking")  # no GPU to pin with here
    a, b = load_results(tmp_path / "gpu"), load_results(tmp_path / "pool")
    assert a.row_ids == b.row_ids and len(a.row_ids) == 9
    np.testing.assert_array_equal(a.outputs["softmaxout_1"], b.outputs["softmaxout_1"])
    assert sorted(e["file"] for e in got.errors) == sorted(e["file"] for e in want.errors) == \
        ["photo-0000.jpg", "photo-0009.jpg"]


@pytest.mark.parametrize("decoder", ["hybrid", "nvjpeg"])
def test_gpu_process_decoders_put_every_row_in_its_place(tmp_path, squeezenet, photo, monkeypatch, decoder):
    from onnxaccel.scale import decode_sources

    data = write_photo_jpegs(photo, tmp_path / "jpegs", 11)
    (data / "photo-0009.jpg").write_bytes(b"\xff\xd8 truncated")  # a bad row in the second half (GPU side)
    (data / "photo-0000.jpg").write_bytes(b"\xff\xd8 truncated")  # and one in the first (CPU pool side)
    want = run_batch(BatchJob(_embedded(squeezenet), str(data), str(tmp_path / "pool"), target="cpu", batch=4,
                              decoder="cpu-pool"))
    monkeypatch.setattr(decode_sources, "choose_decoder", lambda device, wanted, guard=None: (decoder, "test"))
    monkeypatch.setattr(decode_sources, "GPU_DECODER_CLASS", f"{__name__}:_CpuAsGpu")
    monkeypatch.setattr(decode_sources, "NVJPEG_IN_PROCESS", True)  # asked for; the CPU runs take no device rows
    got = run_batch(BatchJob(_embedded(squeezenet), str(data), str(tmp_path / "gpu"), target="cpu", batch=4,
                             decoder=decoder))
    assert got.stages["decoder"] == decoder
    if decoder == "hybrid":
        [summary] = [n for n in got.stages["notes"] if n.startswith("hybrid decode: nvJPEG")]
        assert not summary.startswith("hybrid decode: nvJPEG 0 ") and "CPU pool 0;" not in summary, summary
    else:  # every file went to the GPU process, one call per unit of 4: its phases are reported
        assert "GPU decoding process: 11 images in 1.50 s busy (7/s): decode 1.50 s" in got.stages["notes"]
        # on the CPU the runs take no direct copies, so nvJPEG decodes in a process of its own, and says why
        assert any(n.startswith("nvJPEG decodes in a process of its own: the runs copy rows on the host (joined "
                                "on the host (CPU target))") for n in got.stages["notes"])
    a, b = load_results(tmp_path / "gpu"), load_results(tmp_path / "pool")
    assert a.row_ids == b.row_ids and len(a.row_ids) == 9
    np.testing.assert_array_equal(a.outputs["softmaxout_1"], b.outputs["softmaxout_1"])
    assert sorted(e["file"] for e in got.errors) == sorted(e["file"] for e in want.errors) == \
        ["photo-0000.jpg", "photo-0009.jpg"]


def test_decoding_processes_start_before_the_sessions_compile(tmp_path, squeezenet, photo, monkeypatch):
    # Start-up of a JPEG job is max(decoders, sessions), not their sum: the decoder is chosen and its processes
    # started in a thread of its own while BatchWorker compiles. Here each side waits until the other has begun:
    # a job that planned before the sessions, or after them, would stop at one of the waits.
    import threading

    from onnxaccel.scale import pipeline

    planning, compiling = threading.Event(), threading.Event()
    real_plan, real_worker = pipeline._decode_plan, pipeline.BatchWorker

    def plan(*args, **kwargs):
        planning.set()
        assert compiling.wait(60), "the sessions did not compile while the decoder was being chosen"
        return real_plan(*args, **kwargs)

    def worker(*args, **kwargs):
        compiling.set()
        assert planning.wait(60), "the decoder was not chosen while the sessions compiled"
        return real_worker(*args, **kwargs)

    monkeypatch.setattr(pipeline, "_decode_plan", plan)
    monkeypatch.setattr(pipeline, "BatchWorker", worker)
    data = write_photo_jpegs(photo, tmp_path / "jpegs", 3)
    report = run_batch(BatchJob(_embedded(squeezenet), str(data), str(tmp_path / "out"), target="cpu", batch=4,
                                decoder="cpu-pool"))
    assert report.rows_done == 3
    [note] = [n for n in report.stages["notes"] if n.startswith("start-up ")]
    assert "sessions" in note and "decoder choice" in note, note


def test_an_in_process_gpu_decoder_that_cannot_start_says_why(tmp_path, squeezenet, photo, monkeypatch):
    # nvJPEG in the job's process (the default where the runs take device rows): a decoder that cannot be made
    # stops the job with what failed and what to do, and the job leaves no decoding threads behind.
    from onnxaccel.errors import ProviderUnavailableError
    from onnxaccel.scale import decode_sources

    monkeypatch.setattr(decode_sources, "choose_decoder", lambda device, wanted, guard=None: ("nvjpeg", "test"))
    monkeypatch.setattr(decode_sources, "GPU_DECODER_CLASS", f"{__name__}:_NoGpu")
    monkeypatch.setattr(decode_sources, "NVJPEG_IN_PROCESS", True)
    monkeypatch.setattr(decode_sources, "_direct_copies", lambda worker, every=False: "")
    data = write_photo_jpegs(photo, tmp_path / "jpegs", 3)
    with pytest.raises(ProviderUnavailableError, match="could not start on device 0: RuntimeError: CUDA unavailable"):
        run_batch(BatchJob(_embedded(squeezenet), str(data), str(tmp_path / "out"), target="cpu", batch=4,
                           decoder="nvjpeg"))


def test_float_images_read_by_threads_keep_each_row_with_its_file(tmp_path, squeezenet, photo):
    # The host-float path (a float model, CPU target: exact full-size decode + float preprocessing) reads units on
    # 3 threads: with 5 units of 2 rows in flight, every output must still be its own file's.
    import onnxruntime as ort

    from onnxaccel.inputs_files import ImagePreprocess, read_image
    from onnxaccel.model import load_model
    from onnxaccel.prepost.presets import PreprocessRequest, preset_values

    data = write_photo_jpegs(photo, tmp_path / "jpegs", 9)
    report = run_batch(BatchJob(squeezenet, str(data), str(tmp_path / "out"), target="cpu", batch=2,
                                preprocess=PreprocessRequest(preset="imagenet")))
    assert report.stages["decoder"] == "host-float" and "3 threads" in report.stages["decoder_reason"]
    model = load_model(squeezenet)
    session = ort.InferenceSession(model.proto.SerializeToString(), providers=["CPUExecutionProvider"])
    scale, mean, std = preset_values("imagenet")
    pre = ImagePreprocess(preset="imagenet", scale=scale, mean=mean, std=std)
    got = load_results(tmp_path / "out")
    assert got.row_ids == [f"photo-{i:04d}.jpg" for i in range(9)]
    for row, rid in enumerate(got.row_ids):
        image = read_image(data / rid, model.inputs[0], (1, 3, 224, 224), pre)[0]
        want = session.run(None, {model.inputs[0].name: image})[0][0]
        np.testing.assert_allclose(got.outputs["softmaxout_1"][row], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("depth", [4, 6])
def test_rows_read_into_a_ring_of_page_locked_slots_give_the_plain_outputs(tmp_path, mlp_path, npy_data,
                                                                           monkeypatch, depth):
    """On a GPU that takes direct copies (graph replay), rows are read straight into a ring of page-locked slots
    and a slot is read into again only after its run is done. Here the CPU runs them (page-locking needs a GPU:
    the pin calls are recorded and answered as the runtime does when it pins): with the fewest slots (depth +
    instances; the floor was instances + 2 before, which hangs the reader at depth 6) the ring wraps over 15
    units, every row reads from its own slot, and the outputs equal the job without slots; the report says how
    rows reached the device, and the memory is unpinned at the end. The GIL switch interval is the GPU jobs'
    alone: a CPU job leaves it as it is."""
    import sys
    import threading

    from onnxaccel.scale import host_sources, pipeline
    from onnxaccel.scale.worker import BatchWorker

    plain = run_batch(BatchJob(str(mlp_path), str(npy_data), str(tmp_path / "plain"), target="cpu", batch=4))
    assert plain.stages["host_copies"] == "joined on the host (CPU target)"
    pinned, unpinned, reads, switch = [], [], [], []
    monkeypatch.setattr(host_sources, "_direct_copies", lambda worker, every=False: "")
    monkeypatch.setattr(host_sources, "pin_for_copies", lambda target, address, nbytes: pinned.append((address, nbytes)) or "")
    monkeypatch.setattr(host_sources, "unpin_for_copies", lambda target, address: unpinned.append(address))
    monkeypatch.setattr(host_sources, "PINNED_SLOTS_BYTES", 1)  # the fewest slots: depth + instances
    monkeypatch.setattr(pipeline, "DEPTH", depth)
    read = BatchWorker.read

    def spy(self, unit, out=None):
        result = read(self, unit, out)
        reads.append((out["x"].ctypes.data, result[1]["x"].ctypes.data))
        switch.append(sys.getswitchinterval())
        return result

    monkeypatch.setattr(BatchWorker, "read", spy)
    before = sys.getswitchinterval()
    done: list = []
    job = threading.Thread(target=lambda: done.append(run_batch(BatchJob(
        str(mlp_path), str(npy_data), str(tmp_path / "slots"), target="cpu", batch=4))), daemon=True)
    job.start()
    job.join(timeout=120)
    assert done, "the job hung: the reader waits for a slot the runs never give back"
    report, count = done[0], depth + 1  # one CPU instance
    assert report.stages["host_copies"] == (f"direct: rows read into {count} page-locked slots, copied by DMA into "
                                            "the bound inputs")
    assert len(reads) == 15 and all(slot == feed for slot, feed in reads)
    assert len({slot for slot, _ in reads}) == count
    assert len(pinned) == 1 and unpinned == [pinned[0][0]]
    assert pinned[0][1] == count * 4096  # 4 rows x 4 floats, a page a slot
    assert set(switch) == {before} and sys.getswitchinterval() == before
    got, want = load_results(tmp_path / "slots"), load_results(tmp_path / "plain")
    assert got.row_ids == want.row_ids
    np.testing.assert_array_equal(got.outputs["probs"], want.outputs["probs"])


def test_gpu_jobs_run_sessions_with_one_cpu_thread_unless_the_target_says(tmp_path, mlp_path, npy_data,
                                                                          monkeypatch):
    """A GPU session's default CPU pool spins a thread per core against the job's decoders, readers and writer:
    batch gives its GPU workers intra_op_num_threads=1 (as serve does), keeps the user's own setting, and leaves
    CPU targets and native MIGraphX alone; the output header (resume) does not change."""
    from onnxaccel.scale import job as job_module
    from onnxaccel.target import gpu_session_threads, parse_target

    assert gpu_session_threads(parse_target("cuda:0?enable_cuda_graph=1")) == {"intra_op_num_threads": "1"}
    assert gpu_session_threads(parse_target("cuda?intra_op_num_threads=4")) == {}
    assert gpu_session_threads(parse_target("cpu")) == {}
    assert gpu_session_threads(parse_target("migraphx")) == {"intra_op_num_threads": "1"}  # ORT's MIGraphX EP
    assert gpu_session_threads(parse_target("migraphx", engine="migraphx")) == {}  # native MIGraphX: no ORT pool
    specs = []

    class Stop(Exception):
        pass

    def record(spec, units, sink, **_):
        specs.append(spec)
        raise Stop

    monkeypatch.setattr(job_module, "run_pipelined", record)
    for target in ("cuda", "cuda?intra_op_num_threads=3", "cpu"):
        with pytest.raises(Stop):
            run_batch(BatchJob(str(mlp_path), str(npy_data), str(tmp_path / target.replace("?", "_")), target=target,
                               batch=4))
    # The plan's target carries the thread count the sessions get; the job's target (header) stays as asked.
    assert [s.target.option_dict.get("intra_op_num_threads") for s in specs] == ["1", "3", None]
    assert [s.plan.requested for s in specs] == [parse_target(t) for t in ("cuda", "cuda?intra_op_num_threads=3",
                                                                          "cpu")]


def test_weight_bytes_count_the_file_and_its_external_data(tmp_path, mlp_path):
    """A GPU job runs one session instead of two past INSTANCE_WEIGHTS_LIMIT (each session holds the weights):
    the size counted is the model file's plus the external-data files its initializers name."""
    import onnx

    from onnxaccel import load_model
    from onnxaccel.scale.worker import weight_bytes

    inline = load_model(str(mlp_path))
    assert weight_bytes(inline) == mlp_path.stat().st_size
    proto = onnx.load(str(mlp_path))
    split = tmp_path / "split.onnx"
    onnx.save(proto, str(split), save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin",
              size_threshold=0)
    assert (tmp_path / "w.bin").stat().st_size > 0
    assert weight_bytes(load_model(str(split))) == split.stat().st_size + (tmp_path / "w.bin").stat().st_size


def test_the_gil_switch_is_set_while_any_gpu_run_lasts_and_put_back_after_the_last():
    # Two pipelined GPU runs on two threads overlap: the interval is the process's, so the first to finish must
    # not put Python's back under the second; the last to finish does.
    import sys

    from onnxaccel.scale.pipeline import _gil_switch

    before = sys.getswitchinterval()
    first, second = _gil_switch(0.0005), _gil_switch(0.0005)
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert sys.getswitchinterval() == pytest.approx(0.0005)
    second.__exit__(None, None, None)
    assert sys.getswitchinterval() == before
    with _gil_switch(None):  # a CPU run: left as is
        assert sys.getswitchinterval() == before


def test_a_gpu_job_runs_its_pump_at_the_short_gil_switch(tmp_path, mlp_path, npy_data, monkeypatch):
    import dataclasses
    import sys

    from onnxaccel.scale import pipeline
    from onnxaccel.scale.worker import BatchWorker
    from onnxaccel.target import parse_target

    seen = []
    real = BatchWorker.read

    def spy(self, unit, out=None):
        seen.append(sys.getswitchinterval())
        return real(self, unit, out)

    monkeypatch.setattr(BatchWorker, "read", spy)
    # The plan a GPU target gets (plan.py GIL_SWITCH_MS), for sessions that still run on the CPU.
    from onnxaccel.plan import GIL_SWITCH_MS
    from onnxaccel.scale import job as job_module

    real_plan = job_module.plan_execution
    monkeypatch.setattr(job_module, "plan_execution", lambda *a, **k: dataclasses.replace(
        real_plan(*a, **k), gil_switch_ms=GIL_SWITCH_MS))
    before = sys.getswitchinterval()
    report = run_batch(BatchJob(str(mlp_path), str(npy_data), str(tmp_path / "out"), target=parse_target("cpu"),
                                batch=4))
    assert report.rows_done == report.rows_total > 0 and set(seen) == {GIL_SWITCH_MS / 1000}
    assert sys.getswitchinterval() == before


class _NoGpu:
    """A GPU decoder that cannot start (no CUDA here): what NvjpegDecoder raises without a GPU."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError("CUDA unavailable: no NVIDIA driver")


def test_a_fallback_decoding_process_that_cannot_start_is_closed(tmp_path, squeezenet, photo, monkeypatch):
    # nvJPEG asked for in the job's process, but the runs take no device rows: a decoding process of its own is
    # made instead; when its decoder cannot start, the job says why (not "a process terminated abruptly") and that
    # pool is closed (its processes and shared memory gone), not left behind.
    from onnxaccel.errors import ProviderUnavailableError
    from onnxaccel.prepost.decode_pool import DecodePool
    from onnxaccel.scale import decode_sources

    closed, made = [], []
    real_init, real_close = DecodePool.__init__, DecodePool.close

    def init(self, *args, **kwargs):
        made.append(self)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(DecodePool, "__init__", init)
    monkeypatch.setattr(DecodePool, "close", lambda self: closed.append(self) or real_close(self))
    monkeypatch.setattr(decode_sources, "choose_decoder", lambda device, wanted, guard=None: ("nvjpeg", "test"))
    monkeypatch.setattr(decode_sources, "GPU_DECODER_CLASS", f"{__name__}:_NoGpu")
    monkeypatch.setattr(decode_sources, "NVJPEG_IN_PROCESS", True)
    data = write_photo_jpegs(photo, tmp_path / "jpegs", 3)
    with pytest.raises(ProviderUnavailableError, match="nvJPEG.* could not start on device 0: RuntimeError: CUDA unavailable"):
        run_batch(BatchJob(_embedded(squeezenet), str(data), str(tmp_path / "out"), target="cpu", batch=4,
                           decoder="nvjpeg"))
    assert len(made) == 1 and made[0] in closed and made[0]._pool is None and made[0]._gpu is None


def test_device_rows_need_every_instance_to_copy_on_the_device():
    # Host rows go direct where one instance has a copier (the others join on the host); a GPU decoder's device
    # rows need all of them, or an instance would get rows it cannot take.

    from onnxaccel.scale.host_sources import _direct_copies
    from onnxaccel.target import parse_target

    pool = SimpleNamespace(target=parse_target("cuda"), graph=True, copiers=[object(), None])
    worker = SimpleNamespace(pool=pool)
    assert _direct_copies(worker) == ""
    assert "direct copies need graph capture" in _direct_copies(worker, every=True)
    pool.copiers = [object(), object()]
    assert _direct_copies(worker, every=True) == ""


def test_the_report_names_the_library_that_decodes_not_the_one_chosen(monkeypatch):
    """`auto` chose DALI but DALI could not start (prepost/decode.py gpu_decoder went on with nvImageCodec): the
    report's decoder_reason says nvImageCodec decoded, and why; when the chosen library is the one made, it is
    left as it is."""
    from onnxaccel.prepost import decode
    from onnxaccel.scale import decode_sources

    monkeypatch.setattr(decode, "_DALI_FAILED", ["RuntimeError: libcudart.so.12: cannot open shared object file"])
    made = [SimpleNamespace(library="nvimgcodec")] * 3
    times = StageTimes(decoder_reason="nvJPEG through DALI on the CUDA target")
    decode_sources._decoded_through(times, made)
    assert times.decoder_reason == ("nvJPEG through DALI on the CUDA target; decoded through nvImageCodec (DALI could "
                                    "not start: RuntimeError: libcudart.so.12: cannot open shared object file)")
    times = StageTimes(decoder_reason="nvJPEG through nvImageCodec on the CUDA target")
    decode_sources._decoded_through(times, made)
    assert times.decoder_reason == "nvJPEG through nvImageCodec on the CUDA target"
