"""Fast decode (prepost/decode.py): JPEGs decoded at reduced size (libjpeg DCT scaling via Pillow's draft) match a
full decode + the same geometry within a few levels on real photographs; the process pool writes the same pixels
into shared memory as the in-thread decoder; the decoder choice falls back to the CPU pool without torchvision."""

from __future__ import annotations

import io
import importlib.util

import numpy as np
import pytest
from PIL import Image

from onnxaccel.errors import InputError
from onnxaccel.inputs_files import ImagePreprocess, read_pixels
from onnxaccel.prepost.cpu_decode import decode_pixels, draft_size
from onnxaccel.prepost.decode import choose_decoder
from onnxaccel.prepost.decode_pool import DecodePool

PHOTOS = ("astronaut.png", "coffee.png", "chelsea.png", "motorcycle_left.png", "rocket.jpg")
GEOMETRY = {"imagenet": (224, 224), "yolo": (320, 320), "scale01": (128, 160)}


def _jpeg(photo, name: str, tmp_path=None):
    """The photo re-encoded as a JPEG at quality 90, upscaled to at least 800 px (so DCT scaling applies)."""
    img = Image.open(photo(name)).convert("RGB")
    if max(img.size) < 800:
        img = img.resize((img.width * 2, img.height * 2), Image.BILINEAR)
    buffer = io.BytesIO()
    img.save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


@pytest.mark.parametrize("preset", sorted(GEOMETRY))
def test_reduced_decode_matches_full_decode_on_photos(photo, preset):
    height, width = GEOMETRY[preset]
    pre = ImagePreprocess(preset=preset)
    for name in PHOTOS:
        data = _jpeg(photo, name)
        full, _ = read_pixels(io.BytesIO(data), height, width, pre)
        fast = decode_pixels(io.BytesIO(data), height, width, pre)
        assert fast.shape == full.shape == (height, width, 3) and fast.dtype == np.uint8
        diff = np.abs(full.astype(np.int16) - fast.astype(np.int16))
        assert diff.mean() < 3.0, (name, preset, diff.mean())  # measured: 0.2 to 2.1 levels
        # It did decode at reduced size (else the test would prove nothing): the draft shrank the image.
        with Image.open(io.BytesIO(data)) as img:
            img.draft("RGB", draft_size(img.size, height, width, pre))
            assert img.size[0] < Image.open(io.BytesIO(data)).size[0], name


def test_without_draft_it_is_read_pixels_exactly(photo):
    data = _jpeg(photo, "chelsea.png")
    pre = ImagePreprocess(preset="imagenet")
    full, _ = read_pixels(io.BytesIO(data), 224, 224, pre)
    np.testing.assert_array_equal(decode_pixels(io.BytesIO(data), 224, 224, pre, reduced=False), full)


def test_draft_size_never_below_what_the_geometry_needs():
    pre = ImagePreprocess(preset="imagenet")
    assert draft_size((500, 375), 224, 224, pre) == (342, 256)  # shorter side 256 before the 224 crop
    assert draft_size((640, 480), 320, 320, ImagePreprocess(preset="yolo")) == (320, 240)
    assert draft_size((640, 480), 100, 90, ImagePreprocess(preset="scale01")) == (90, 100)


def test_pool_decodes_into_shared_memory_like_one_thread(photo, tmp_path):
    paths = []
    for i, name in enumerate(PHOTOS):
        path = tmp_path / f"{i}.jpg"
        path.write_bytes(_jpeg(photo, name))
        paths.append(str(path))
    (tmp_path / "bad.jpg").write_bytes(b"not a jpeg")
    paths.append(str(tmp_path / "bad.jpg"))
    pre = ImagePreprocess(preset="imagenet")
    pool = DecodePool(slots=2, batch=8, height=224, width=224, pre=pre, workers=2)
    try:
        bad = {}
        for future in pool.submit(1, paths):
            bad.update(future.result()[0])
        got = pool.view(1, len(paths)).copy()
    finally:
        pool.close()
    assert pool.name == "cpu"  # closed
    assert list(bad) == [5] and "Cannot read image" in bad[5]
    for i, path in enumerate(paths[:5]):
        np.testing.assert_array_equal(got[i], decode_pixels(path, 224, 224, pre))
    assert not got[5].any()


