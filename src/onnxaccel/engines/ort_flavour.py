"""Which ONNX Runtime build is installed, and which of the MIGraphX EP's option parsers it has.

How each flavour parses MIGraphX options (keys, boolean spelling, settings read only from ``ORT_MIGRAPHX_*``
variables) is held in providers/migraphx.py, one table per flavour with the upstream code it was read from.
This module recognises the installed build from the bytes of its own libraries (``onnxruntime/capi``; no GPU
needed): the binding's error text tells the parsers apart, and the option names a build declares are the ones
its library holds. Without readable libraries the package metadata (distribution and version) decides, more
cautiously. NOT EXECUTED ON AMD HARDWARE: no session with the MIGraphX EP was ever built here.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path

from packaging.version import InvalidVersion, Version

from onnxaccel import providers
from onnxaccel.providers.base import Flavour, Source
from onnxaccel.providers.migraphx import AMD_REL_1_22, LEGACY_UNKNOWN, MICROSOFT_1_20, ORT_1_23
from onnxaccel.providers.rocm import ROCM_EP_SOURCE

#: How one family of builds parses MIGraphX provider options (the name this module gave it first).
MigraphxParser = Flavour

__all__ = ["AMD_REL_1_22", "ENV_OF", "LEGACY_UNKNOWN", "MICROSOFT_1_20", "MIGRAPHX_KEYS_AFTER_1_27", "ORT_1_23",
           "PARSERS", "ROCM_EP_SOURCE", "MigraphxParser", "OrtBuild", "Source", "declared_keys", "detect",
           "holds_string", "installed_build", "legacy_parser", "library_bytes"]


_SPEC = providers.get("migraphx")
#: The MIGraphX option parsers, one per ORT flavour (providers/migraphx.py holds them with their sources).
PARSERS = _SPEC.flavours
#: Keys added to the provider's parser after 1.27.1 (03c1250): passed only where a build's library declares them.
MIGRAPHX_KEYS_AFTER_1_27 = frozenset(_SPEC.newer_options)
#: ORT_MIGRAPHX_* variables each flavour's provider reads (after the options, so they win where both exist).
ENV_OF = _SPEC.env_options
_ALL_KEYS = frozenset().union(*(p.keys for p in PARSERS)) | MIGRAPHX_KEYS_AFTER_1_27
#: Present in every readable MIGraphX parser; a library that lacks them as whole strings was not read right
#: (names inlined as fragments, as in the ROCm EP binary), and the table for its parser is used instead.
_CORE_KEYS = ("device_id", "migraphx_fp16_enable", "migraphx_int8_enable")
_LEGACY_THROW = b"Invalid MIGraphX EP option"
_AMD_DISTRIBUTIONS = ("onnxruntime-migraphx", "onnxruntime-rocm")


@dataclass(frozen=True)
class OrtBuild:
    """The installed ONNX Runtime as far as AMD's providers are concerned."""

    distribution: str | None = None
    version: str | None = None
    #: How the distribution was installed (PEP 610 direct_url.json): "index", "file: URL", "checkout: URL".
    origin: str = "unknown"
    capi: str | None = None
    #: The MIGraphX parser of this build; None when it has no MIGraphX EP.
    migraphx: MigraphxParser | None = None
    #: MIGraphX option keys this build declares (read from its library where possible).
    migraphx_keys: frozenset[str] = frozenset()
    rocm_ep: bool = False
    evidence: str = "nothing read"
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def label(self) -> str:
        """The distribution and version as one line, e.g. "onnxruntime-migraphx 1.23.0"."""
        name = self.distribution or "onnxruntime"
        return f"{name} {self.version}" if self.version else name

    def declares(self, key: str) -> bool:
        """Whether this build's MIGraphX EP takes ``key`` as a provider option."""
        return key in self.migraphx_keys

    def describe(self) -> list[str]:
        """What the flavour means for a user, one line each (doctor prints them)."""
        lines = [f"{self.label} ({self.origin}); read from {self.evidence}"]
        parser = self.migraphx
        if parser is None:
            lines.append("no MIGraphX EP in this build" + ("; ROCm EP present (booleans 1/0)" if self.rocm_ep else ""))
            return lines
        lines.append(f"MIGraphX options parsed as: {parser.title}; booleans {parser.true}/{parser.false}; "
                     f"other keys fail with '{parser.unknown_key_error}'")
        passed = sorted(self.migraphx_keys - set(parser.env_only))
        lines.append("option keys passed: " + ", ".join(passed))
        if parser.env_only:
            lines.append("set through the environment only (the provider ignores the option): " +
                         ", ".join(f"{k} -> {v}" for k, v in sorted(parser.env_only.items())))
        lines.append("INT8 on this EP: a quantized (QDQ) model only; the calibration-table path is refused "
                     "(the EP never fills the ranges it quantizes with)" if not parser.uses_calibration_table
                     else "INT8: QDQ models, or a calibration table")
        return lines + list(self.notes)

    def to_dict(self) -> dict:
        """The build as JSON-ready values, with what it means for MIGraphX options (``meaning``)."""
        return {"distribution": self.distribution, "version": self.version, "origin": self.origin, "capi": self.capi,
                "evidence": self.evidence, "rocm_ep": self.rocm_ep,
                "migraphx": None if self.migraphx is None else {**self.migraphx.to_dict(),
                                                                "declared_keys": sorted(self.migraphx_keys)},
                "notes": list(self.notes), "meaning": self.describe()}


