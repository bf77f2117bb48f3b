"""Target: where and how a model runs, parsed from one short string and printable back to it.

Grammar: ``DEVICE[:ID][/PRECISION][@ENGINE][?KEY=VALUE&KEY=VALUE...]``

    cpu                       ONNX Runtime, CPUExecutionProvider, fp32
    cuda:1/fp16               CUDAExecutionProvider on GPU 1, an FP16 model
    migraphx:0/int8           MIGraphXExecutionProvider running a quantized (QDQ) model in INT8
    migraphx@migraphx         the native MIGraphX engine instead of ONNX Runtime
    cuda?prefer_nhwc=1&enable_cuda_graph=1

The same string appears on the command line, in a ``tune`` result, in benchmark reports and in serving
configs. Option keys are checked against what the provider accepts *before* a session is built, because
ONNX Runtime silently ignores unknown CPU options and unknown session-config keys. What each device accepts is
its provider's spec (onnxaccel.providers); target.py names no provider option itself.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field, replace
from urllib.parse import parse_qsl, quote

from onnxaccel import providers
from onnxaccel.errors import ProviderOptionError, TargetError
from onnxaccel.providers import ProviderSpec

PRECISIONS = ("fp32", "fp16", "int8")
ENGINES = ("ort", "migraphx")

# Session-level knobs any target may carry; they go to SessionOptions, not to the provider.
SESSION_OPTIONS = {
    "intra_op_num_threads": "int",
    "inter_op_num_threads": "int",
    "graph_optimization_level": ("disable", "basic", "extended", "layout", "all"),
    "execution_mode": ("sequential", "parallel"),
    "enable_mem_pattern": "bool",
    "enable_cpu_mem_arena": "bool",
}


class _RegistryView(Mapping):
    """A read-only table computed from the provider registry on each use (so a provider registered later is
    in it), for modules that still read the tables target.py used to hold. New code reads
    ``onnxaccel.providers.get(device)`` instead."""

    def __init__(self, build: Callable[[], dict]):
        self._build = build

    def __getitem__(self, key):
        return self._build()[key]

    def __iter__(self) -> Iterator:
        return iter(self._build())

    def __len__(self) -> int:
        return len(self._build())

    def __repr__(self) -> str:
        return repr(self._build())


class _ProviderNames(_RegistryView, MutableMapping):
    """device -> ORT provider name. Assigning one re-registers the device's spec under the new name (a test
    swaps a provider this way, e.g. ``monkeypatch.setitem(target.PROVIDER, "cuda", "AzureExecutionProvider")``)."""

    def __setitem__(self, device: str, name: str) -> None:
        providers.register(replace(providers.get(device), provider=name))

    def __delitem__(self, device: str) -> None:
        raise TypeError("providers are removed with onnxaccel.providers.unregister")


#: device -> ORT provider name (a view of the registry; assignable, see _ProviderNames).
PROVIDER: MutableMapping[str, str] = _ProviderNames(lambda: {s.device: s.provider for s in providers.all_specs()})
#: device -> (distribution, onnxaccel extra) (a view of the registry).
PROVIDER_PACKAGE: Mapping[str, tuple[str, str]] = _RegistryView(
    lambda: {s.device: s.package for s in providers.all_specs()})
#: device -> {option key: value kind} (a view of the registry; keys newer builds add are not in it).
PROVIDER_OPTIONS: Mapping[str, Mapping[str, object]] = _RegistryView(
    lambda: {s.device: s.options for s in providers.all_specs()})
#: device -> the option that turns on graph capture, for the devices that have one (a view of the registry).
GRAPH_OPTION: Mapping[str, str] = _RegistryView(
    lambda: {s.device: s.graph_option for s in providers.all_specs() if s.graph_option})
#: (device, precision) -> the options that make the provider convert precision itself (a view of the registry).
NATIVE_PRECISION: Mapping[tuple[str, str], Mapping[str, str]] = _RegistryView(
    lambda: {(s.device, p): o for s in providers.all_specs() for p, o in s.native_precision.items()})
#: MIGraphX keys only builds newer than its option table declare (providers/migraphx.py NEWER_OPTIONS).
_MIGRAPHX_NEWER = _RegistryView(lambda: dict(providers.get("migraphx").newer_options))


def _fake_options() -> dict[str, str]:
    """Keys guides recommend that no ONNX Runtime build has, from every registered provider -> the fix."""
    return {k: v for s in providers.all_specs() for k, v in s.fake_options.items()}


@dataclass(frozen=True)
class Target:
    """Engine, device, precision and options. ``str(target)`` gives back the string it was parsed from."""

    device: str = "cpu"
    device_id: int | None = None
    precision: str = "fp32"
    engine: str = "ort"
    options: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    @property
    def spec(self) -> ProviderSpec:
        """What onnxaccel knows about the device's execution provider (onnxaccel.providers)."""
        return providers.get(self.device)

    @property
    def provider(self) -> str:
        """The ONNX Runtime execution provider name for the device."""
        return self.spec.provider

    @property
    def is_gpu(self) -> bool:
        """Whether the device's provider runs on a GPU (every registered device but the CPU)."""
        return self.spec.is_gpu

    @property
    def option_dict(self) -> dict[str, str]:
        """The options as a dict."""
        return dict(self.options)

    def provider_options(self) -> dict[str, str]:
        """Options for the execution provider: the user's, plus device id and native precision switches."""
        spec = self.spec
        opts = {k: v for k, v in self.options if k not in SESSION_OPTIONS}
        if self.device_id is not None and spec.device_id_option:
            opts.setdefault(spec.device_id_option, str(self.device_id))
        for key, value in spec.native_precision.get(self.precision, {}).items():
            opts.setdefault(key, value)
        return opts

    def session_options(self) -> dict[str, str]:
        """The options meant for the session rather than the execution provider."""
        return {k: v for k, v in self.options if k in SESSION_OPTIONS}

    @property
    def precision_is_native(self) -> bool:
        """True when the provider converts precision itself; False when the model must be converted."""
        return self.precision == "fp32" or self.precision in self.spec.native_precision

    def with_options(self, extra: Mapping[str, str]) -> Target:
        """A copy with ``extra`` options added or replacing existing ones (validated)."""
        merged = dict(self.options)
        merged.update({k: str(v) for k, v in extra.items()})
        return validated(replace(self, options=tuple(sorted(merged.items()))))

    def without_options(self, *keys: str) -> Target:
        """A copy without the named options."""
        return replace(self, options=tuple(kv for kv in self.options if kv[0] not in keys))

    @property
    def graph_capture(self) -> bool:
        """Whether the target's options turn on graph capture (its provider's graph_option)."""
        key = self.spec.graph_option
        return key is not None and self.option_dict.get(key, "0").lower() in ("1", "true")

    def with_precision(self, precision: str) -> Target:
        """A copy at ``precision`` (validated against the device)."""
        return validated(replace(self, precision=precision))

    def __str__(self) -> str:
        text = self.device
        if self.device_id is not None:
            text += f":{self.device_id}"
        if self.precision != "fp32":
            text += f"/{self.precision}"
        if self.engine != "ort":
            text += f"@{self.engine}"
        if self.options:
            text += "?" + "&".join(f"{k}={quote(v, safe='/:.,-_')}" for k, v in self.options)
        return text

    def to_dict(self) -> dict:
        """JSON-ready form of the target: its string and parsed parts."""
        return {
            "target": str(self),
            "engine": self.engine,
            "device": self.device,
            "device_id": self.device_id,
            "precision": self.precision,
            "provider": self.provider if self.engine == "ort" else None,
            "options": dict(self.options),
        }