def test_decoder_choice_without_torch_is_the_cpu_pool():
    assert importlib.util.find_spec("torch") is None, "this test checks the fallback where torch is absent"
    name, why = choose_decoder("cuda")
    assert name in ("cpu-pool", "cpu") and "torch is not installed" in why
    assert choose_decoder("cpu")[0] in ("cpu-pool", "cpu")
    assert choose_decoder("cuda", "cpu") == ("cpu", "asked for")
    with pytest.raises(InputError, match="Install torch with CUDA and nvImageCodec .* or torchvision with CUDA"):
        choose_decoder("cuda", "nvjpeg")
    with pytest.raises(InputError, match="--decoder must be one of"):
        choose_decoder("cpu", "turbo")


def test_native_stderr_inside_the_block_goes_to_the_log_not_the_terminal(capfd, caplog):
    # nvImageCodec's extensions print "Failed to load nvjpeg2k library!" on fd 2 for codecs a JPEG job does not
    # need: inside the block such writes go to the debug log; after it, fd 2 is the terminal's again.
    import logging
    import os

    from onnxaccel.prepost.nvjpeg import _native_stderr_to_log

    with caplog.at_level(logging.DEBUG, logger="onnxaccel.prepost.nvjpeg"):
        with _native_stderr_to_log("nvImageCodec"):
            os.write(2, b"Failed to load nvjpeg2k library!\n")
        os.write(2, b"after the block\n")
    err = capfd.readouterr().err
    assert "nvjpeg2k" not in err and "after the block" in err
    assert any("nvImageCodec wrote to stderr: Failed to load nvjpeg2k library!" in r.message for r in caplog.records)


def test_the_nvjpeg_library_setting_is_checked(monkeypatch):
    # ONNXACCEL_NVJPEG_LIBRARY picks the library nvJPEG is called through; a wrong value is a clear reason (auto
    # then falls back to the CPU pool with it), never a decoder that fails later. Needs torch with CUDA first:
    # here the reason is that, whatever the setting (no torch on this machine).
    from onnxaccel.prepost import decode

    real = importlib.util.find_spec
    monkeypatch.setattr(decode.NvjpegDecoder, "LIBRARY", "turbo")
    assert decode.nvjpeg_missing().startswith("torch is not installed")
    monkeypatch.setitem(__import__("sys").modules, "torch", type("FakeTorch", (), {
        "cuda": type("Cuda", (), {"is_available": staticmethod(lambda: True)})})())
    assert decode.nvjpeg_missing() == ("ONNXACCEL_NVJPEG_LIBRARY must be auto, dali, nvimgcodec or torchvision, "
                                       "not 'turbo'")
    name, why = decode.choose_decoder("cuda")
    assert name in ("cpu-pool", "cpu") and "ONNXACCEL_NVJPEG_LIBRARY must be" in why
    monkeypatch.setattr(decode.NvjpegDecoder, "LIBRARY", "nvimgcodec")
    assert decode.nvjpeg_missing().startswith("nvImageCodec is not installed")
    monkeypatch.setattr(decode.NvjpegDecoder, "LIBRARY", "dali")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "nvidia.dali" else real(name, *a))
    assert decode.nvjpeg_missing() == "DALI is not installed (nvidia.dali)"
    with pytest.raises(InputError) as caught:  # asked for by name: the fix names DALI's extra
        decode.choose_decoder("cuda", "nvjpeg")
    assert "DALI is not installed" in caught.value.message and "onnxaccel[dali-cu13]" in caught.value.hint
    assert decode.choose_decoder("cuda")[0] in ("cpu-pool", "cpu")  # auto: the CPU pool, saying why