def library_bytes(path: Path) -> bytes | None:
    """The file's bytes, or None when unreadable. Not kept: the binding is ~30 MB, and installed_build()
    keeps only what was read from it."""
    try:
        return path.read_bytes()
    except OSError:
        return None


def holds_string(data: bytes, text: str) -> bool:
    """Whether ``text`` is a NUL-terminated string of the library (alone, or after a non-identifier character)."""
    return re.search(rb"(?<![A-Za-z0-9_])" + re.escape(text.encode()) + rb"\x00", data) is not None


def declared_keys(data: bytes, candidates: frozenset[str] = _ALL_KEYS) -> frozenset[str] | None:
    """The candidate option keys a library holds; None when it does not hold the core keys as strings."""
    found = frozenset(k for k in candidates if holds_string(data, k))
    return found if all(k in found for k in _CORE_KEYS) else None


def legacy_parser(pybind: bytes) -> MigraphxParser:
    """Tell the two < 1.23 binding parsers apart by the key strings only one of them compares."""
    if any(holds_string(pybind, k) for k in ("migraphx_model_cache_dir", "migraphx_bf16_enable",
                                             "migraphx_int8_use_native_calibration_table")):
        return AMD_REL_1_22
    if holds_string(pybind, "migraphx_save_compiled_model"):
        return MICROSOFT_1_20
    return LEGACY_UNKNOWN


def detect(capi: Path | None, distribution: str | None = None, version: str | None = None,
           origin: str = "unknown") -> OrtBuild:
    """Recognise a build from its capi folder (provider library, Python binding), else from its metadata."""
    base = OrtBuild(distribution, version, origin, str(capi) if capi else None)
    provider = capi / "libonnxruntime_providers_migraphx.so" if capi else None
    rocm = bool(capi and (capi / "libonnxruntime_providers_rocm.so").exists())
    pybind = next(iter(sorted(capi.glob("onnxruntime_pybind11_state*.so"))), None) if capi and capi.is_dir() else None
    pybind_bytes = library_bytes(pybind) if pybind else None
    if capi and capi.is_dir() and pybind_bytes is not None:
        if provider is None or not provider.exists():
            return replace(base, rocm_ep=rocm, evidence=f"the libraries in {capi}")
        if _LEGACY_THROW in pybind_bytes:
            parser = legacy_parser(pybind_bytes)
            keys = declared_keys(pybind_bytes, parser.keys)
            return _with_parser(base, parser, keys, rocm, f"{pybind.name} (the binding parses MIGraphX options)")
        provider_bytes = library_bytes(provider)
        keys = declared_keys(provider_bytes) if provider_bytes is not None else None
        return _with_parser(base, ORT_1_23, keys, rocm, f"{provider.name} (the provider parses its options)")
    return _from_metadata(base)


def _with_parser(base: OrtBuild, parser: MigraphxParser, keys: frozenset[str] | None, rocm: bool,
                 evidence: str) -> OrtBuild:
    notes = ()
    if keys is None:
        keys = parser.keys
        notes = (f"the option names could not be read from {evidence.split(' ')[0]}; assuming the {parser.name} table",)
    return replace(base, migraphx=parser, migraphx_keys=keys, rocm_ep=rocm, evidence=evidence, notes=notes)


def _from_metadata(base: OrtBuild) -> OrtBuild:
    if base.distribution not in _AMD_DISTRIBUTIONS or not base.version:
        return replace(base, evidence="package metadata only")
    try:
        release = Version(base.version).release
    except InvalidVersion:
        release = ()
    parser = ORT_1_23 if release >= (1, 23) else LEGACY_UNKNOWN
    note = ("the libraries were not readable: the parser is inferred from the version, and settings both "
            "pre-1.23 parsers read from the environment go there" if parser is LEGACY_UNKNOWN else
            "the libraries were not readable: the parser is inferred from the version")
    return replace(base, migraphx=parser, migraphx_keys=parser.keys, rocm_ep=base.distribution == "onnxruntime-rocm",
                    evidence="package metadata only", notes=(note,))


def _origin(dist: metadata.Distribution) -> str:
    """PEP 610: direct_url.json exists when pip installed from a file, a URL or a checkout, not from an index."""
    text = dist.read_text("direct_url.json")
    if not text:
        return "index"
    try:
        info = json.loads(text)
    except ValueError:
        return "unknown"
    kind = "checkout" if "vcs_info" in info or "dir_info" in info else "file"
    return f"{kind}: {info.get('url', '?')}"


@functools.lru_cache(maxsize=1)
def installed_build() -> OrtBuild:
    """The running interpreter's onnxruntime, found without importing it."""
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or not spec.origin:
        return OrtBuild(evidence="onnxruntime is not installed")
    found = metadata.packages_distributions().get("onnxruntime", [])
    owners = {re.sub(r"[-_.]+", "-", d).lower(): d for d in found}  # METADATA may spell the name either way
    name = next((d for d in _AMD_DISTRIBUTIONS if d in owners), next(iter(sorted(owners)), None))
    version, origin = None, "unknown"
    if name:
        dist = metadata.distribution(owners[name])
        version, origin = dist.version, _origin(dist)
    build = detect(Path(spec.origin).parent / "capi", name, version, origin)
    if len(owners) > 1:
        build = replace(build, notes=build.notes + (f"several distributions install the onnxruntime module "
                                                     f"({', '.join(sorted(owners))}); {name} was read",))
    return build
