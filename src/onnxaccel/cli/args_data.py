"""Argument groups for what goes in and comes out: inputs, how the session runs them, image preprocessing,
the accuracy gate, timing, report files and --json."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from onnxaccel import startup
from onnxaccel.cli.args_model import ConfigArgs
from onnxaccel.cli.compose import Built, Group, option
from onnxaccel.cli.groups import Inputs, Reports, Timing, floats, iobinding, iobinding_modes
from onnxaccel.errors import InputError, UsageError

if TYPE_CHECKING:
    from onnxaccel.prepost.presets import PreprocessRequest

INPUT_HELP = ("NAME=FILE (.npy, .npz, .pb or an image) or NAME=VALUE (a number or JSON list, e.g. sr=16000); a "
              "bare .npz feeds every input it names. Inputs not given are synthesized (see docs/INPUTS.md).")
VALUE_RANGE = option("value_range", list[str] | None, None, "--value-range", help="Range of synthesized values: "
                     "NAME=LOW,HIGH for one input, LOW,HIGH for all (floats uniform in [LOW, HIGH), integers "
                     "LOW..HIGH); repeatable.")
SEED = option("seed", int, 0, help="Seed for synthesized inputs.")
GPU = option("gpu", str | None, None, "--gpu", help="GPU model for the peak-TFLOP/s table when the telemetry cannot "
             "tell, e.g. 'H100', 'MI300X'.")


class InputArgs(Group):
    """--input (``help``: its text), --value-range and --seed (each optional); builds ``Inputs``."""

    def __init__(self, help: str = INPUT_HELP, *, value_range: bool = True, seed: bool = True):
        self._params = (option("inputs", list[str] | None, None, "--input", "-i", help=help),
                        *((VALUE_RANGE,) if value_range else ()), *((SEED,) if seed else ()))

    def params(self):
        """The options of this group as it was made."""
        return self._params

    def build(self, v: SimpleNamespace, ctx: Built) -> Inputs:
        """The object the class docstring names, from the options' values."""
        return Inputs.resolve(v.inputs, getattr(v, "value_range", None), getattr(v, "seed", 0))


class RunnerArgs(Group):
    """How a session runs: --strict, and where asked --iobinding ("one": on/off, the --config's by default;
    "modes": on|off|both for a sweep) and --no-check (``check``: its help). Builds ``strict``,
    ``iobinding`` (a bool, a list of them, or None) and ``check``."""

    STRICT = option("strict", bool, False, "--strict", help="Fail when any node falls back from the target's "
                    "provider to another (the CPU).")
    IOBINDING = option("iobinding", bool | None, None, "--iobinding/--no-iobinding", help="Keep inputs and outputs "
                       "on the device (IO binding) or pass numpy arrays. Default: on, or the --config's.")
    IOBINDING_MODES = (
        option("iobinding", str | None, None, "--iobinding", help="on: inputs/outputs stay on the device (IO "
               "binding); off: numpy in/out, as most guides measure; both. Default: on, or the --config's."),
        option("no_iobinding", bool, False, "--no-iobinding", hidden=True),
    )

    def __init__(self, *, strict: bool = True, iobinding: str | None = None, check: str | None = None):
        self.iobinding = iobinding
        self._params = ((self.STRICT,) if strict else ()) + {
            None: (), "one": (self.IOBINDING,), "modes": self.IOBINDING_MODES}[iobinding]
        if check:
            self._params += (option("no_check", bool, False, "--no-check", help=check),)

    def params(self):
        """The options of this group as it was made."""
        return self._params

    def build(self, v: SimpleNamespace, ctx: Built) -> SimpleNamespace:
        """The object the class docstring names, from the options' values."""
        tuned = ctx.get(ConfigArgs)
        bound = None
        if self.iobinding == "one":
            bound = iobinding(v.iobinding, tuned)
        elif self.iobinding == "modes":
            bound = iobinding_modes(v.iobinding, v.no_iobinding, tuned)
        return SimpleNamespace(strict=getattr(v, "strict", False), iobinding=bound,
                               check=not getattr(v, "no_check", False))