def test_gpu_decoder_warm_up_runs_the_whole_path_on_real_jpegs():
    """NvjpegDecoder.warm_up (run when a GPU decoder is made: nvImageCodec makes its per-thread decoders on the
    first batches) hands decode_device baseline JPEG files of several sizes, twice, and leaves the phases at zero
    so the job's report counts real work only. decode_device is the GPU's; here it records what it was given."""
    from onnxaccel.prepost import decode

    seen = []

    class Recorder:
        phases = {"images": 7, "read_s": 1.0, "decode_s": 2.0, "resize_s": 0.5, "copy_s": 0.1}
        WARM_SIZES = decode.NvjpegDecoder.WARM_SIZES

        def decode_device(self, paths):
            for path in paths:
                with Image.open(path) as img:
                    seen.append((img.format, img.size, img.info.get("progressive", 0)))
            return None, {}

    recorder = Recorder()
    decode.NvjpegDecoder.warm_up(recorder, 64)
    assert len(seen) == 128 and {f for f, _, _ in seen} == {"JPEG"} and not any(p for _, _, p in seen)
    assert len({size for _, size, _ in seen}) > 10  # several sizes: the geometry's batched path is exercised
    assert recorder.phases == dict.fromkeys(recorder.phases, 0)


def test_dali_warm_up_decodes_photograph_sized_jpegs():
    """DALI's warm-up (DaliDecoder.warm_up, through NvjpegDecoder.warm_up) hands the pipeline JPEGs at photographs'
    sizes, so the hardware decoder's and nvJPEG's buffers grow before the job's first batch, not during it."""
    from onnxaccel.prepost import decode
    from onnxaccel.prepost.dali import DaliDecoder

    seen = []

    class Recorder:
        phases = {"images": 3}
        WARM_SIZES = DaliDecoder.WARM_SIZES

        def decode_device(self, paths):
            for path in paths:
                with Image.open(path) as img:
                    seen.append(img.size)
            return None, {}

    decode.NvjpegDecoder.warm_up(Recorder(), 12)
    assert len(seen) == 24 and min(min(size) for size in seen) >= 333 and max(max(size) for size in seen) >= 640
    assert {(h, w) for w, h in seen} == set(DaliDecoder.WARM_SIZES)


def test_stderr_redirection_from_two_threads_leaves_stderr_as_it_was():
    """Two decoding threads making decoders at once each send fd 2 to a temporary file and restore it: without
    taking turns, A-enter, B-enter, A-exit, B-exit leaves fd 2 on A's deleted temporary file."""
    import os
    import threading

    from onnxaccel.prepost.nvjpeg import _native_stderr_to_log

    before = os.readlink("/proc/self/fd/2")
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()

    def a():
        with _native_stderr_to_log("A"):
            a_in.set()
            b_in.wait(1.0)  # with turns taken, B cannot enter: A leaves after 1 s
        a_out.set()

    def b():
        a_in.wait(5)
        with _native_stderr_to_log("B"):
            b_in.set()
            a_out.wait(5)  # B leaves after A

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert os.readlink("/proc/self/fd/2") == before


def test_the_fix_for_a_missing_gpu_decoder_follows_the_reason(monkeypatch):
    """With DALI asked for and installed but no CUDA, the hint is about the GPU, not about installing DALI."""
    from onnxaccel.prepost import decode

    monkeypatch.setattr(decode.NvjpegDecoder, "LIBRARY", "dali")
    monkeypatch.setattr(decode, "dali_missing", lambda: "")
    monkeypatch.setitem(__import__("sys").modules, "torch", type("FakeTorch", (), {
        "cuda": type("Cuda", (), {"is_available": staticmethod(lambda: False)})})())
    with pytest.raises(InputError) as caught:
        decode.choose_decoder("cuda", "nvjpeg")
    assert "torch sees no CUDA device" in caught.value.message
    assert "DALI" not in caught.value.hint and "onnxaccel doctor" in caught.value.hint