def gpu_session_threads(target: Target) -> dict[str, str]:
    """Extra options for a GPU ONNX Runtime session's CPU thread pool: one thread, unless the target sets
    ``intra_op_num_threads`` ({} then, and for CPU targets and the native MIGraphX engine). The pool only runs
    the few CPU-placed (shape) nodes, but by default has one spinning thread per core, which competes with
    everything else the process and machine do for a GPU: serve's event loops, batch's readers, decoders and
    writer."""
    if not target.is_gpu or target.engine != "ort" or "intra_op_num_threads" in target.option_dict:
        return {}
    return {"intra_op_num_threads": "1"}


def parse_target(
    text: str,
    *,
    precision: str | None = None,
    options: Iterable[str] | Mapping[str, str] = (),
    engine: str | None = None,
) -> Target:
    """Parse a target string; ``precision``, ``options`` (``KEY=VALUE`` items) and ``engine`` override it."""
    if isinstance(text, Target):
        base = text
    else:
        base = _parse_string(str(text).strip())
    extra = dict(options) if isinstance(options, Mapping) else _parse_option_items(options)
    merged = dict(base.options)
    merged.update(extra)
    target = replace(
        base,
        precision=(precision or base.precision).lower(),
        engine=(engine or base.engine).lower(),
        options=tuple(sorted(merged.items())),
    )
    return validated(target)