PREPROCESS_HELP = (
    "Image preset: imagenet|yolo|scale01|none. imagenet: resize the short side to 256/224 of the crop, center-crop, "
    "/255, ImageNet mean/std; yolo: letterbox to the model's size, gray 114 padding, /255; scale01: /255; none: raw "
    "0..255. (default: from the model's metadata (Ultralytics task=detect -> yolo, onnxaccel.preprocess), else none "
    "with a note; --resize/--mean/--std alone imply imagenet)")
#: The image options' help as `run` words it (defaults spelled out) and as `optimize` does (calibration images).
RUN_IMAGE_HELP = {
    "mean": "Image normalization mean. (default: the preset's: 0.485,0.456,0.406 for imagenet, 0,0,0 otherwise)",
    "std": "Image normalization std. (default: the preset's: 0.229,0.224,0.225 for imagenet, 1,1,1 otherwise)",
    "resize": "Image shorter side before the center crop (imagenet preset). (default: crop size * 256/224, i.e. 256 "
              "for a 224 crop)",
    "bgr": "Feed images as BGR instead of RGB. (default: the model metadata's onnxaccel.channel_order, else RGB)",
}
OPTIMIZE_IMAGE_HELP = {"mean": "Image normalization mean, e.g. 0.485,0.456,0.406.", "std": "Image normalization std.",
                       "resize": "Image shorter side before the center crop.", "bgr": "Images as BGR."}


class PreprocessArgs(Group):
    """--preprocess (``help``), with ``image`` help texts the image options (--mean, --std, --resize, --layout,
    --bgr), with ``embed`` (help, default) --embed-preprocess. Builds ``request`` (a ``PreprocessRequest``, or
    None without image options and preset), ``preset`` and ``embed`` (as given). ``check``: refuse a preset
    that is not one (where nothing later would)."""

    def __init__(self, help: str = PREPROCESS_HELP, *, image: dict[str, str] | None = None,
                 embed: tuple[str, str | None] | None = None, check: bool = False):
        self.image, self.check = image, check
        found = [option("preprocess", str | None, None, "--preprocess", help=help)]
        if image:
            found += [option("mean", str | None, None, help=image["mean"]),
                      option("std", str | None, None, help=image["std"]),
                      option("resize", int | None, None, help=image["resize"]),
                      option("layout", str | None, None, help="Image tensor layout: nchw or nhwc. (default: "
                             "the image input's: nhwc where its last axis is 1, 3 or 4 channels, else nchw)"),
                      option("bgr", bool, False, "--bgr", help=image["bgr"])]
        if embed:
            found.append(option("embed_preprocess", str | None if embed[1] is None else str, embed[1],
                                "--embed-preprocess", help=embed[0]))
        self._params = tuple(found)

    def params(self):
        """The options of this group as it was made."""
        return self._params

    def build(self, v: SimpleNamespace, ctx: Built) -> SimpleNamespace:
        """The object the class docstring names, from the options' values."""
        return SimpleNamespace(request=self._request(v), preset=v.preprocess,
                               embed=getattr(v, "embed_preprocess", None))

    def _request(self, v: SimpleNamespace) -> PreprocessRequest | None:
        with startup.stage("import", detail="presets (onnx, numpy)"):  # not needed to build the command
            from onnxaccel.prepost.presets import PreprocessRequest

        if self.check:
            from onnxaccel.inputs_files import PRESETS

            if v.preprocess is not None and v.preprocess not in PRESETS:
                raise UsageError(f"--preprocess {v.preprocess}: not an image preset.", f"Use one of "
                                 f"{', '.join(PRESETS)}.")
            return PreprocessRequest(preset=v.preprocess) if v.preprocess else None
        preset = v.preprocess.lower() if v.preprocess else None
        if not self.image:
            return PreprocessRequest(preset=preset) if preset else None
        if v.layout is not None and v.layout.lower() not in ("nchw", "nhwc"):
            raise InputError(f"--layout must be nchw or nhwc, got '{v.layout}'.", "Use --layout nchw or --layout nhwc.")
        return PreprocessRequest(preset=preset, mean=floats(v.mean, "--mean") if v.mean else None,
                                 std=floats(v.std, "--std") if v.std else None, resize=v.resize,
                                 layout=v.layout.lower() if v.layout else None, channel_order="bgr" if v.bgr else None)