def _cuda_torch(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "torch", type("FakeTorch", (), {
        "cuda": type("Cuda", (), {"is_available": staticmethod(lambda: True)})})())


def _installed(monkeypatch, *names):
    """The GPU decoding libraries ``names`` are installed, the others not: importlib.util.find_spec for DALI and
    nvImageCodec (found, not imported), torchvision_missing for torchvision (imported for real otherwise)."""
    from onnxaccel.prepost import decode

    real = importlib.util.find_spec
    libraries = ("nvidia.dali", "nvidia.nvimgcodec", "torchvision")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (object() if name in names else None)
                        if name in libraries else real(name, *a))
    monkeypatch.setattr(decode, "torchvision_missing",
                        lambda: "" if "torchvision" in names else "torchvision is not installed (torchvision)")


@pytest.fixture
def library_state(monkeypatch):
    """NvjpegDecoder.LIBRARY, ONNXACCEL_NVJPEG_LIBRARY and DALI's start-up failures as they were, after the test
    (setenv records the variable even where it was unset: delenv would not, and it would leak to later tests)."""
    from onnxaccel.prepost import decode

    monkeypatch.setattr(decode.NvjpegDecoder, "LIBRARY", "auto")
    monkeypatch.setenv(decode.LIBRARY_ENV, "auto")
    monkeypatch.setattr(decode, "_DALI_FAILED", [])
    _cuda_torch(monkeypatch)
    return decode


def test_auto_prefers_dali_where_installed_with_a_fallback_library(monkeypatch, library_state):
    """auto: DALI first (fastest inside `batch` on GPUs, docs/BENCHMARKS.md; pixels as close to Pillow's as
    nvImageCodec's with fancy upsampling), but only beside nvImageCodec or torchvision, which take the files and
    batches DALI refuses; then nvImageCodec, then torchvision."""
    decode = library_state
    _installed(monkeypatch, "nvidia.dali", "nvidia.nvimgcodec")
    assert decode.choose_decoder("cuda") == ("nvjpeg", "nvJPEG through DALI on the CUDA target")
    assert decode._library(without_dali=True) == "nvimgcodec"  # DALI's fallback
    assert decode.gpu_decode_threads() == decode.DECODE_THREADS["dali"]
    _installed(monkeypatch, "nvidia.dali", "torchvision")
    assert decode.nvjpeg_library() == "DALI"
    _installed(monkeypatch, "nvidia.dali")  # no fallback library: not DALI, and there is no other
    assert decode.nvjpeg_library() == "torchvision"
    name, why = decode.choose_decoder("cuda")
    assert name in ("cpu-pool", "cpu") and "neither DALI nor nvImageCodec nor torchvision is installed" in why
    _installed(monkeypatch, "nvidia.nvimgcodec", "torchvision")
    assert decode.choose_decoder("cuda") == ("nvjpeg", "nvJPEG through nvImageCodec on the CUDA target")