def validated(target: Target) -> Target:
    """Check device, precision, engine and every option key and value; normalize booleans to 0/1."""
    if target.precision not in PRECISIONS:
        raise TargetError(
            f"Unknown precision '{target.precision}'.", f"Use one of: {', '.join(PRECISIONS)}."
        )
    if target.engine not in ENGINES:
        raise TargetError(f"Unknown engine '{target.engine}'.", f"Use one of: {', '.join(ENGINES)}.")
    if target.engine == "migraphx" and target.device != "migraphx":
        raise TargetError(
            f"The native MIGraphX engine runs only on AMD GPUs; the target names '{target.device}'.",
            "Use migraphx@migraphx (or --engine migraphx --target migraphx), or drop @migraphx.",
        )
    if target.engine != "ort":
        # The native engine checks its own options (engines/migraphx_setup.py NATIVE_OPTIONS: arguments of
        # parse_onnx / program.compile and the .mxr cache), which differ from the EP's provider options.
        return target
    known = providers.get(target.device).all_options()
    fake = _fake_options()
    normalized = []
    for key, value in target.options:
        if key in fake:
            raise ProviderOptionError(f"'{key}' is not an ONNX Runtime option.", fake[key])
        kind = SESSION_OPTIONS.get(key) or known.get(key)
        if kind is None:
            raise ProviderOptionError(_unknown_option_message(target.device, key), _valid_keys_hint(target.device, key))
        normalized.append((key, _check_value(target.device, key, value, kind)))
    return replace(target, options=tuple(sorted(normalized)))


def _parse_string(text: str) -> Target:
    devices = providers.devices()
    if not text:
        raise TargetError("The target is empty.", f"Use one of: {', '.join(devices)} (e.g. cuda:0/fp16).")
    head, _, query = text.partition("?")
    head, _, engine = head.partition("@")
    head, _, precision = head.partition("/")
    device, _, dev_id = head.partition(":")
    device = device.lower()
    if device not in devices:
        close = difflib.get_close_matches(device, devices, n=1)
        raise TargetError(
            f"Unknown target device '{device}' in '{text}'.",
            (f"Did you mean '{close[0]}'? " if close else "")
            + f"Targets: {', '.join(devices)}, with an optional :ID, /PRECISION and ?KEY=VALUE options.",
        )
    device_id = None
    if dev_id:
        if not dev_id.isdigit():
            raise TargetError(f"The device id in '{text}' must be a number, got '{dev_id}'.", f"e.g. {device}:0")
        if providers.get(device).device_id_option is None:
            raise TargetError(f"The {device} target takes no device id.", f"Use --target {device}.")
        device_id = int(dev_id)
    options = tuple(sorted(parse_qsl(query, keep_blank_values=True))) if query else ()
    return Target(device=device, device_id=device_id, precision=(precision or "fp32").lower(),
                  engine=(engine or "ort").lower(), options=options)


def _parse_option_items(items: Iterable[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ProviderOptionError(
                f"Cannot read the option '{item}'.", "Write --ep-option KEY=VALUE, e.g. --ep-option intra_op_num_threads=2."
            )
        out[key.strip()] = value.strip()
    return out


def _check_value(device: str, key: str, value: str, kind: object) -> str:
    bad = None
    if kind == "bool":
        low = value.lower()
        if low in ("1", "true", "on", "yes"):
            return "1"
        if low in ("0", "false", "off", "no"):
            return "0"
        bad = "0 or 1"
    elif kind == "int":
        if value.strip().lstrip("-").isdigit():
            return value.strip()
        bad = "an integer"
    elif isinstance(kind, tuple):
        match = {v.lower(): v for v in kind}.get(value.lower())
        if match:
            return match
        bad = "one of " + ", ".join(kind)
    else:
        return value
    raise ProviderOptionError(f"Option {key}={value!r} for {device}: the value must be {bad}.", f"e.g. {key}={_example_value(kind)}")


def _example_value(kind: object) -> str:
    if kind == "bool":
        return "1"
    if kind == "int":
        return "0"
    return kind[0] if isinstance(kind, tuple) else "VALUE"


def _unknown_option_message(device: str, key: str) -> str:
    others = [s.device for s in providers.all_specs() if key in s.all_options() and s.device != device]
    where = f" (it is a {', '.join(others)} option)" if others else ""
    return f"'{key}' is not an option of {providers.get(device).provider}{where}."


def _valid_keys_hint(device: str, key: str) -> str:
    spec = providers.get(device)
    keys = sorted(spec.options) + sorted(SESSION_OPTIONS)
    close = difflib.get_close_matches(key, keys, n=1)
    lead = f"Did you mean '{close[0]}'? " if close else ""
    if not spec.all_options():
        return lead + f"{spec.provider} takes no provider options (ONNX Runtime would drop them silently); " \
            f"session options: {', '.join(sorted(SESSION_OPTIONS))}."
    return lead + f"Valid options for {device}: {', '.join(keys)}."
