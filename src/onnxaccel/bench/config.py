"""The tuned configuration file that `tune` writes and `run`, `bench` and `serve` read.

A configuration is a target string (precision and provider options included) plus the shapes and batch it
was tuned for, how to feed it (IO binding, concurrent requests), what it measured, and where it came from.
JSON, schema ``onnxaccel.config/1``::

    {
      "schema": "onnxaccel.config/1",
      "model": "zoo:resnet50",
      "model_sha256": "9f2c...",            # of the model file tuned; a different file gets a warning
      "target": "cuda:0/fp16?enable_cuda_graph=1&prefer_nhwc=1",
      "batch": 1,                           # binds axis 0 of every input whose first dim is free
      "shapes": {"sequence": [128]},        # --shape bindings (input name or symbolic dim -> dims)
      "shape_buckets": "sequence=32,64,128",  # optional: --shape-buckets of bench and batch (null: none)
      "input_shapes": {"data": [1, 3, 224, 224]},   # what those bound to (for checking)
      "iobinding": true,
      "concurrency": 1,
      "measured": {"p50_ms": ..., "p99_ms": ..., "throughput_items_per_s": ..., ...},
      "objective": {"goal": "throughput", "latency_budget_ms": null, "accuracy_gate": {...}},
      "provenance": {"created": "...", "onnxaccel": "0.1.0", "onnxruntime": "1.31.1", "device": "<GPU name>",
                     "command": "onnxaccel tune ...", "report": "tune-report.json"}
    }

``load_config(path)`` validates it (schema, types, the target string through ``parse_target``) and raises
``ConfigError`` with a hint on anything wrong; ``config.prepare_kwargs()`` gives ``pipeline.prepare`` its
shapes and batch, and ``config.cli_args()`` the equivalent command-line flags.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from onnxaccel.bench.report import clean, write_atomic
from onnxaccel.errors import OnnxAccelError, TargetError
from onnxaccel.target import Target, parse_target

SCHEMA = "onnxaccel.config/1"


class ConfigError(OnnxAccelError):
    """A configuration file that cannot be read or does not follow the schema."""

    exit_code = 2


@dataclass(frozen=True)
class TunedConfig:
    """The configuration ``tune`` chose, saved as JSON so bench, run and serve can reuse it (``--config``)."""
    model: str
    target: Target
    batch: int | None = None
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    iobinding: bool = True
    concurrency: int = 1
    #: Sessions side by side (bench --instances; serve --instances).
    instances: int = 1
    #: --shape-buckets text (engines/buckets.py ShapeBuckets.parse), e.g. "sequence=32,64,128"; None: no buckets.
    shape_buckets: str | None = None
    model_sha256: str | None = None
    measured: dict = field(default_factory=dict)
    objective: dict = field(default_factory=dict)
    provenance: dict = field(default_factory=dict)
    #: Where it was loaded from (not written).
    path: Path | None = None

    def prepare_kwargs(self) -> dict:
        """Keyword arguments for ``pipeline.prepare`` (besides the model and target)."""
        return {"shapes": {k: list(v) for k, v in self.shapes.items()} or None, "batch": self.batch}

    def cli_args(self) -> list[str]:
        """The same configuration as flags of `onnxaccel run` / `bench`."""
        args = ["--target", str(self.target)]
        if self.batch is not None:
            args += ["--batch", str(self.batch)]
        for name, dims in self.shapes.items():
            args += ["--shape", f"{name}={'x'.join(map(str, dims))}"]
        if not self.iobinding:  # IO binding is the default of both commands
            args.append("--no-iobinding")
        if self.shape_buckets:
            args += ["--shape-buckets", self.shape_buckets]
        return args

    def check_model(self, path: str | os.PathLike) -> str | None:
        """A warning when ``path`` is not the file that was tuned (by content), else None."""
        if not self.model_sha256:
            return None
        digest = file_sha256(path)
        if digest != self.model_sha256:
            return (f"{path} is not the model file this configuration was tuned on (sha256 {digest[:12]} vs "
                    f"{self.model_sha256[:12]}); its figures may not hold.")
        return None

    def to_dict(self) -> dict:
        """JSON-ready form (schema ``SCHEMA``), the target written as its string form."""
        return {
            "schema": SCHEMA, "model": self.model, "model_sha256": self.model_sha256, "target": str(self.target),
            "batch": self.batch, "shapes": {k: list(v) for k, v in self.shapes.items()},
            "input_shapes": {k: list(v) for k, v in self.input_shapes.items()}, "iobinding": self.iobinding,
            "concurrency": self.concurrency, "instances": self.instances, "measured": self.measured, "objective": self.objective,
            "provenance": self.provenance, **({"shape_buckets": self.shape_buckets} if self.shape_buckets else {}),
        }


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file, read in 1 MiB blocks (models can be gigabytes)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def save_config(config: TunedConfig, path: str | os.PathLike) -> Path:
    """Write ``config`` as JSON to ``path`` atomically and return the expanded path."""
    path = Path(path).expanduser()
    write_atomic(path, json.dumps(clean(config.to_dict()), indent=2) + "\n")
    return path


def load_config(path: str | os.PathLike) -> TunedConfig:
    """Read and validate a configuration written by `onnxaccel tune`."""
    path = Path(path).expanduser()
    where = str(path)
    if not path.is_file():
        raise ConfigError(f"Configuration file not found: {where}", "Write one with `onnxaccel tune MODEL --target T "
                          "--output FILE.json`.")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{where} is not JSON: {exc}.", "Pass the .json file that `onnxaccel tune` wrote.") from exc
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise ConfigError(f"{where} is not an onnxaccel configuration (schema {found!r}, expected {SCHEMA!r}).",
                          "Pass the file that `onnxaccel tune --output` wrote (not the tune report).")
    model = _field(data, "model", str, where)
    try:
        target = parse_target(_field(data, "target", str, where))
    except TargetError as exc:
        raise ConfigError(f"{where}: the target {data.get('target')!r} is not valid here: {exc.message}",
                          exc.hint, details=exc.details) from exc
    batch = data.get("batch")
    if batch is not None and (not isinstance(batch, int) or isinstance(batch, bool) or batch < 1):
        raise ConfigError(f"{where}: 'batch' must be a positive integer or null, got {batch!r}.", "e.g. \"batch\": 8")
    concurrency = data.get("concurrency", 1)
    if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
        raise ConfigError(f"{where}: 'concurrency' must be a positive integer, got {concurrency!r}.",
                          "e.g. \"concurrency\": 1")
    instances = data.get("instances", 1)
    if not isinstance(instances, int) or isinstance(instances, bool) or instances < 1:
        raise ConfigError(f"{where}: 'instances' must be a positive integer, got {instances!r}.",
                          "e.g. \"instances\": 1")
    iobinding = data.get("iobinding", True)
    if not isinstance(iobinding, bool):
        raise ConfigError(f"{where}: 'iobinding' must be true or false, got {iobinding!r}.", "e.g. \"iobinding\": true")
    return TunedConfig(
        model=model, target=target, batch=batch, shape_buckets=_shape_buckets(data.get("shape_buckets"), where),
        shapes=_shapes(data.get("shapes"), "shapes", where),
        input_shapes=_shapes(data.get("input_shapes"), "input_shapes", where), iobinding=iobinding,
        concurrency=concurrency, instances=instances, model_sha256=data.get("model_sha256"), measured=dict(data.get("measured") or {}),
        objective=dict(data.get("objective") or {}), provenance=dict(data.get("provenance") or {}), path=path,
    )


def _field(data: dict, key: str, kind: type, where: str):
    value = data.get(key)
    if not isinstance(value, kind) or not value:
        raise ConfigError(f"{where}: '{key}' is missing or not a {kind.__name__}.",
                          f"The file needs \"{key}\"; write it with `onnxaccel tune`.")
    return value


def _shapes(value, key: str, where: str) -> dict[str, tuple[int, ...]]:
    if value is None:
        return {}
    ok = isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, list) and v and all(isinstance(d, int) and d > 0 for d in v)
        for k, v in value.items())
    if not ok:
        raise ConfigError(f"{where}: '{key}' must map names to lists of positive integers, got {value!r}.",
                          f'e.g. "{key}": {{"sequence": [128]}}')
    return {k: tuple(v) for k, v in value.items()}


def _shape_buckets(value, where: str) -> str | None:
    """The ``shape_buckets`` text, checked by parsing it (ShapeBuckets.parse), or None when absent."""
    if value is None:
        return None
    from onnxaccel.engines.buckets import ShapeBuckets  # lazy: the config module stays light
    from onnxaccel.errors import ShapeError
    if not isinstance(value, str):
        raise ConfigError(f"{where}: 'shape_buckets' must be a string like \"sequence=32,64,128\", got {value!r}.",
                          'e.g. "shape_buckets": "sequence=32,64,128,256"')
    try:
        return ShapeBuckets.parse(value).describe()
    except ShapeError as exc:
        raise ConfigError(f"{where}: 'shape_buckets': {exc.message}", exc.hint) from exc