def test_decoder_names_a_library(monkeypatch, library_state):
    """--decoder dali|nvimgcodec|torchvision is nvjpeg through that library, for this process and the processes it
    starts (ONNXACCEL_NVJPEG_LIBRARY); a library that is not installed is a clear error naming the flag's value and
    what to install, and changes nothing for the process's next job."""
    import os

    decode = library_state
    _installed(monkeypatch, "nvidia.nvimgcodec")
    with pytest.raises(InputError) as caught:
        decode.choose_decoder("cuda", "dali")
    assert caught.value.message == "--decoder dali cannot run here: DALI is not installed (nvidia.dali)."
    assert caught.value.hint == "Install DALI (pip install onnxaccel[dali-cu13]), or pass --decoder auto."
    assert decode.NvjpegDecoder.LIBRARY == os.environ[decode.LIBRARY_ENV] == "auto"  # as before the failed one
    assert decode.choose_decoder("cuda") == ("nvjpeg", "nvJPEG through nvImageCodec on the CUDA target")
    with pytest.raises(InputError) as caught:
        decode.choose_decoder("cuda", "torchvision")
    assert caught.value.message == "--decoder torchvision cannot run here: torchvision is not installed (torchvision)."
    assert caught.value.hint == "Install torchvision with CUDA, or pass --decoder auto."
    assert decode.choose_decoder("cuda", "nvimgcodec") == ("nvjpeg", "asked for; through nvImageCodec")
    assert decode.NvjpegDecoder.LIBRARY == os.environ[decode.LIBRARY_ENV] == "nvimgcodec"
    assert decode.choose_decoder("cuda", "cpu-pool") == ("cpu-pool", "asked for")
    _installed(monkeypatch)
    with pytest.raises(InputError) as caught:  # the variable set by the user: the hint says so
        decode.choose_decoder("cuda", "nvjpeg")
    assert caught.value.hint == ("Install nvImageCodec (pip install onnxaccel[nvimgcodec-cu13], or -cu12), or unset "
                                 "ONNXACCEL_NVJPEG_LIBRARY (it is 'nvimgcodec'), or pass --decoder auto.")


def test_auto_goes_on_without_dali_that_cannot_start(monkeypatch, library_state, caplog):
    """DALI installed but failing when made (a wheel for another CUDA, say): under auto the job's decoders are
    nvImageCodec's instead, with a warning and the report saying so (pipeline _decoded_through), not a failed job;
    asked for by name, the failure is the job's."""
    import logging

    from onnxaccel.prepost import dali

    decode = library_state
    _installed(monkeypatch, "nvidia.dali", "nvidia.nvimgcodec")

    def broken(*args, **kwargs):
        raise RuntimeError("libcudart.so.12: cannot open shared object file")

    made = []
    monkeypatch.setattr(dali, "DaliDecoder", broken)
    monkeypatch.setattr(decode, "NvjpegDecoder", type("Made", (), {
        "LIBRARY": "auto", "__init__": lambda self, *a: made.append(a)}))
    with caplog.at_level(logging.WARNING, logger="onnxaccel.prepost.decode"):
        decoder = decode.gpu_decoder(224, 224, ImagePreprocess(preset="imagenet"), 0, batch=256)
    assert isinstance(decoder, decode.NvjpegDecoder) and len(made) == 1
    assert decode.dali_failed() == "RuntimeError: libcudart.so.12: cannot open shared object file"
    assert "nvJPEG through nvImageCodec instead" in caplog.text and decode._library() == "nvimgcodec"
    monkeypatch.setattr(decode, "_DALI_FAILED", [])
    monkeypatch.setattr(decode.NvjpegDecoder, "LIBRARY", "dali")
    with pytest.raises(RuntimeError, match="libcudart"):
        decode.gpu_decoder(224, 224, ImagePreprocess(preset="imagenet"), 0)


class _SaysItsBatch:
    """A GPU decoder that reports, by failing, the batch it was made for (the decoding process raises it)."""

    def __init__(self, height, width, pre, device=0, batch=64):
        raise RuntimeError(f"made for batch {batch}")


def test_the_gpu_decoding_process_makes_its_decoder_for_the_rings_batch():
    """DecodePool's GPU process (no direct copies to the runs) makes its decoder for the ring's batch size, as the
    job's own decoding threads do: DALI builds its pipeline per batch size, and would rebuild it in the job."""
    pool = DecodePool(2, 256, 8, 8, ImagePreprocess(preset="imagenet"), workers=0, gpu=0,
                      gpu_decoder=f"{__name__}:_SaysItsBatch")
    try:
        with pytest.raises(Exception, match="could not start on device 0: RuntimeError: made for batch 256"):
            for future in pool.start():
                future.result(timeout=120)
    finally:
        pool.close()
