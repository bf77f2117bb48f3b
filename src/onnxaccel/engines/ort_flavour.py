"""Which ONNX Runtime build is installed, and how its MIGraphX EP reads provider options.

The same ``migraphx_fp16_enable=1`` works on one AMD ONNX Runtime build and breaks session creation on
another, because three different parsers have read MIGraphX options (each held below as one table, with the
upstream code it was read from):

* **ONNX Runtime >= 1.23** (PyPI ``onnxruntime-migraphx`` 1.23.x-1.27.x, microsoft/onnxruntime main): the
  Python binding hands the options to the provider library, whose ``ProviderOptionsParser`` reads booleans as
  0/1/true/false and rejects other keys with ``Unknown provider option``.
* **AMD's per-ROCm-release builds** (ROCm/onnxruntime branches ``rel-1.22.1``, ``rocm7.0_internal_testing``,
  ``rocm6.4_internal_testing``): the Python binding parses the options itself, accepts only
  "True"/"true"/"False"/"false" and throws ``Invalid MIGraphX EP option`` for the keys it does not list.
* **Microsoft's v1.20.0-v1.22.1 tags**: the same hand-written binding parser with other keys, and a provider
  whose constructor takes FP16, INT8 and exhaustive tuning only from ``ORT_MIGRAPHX_*`` environment variables.

The build is recognised from the bytes of its own libraries (``onnxruntime/capi``; no GPU needed): the
binding's error text tells the parsers apart, and the option names a build declares are the ones its
library holds. Without readable libraries the package metadata (distribution and version) decides, more
cautiously. NOT EXECUTED ON AMD HARDWARE: the tables come from source and from the bytes of the PyPI wheels
onnxruntime-migraphx 1.23.2 and 1.27.1; no session with the MIGraphX EP was ever built here.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path

from packaging.version import InvalidVersion, Version


@dataclass(frozen=True)
class Source:
    """Where a fact about another program was read: repository, path, commit (or wheel), lines."""

    repo: str
    path: str
    commit: str
    lines: str = ""

    def __str__(self) -> str:
        where = f" L{self.lines}" if self.lines else ""
        return f"{self.repo} {self.path}{where} @ {self.commit[:10]}"


@dataclass(frozen=True)
class MigraphxParser:
    """How one family of builds parses MIGraphX provider options."""

    name: str
    title: str
    #: Option keys the parser accepts; any other key fails session creation with ``unknown_key_error``.
    keys: frozenset[str]
    true: str
    false: str
    #: Settings the provider reads only from the environment (option key -> variable, values "1"/"0").
    env_only: Mapping[str, str]
    unknown_key_error: str
    #: Whether the EP fills the ranges it hands migraphx::quantize_int8 from migraphx_int8_calibration_table_name.
    uses_calibration_table: bool
    sources: tuple[Source, ...]
    #: How the table was checked: against a binary here, or against source only.
    checked: str

    def spell(self, value: bool) -> str:
        """A boolean in the spelling this EP build parses ("1"/"0" or "True"/"False")."""
        return self.true if value else self.false

    def to_dict(self) -> dict:
        """The parser's facts as JSON-ready values, for ``doctor`` and the target's description."""
        return {"name": self.name, "title": self.title, "keys": sorted(self.keys), "true": self.true,
                "false": self.false, "env_only": dict(self.env_only), "unknown_key_error": self.unknown_key_error,
                "uses_calibration_table": self.uses_calibration_table, "checked": self.checked,
                "sources": [str(s) for s in self.sources]}


_MS = "microsoft/onnxruntime"
_AMD = "ROCm/onnxruntime"
_PYBIND = "onnxruntime/python/onnxruntime_pybind_state.cc"
_EP_CC = "onnxruntime/core/providers/migraphx/migraphx_execution_provider.cc"
_NEVER_FILLED = ("The table is read into a local map and the member dynamic_range_map_ that quantize_int8 "
                 "receives is never assigned")

#: ORT >= 1.23: the provider's own parser. Keys: the option-name strings of libonnxruntime_providers_migraphx.so
#: in the PyPI wheels onnxruntime-migraphx 1.23.2 and 1.27.1 (tests/engines/migraphx/upstream/ort_wheel_*.txt),
#: equal to migraphx_execution_provider_info.h at 03c1250 less the two keys added after 1.27.1. Booleans:
#: TryParseStringWithClassicLocale(bool) takes "0"/"1"/"False"/"false"/"True"/"true" (parse_string.h L80-92).
#: INT8 table: at 03c1250 the constructor still reads the table into a local `dynamic_range_map` inside
#: `if (int8_calibration_cache_available_)` and never fills the member it quantizes with.
ORT_1_23 = MigraphxParser(
    name="ort-1.23+", title="ONNX Runtime >= 1.23 (PyPI onnxruntime-migraphx, microsoft/onnxruntime main)",
    keys=frozenset({
        "device_id", "migraphx_fp16_enable", "migraphx_bf16_enable", "migraphx_fp8_enable", "migraphx_int8_enable",
        "migraphx_int8_calibration_table_name", "migraphx_int8_use_native_calibration_table",
        "migraphx_exhaustive_tune", "migraphx_mem_limit", "migraphx_arena_extend_strategy",
        "migraphx_external_alloc", "migraphx_external_free", "migraphx_external_empty_cache",
        "migraphx_model_cache_dir"}),
    true="1", false="0", env_only={}, unknown_key_error='Unknown provider option: "<key>"',
    uses_calibration_table=False,
    sources=(Source("PyPI onnxruntime-migraphx 1.23.2 / 1.27.1 wheels",
                    "onnxruntime/capi/libonnxruntime_providers_migraphx.so", "sha256 6e0914c8b490 / 4a178713a67d"),
             Source(_MS, "onnxruntime/core/providers/migraphx/migraphx_execution_provider_info.h",
                    "03c125006fc8276159753be0cc577fc0e6b4551d", "22-39"),
             Source(_MS, "include/onnxruntime/core/common/parse_string.h",
                    "89746dc19a0a1ae59ebf4b16df9acab8f99f3925", "80-92")),
    checked="binary here (1.23.2, 1.27.1 wheels) and source")

#: AMD's per-release branches: the Python binding's MIGraphX branch compares option.first with
#: migraphx_provider_option::k* (migraphx_execution_provider_info.h L17-32 there) and option.second with
#: "True"/"true"/"False"/"false" (onnxruntime_pybind_state.cc L909-1012). The provider constructor takes every
#: setting from the session info, then lets ORT_MIGRAPHX_* override it (get_flags_from_env). The table is read
#: into a local (migraphx_execution_provider.cc L162-167); quantize_int8 runs only for
#: `(int8_enable xor fp8_enable) && int8_calibration_cache_available` (L1291) on dynamic_range_map_ (L1445).
AMD_REL_1_22 = MigraphxParser(
    name="amd-rel-1.22", title="AMD ROCm/onnxruntime per-release build (rel-1.22.1, rocm7.0, rocm6.4 branches)",
    keys=frozenset({
        "device_id", "migraphx_fp16_enable", "migraphx_bf16_enable", "migraphx_fp8_enable", "migraphx_int8_enable",
        "migraphx_int8_calibration_table_name", "migraphx_int8_use_native_calibration_table",
        "migraphx_model_cache_dir", "migraphx_exhaustive_tune"}),
    true="True", false="False", env_only={}, unknown_key_error="Invalid MIGraphX EP option: <key>",
    uses_calibration_table=False,
    sources=(Source(_AMD, _PYBIND, "84181618603f4691b7118c8b8a5f5f03c920220b", "909-1012"),
             Source(_AMD, _PYBIND, "3998378a4e429832b2a0a863bdf36bcafa1bcd4d", "909-1012"),
             Source(_AMD, "onnxruntime/core/providers/migraphx/migraphx_execution_provider_info.h",
                    "84181618603f4691b7118c8b8a5f5f03c920220b", "17-32"),
             Source(_AMD, _EP_CC, "84181618603f4691b7118c8b8a5f5f03c920220b", "161-167, 1281-1299, 1444-1445")),
    checked="source only")

#: Microsoft's v1.20.0-v1.22.1 tags (the key set is the same at every tag in between): the binding parses
#: "True"/"true"/"False"/"false" and these keys (L909-1022 at v1.22.1), but the provider constructor sets
#: fp16_enable_, int8_enable_ and exhaustive_tune_ only from ORT_MIGRAPHX_FP16_ENABLE, ORT_MIGRAPHX_INT8_ENABLE
#: and ORT_MIGRAPHX_EXHAUSTIVE_TUNE (std::stoi, migraphx_execution_provider.cc L107-124, L187-191): the
#: options are parsed and ignored. The INT8 table goes to a local map (L150-157) and quantize_int8 iterates
#: the member dynamic_range_map_ (L1166-1178), which nothing assigns.
MICROSOFT_1_20 = MigraphxParser(
    name="microsoft-1.20-1.22", title="ONNX Runtime v1.20.0-v1.22.1 built from Microsoft's tags",
    keys=frozenset({
        "device_id", "migraphx_fp16_enable", "migraphx_int8_enable", "migraphx_int8_calibration_table_name",
        "migraphx_use_native_calibration_table", "migraphx_save_compiled_model", "migraphx_save_model_path",
        "migraphx_load_compiled_model", "migraphx_load_model_path", "migraphx_exhaustive_tune"}),
    true="True", false="False",
    env_only={"migraphx_fp16_enable": "ORT_MIGRAPHX_FP16_ENABLE", "migraphx_int8_enable": "ORT_MIGRAPHX_INT8_ENABLE",
              "migraphx_exhaustive_tune": "ORT_MIGRAPHX_EXHAUSTIVE_TUNE",
              "migraphx_int8_calibration_table_name": "ORT_MIGRAPHX_INT8_CALIBRATION_TABLE_NAME",
              "migraphx_int8_use_native_calibration_table": "ORT_MIGRAPHX_INT8_USE_NATIVE_CALIBRATION_TABLE"},
    unknown_key_error="Invalid MIGraphX EP option: <key>", uses_calibration_table=False,
    sources=(Source(_MS, _PYBIND, "89746dc19a0a1ae59ebf4b16df9acab8f99f3925", "909-1022"),
             Source(_MS, _PYBIND, "c4fb724e810bb496165b9015c77f402727392933", "848-961"),
             Source(_MS, _EP_CC, "89746dc19a0a1ae59ebf4b16df9acab8f99f3925", "107-124, 150-157, 1166-1178, 187-191")),
    checked="source only")

#: A build older than 1.23 whose libraries could not tell the two parsers above apart: only what both accept.
#: Both providers read ORT_MIGRAPHX_FP16_ENABLE / _INT8_ENABLE / _EXHAUSTIVE_TUNE (AMD's lets them override the
#: options), so those settings travel as environment variables.
LEGACY_UNKNOWN = MigraphxParser(
    name="legacy-unknown", title="ONNX Runtime < 1.23 with a MIGraphX EP whose parser could not be identified",
    keys=AMD_REL_1_22.keys & MICROSOFT_1_20.keys, true="True", false="False",
    env_only={k: v for k, v in MICROSOFT_1_20.env_only.items() if k in ("migraphx_fp16_enable", "migraphx_int8_enable",
                                                                          "migraphx_exhaustive_tune")},
    unknown_key_error="Invalid MIGraphX EP option: <key>", uses_calibration_table=False,
    sources=AMD_REL_1_22.sources[:1] + MICROSOFT_1_20.sources[:1], checked="source only")

PARSERS = (ORT_1_23, AMD_REL_1_22, MICROSOFT_1_20, LEGACY_UNKNOWN)

#: ROCm EP (onnxruntime-rocm <= 1.22): ROCMExecutionProviderInfo::FromProviderOptions with the same
#: ProviderOptionsParser, so booleans are 0/1 there too (rocm_execution_provider_info.cc L13-30 at v1.22.1;
#: the 1.22.2.post3 binary holds each name as 16-byte fragments, inlined by the compiler).
ROCM_EP_SOURCE = Source(_MS, "onnxruntime/core/providers/rocm/rocm_execution_provider_info.cc",
                        "89746dc19a0a1ae59ebf4b16df9acab8f99f3925", "14-30")

#: Keys added to the provider's parser after 1.27.1 (03c1250): passed only where a build's library declares them.
MIGRAPHX_KEYS_AFTER_1_27 = frozenset({"migraphx_max_dynamic_batch", "migraphx_max_compiled_models"})
_ALL_KEYS = frozenset().union(*(p.keys for p in PARSERS)) | MIGRAPHX_KEYS_AFTER_1_27
#: Present in every readable MIGraphX parser; a library that lacks them as whole strings was not read right
#: (names inlined as fragments, as in the ROCm EP binary), and the table for its parser is used instead.
_CORE_KEYS = ("device_id", "migraphx_fp16_enable", "migraphx_int8_enable")
_LEGACY_THROW = b"Invalid MIGraphX EP option"
#: ORT_MIGRAPHX_* variables each flavour's provider reads (after the options, so they win where both exist).
ENV_OF = {
    "migraphx_fp16_enable": "ORT_MIGRAPHX_FP16_ENABLE", "migraphx_bf16_enable": "ORT_MIGRAPHX_BF16_ENABLE",
    "migraphx_fp8_enable": "ORT_MIGRAPHX_FP8_ENABLE", "migraphx_int8_enable": "ORT_MIGRAPHX_INT8_ENABLE",
    "migraphx_int8_calibration_table_name": "ORT_MIGRAPHX_INT8_CALIBRATION_TABLE_NAME",
    "migraphx_int8_use_native_calibration_table": "ORT_MIGRAPHX_INT8_USE_NATIVE_CALIBRATION_TABLE",
    "migraphx_exhaustive_tune": "ORT_MIGRAPHX_EXHAUSTIVE_TUNE", "migraphx_model_cache_dir": "ORT_MIGRAPHX_MODEL_CACHE_PATH",
}
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