class AccuracyArgs(Group):
    """--max-error, --atol, --rtol of `bench` and `tune`; builds their ``AccuracyGate``."""

    PARAMS = (
        option("max_error", float | None, None, "--max-error", help="Accuracy gate: largest absolute error against "
               "the FP32 reference (replaces the element-wise atol/rtol check)."),
        option("atol", float | None, None, "--atol", help="Element-wise gate: absolute tolerance (default per "
               "precision: fp32 1e-4, fp16 1e-2, int8 5e-2)."),
        option("rtol", float | None, None, "--rtol", help="Element-wise gate: relative tolerance (default per "
               "precision: fp32 1e-3, fp16 5e-2, int8 1e-1)."),
    )

    def build(self, v: SimpleNamespace, ctx: Built):
        """The object the class docstring names, from the options' values."""
        from onnxaccel.bench.accuracy import AccuracyGate  # heavy: loaded when a command runs

        return AccuracyGate(v.max_error, v.atol, v.rtol)


class TimingArgs(Group):
    """`bench`'s --warmup, --runs, --duration, --calls-per-sample, --concurrency, --instances; builds ``Timing``."""

    PARAMS = (
        option("warmup", int, 10, help="Untimed runs before measuring (the first is reported apart)."),
        option("runs", int | None, None, help="Timed samples per cell (default 100 unless --duration)."),
        option("duration", float | None, None, help="Measure each cell for this many seconds instead."),
        option("calls_per_sample", int | None, None, "--calls-per-sample", help="Calls per timed sample (default: "
               "1, or enough calls for 100 us when one call is faster, as trtexec --avgRuns)."),
        option("concurrency", str, "1", help="Concurrent requests on one session, comma-separated, e.g. 1,4."),
        option("instances", str | None, None, help="Sessions side by side, one thread each (as Triton's instance "
               "count or trtexec --streams), comma-separated, e.g. 1,2,4. Unlike --concurrency, each may replay its "
               "own CUDA graph. Default: 1, or the count in --config."),
    )

    def build(self, v: SimpleNamespace, ctx: Built) -> Timing:
        """The object the class docstring names, from the options' values."""
        return Timing.resolve(warmup=v.warmup, runs=v.runs, duration=v.duration, calls_per_sample=v.calls_per_sample,
                              concurrency=v.concurrency, instances=v.instances, tuned=ctx.get(ConfigArgs))


class ReportArgs(Group):
    """--report files and --resume (``resume``: its help); builds ``Reports``. ``default_json(ctx)``: the JSON
    report written when none is given (tune's)."""

    REPORT = option("report", list[str] | None, None, "--report", "-r", help="Write the report to FILE.json, .csv, "
                    ".md or .html (repeatable); rewritten after every cell, so an interrupted sweep keeps what "
                    "finished.")

    def __init__(self, resume: str, default_json: Callable[[Built], Path] | None = None):
        self.default_json = default_json
        self._params = (self.REPORT, option("resume", bool, False, "--resume", help=resume))

    def params(self):
        """The options of this group as it was made."""
        return self._params

    def build(self, v: SimpleNamespace, ctx: Built) -> Reports:
        """The object the class docstring names, from the options' values."""
        default = self.default_json(ctx) if self.default_json else None
        return Reports.resolve(v.report, resume=v.resume, default_json=default)


class OutputArgs(Group):
    """--json: print the result as JSON instead of tables. Builds the bool."""

    PARAMS = (option("as_json", bool, False, "--json", help="Print the result as JSON (for programs) instead of "
                     "tables."),)

    def build(self, v: SimpleNamespace, ctx: Built) -> Any:
        """The object the class docstring names, from the options' values."""
        return v.as_json
