"""Parsers for the text AMD's tools print: ``rocminfo``, ``rocm-smi --json``, ``amd-smi ... --json``.

Each is tested on real outputs quoted in public issues (tests/system/fixtures, each file cites its source).
Formats drift between ROCm releases, so keys are matched by pattern, not spelled out:

* rocminfo prints one block per HSA agent (CPUs first); a GPU agent has ``Device Type: GPU`` and ``Name: gfxNNNN``
  (rocminfo's output, e.g. ``Name: gfx942`` for an MI300X). Its VRAM is the size of its ``GLOBAL; FLAGS: COARSE
  GRAINED`` pool.
* rocm-smi's JSON is ``{"card0": {...}, ...}`` with string values; the power key is ``Average Graphics Package
  Power (W)`` or ``Current Socket Graphics Package Power (W)`` depending on the GPU, and older releases wrote
  temperatures as ``(c)`` (ROCm/rocm_smi_lib python_smi_tools/rocm_smi.py at a1295714;
  RainbowMiner/RainbowMiner#749). Its ``GFX Version`` is computed arithmetically and wrong for gfx90a
  (rocm_smi_utils.cc rsmi_get_gfx_target_version at a1295714: KFD 90010 gives "gfx9010"): not used here.
* amd-smi's JSON is a list of GPUs (ROCm 6.x) or ``{"gpu_data": [...]}`` (ROCm 7.x, amd-smi 26.x), each
  value either a scalar, ``"N/A"``, or ``{"value": V, "unit": U}`` (henrygd/beszel#737, ROCm/ROCm#5706).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from onnxaccel.system.gpu_sample import GpuSample

MIB = 1024 * 1024


class ToolOutputError(ValueError):
    """A tool's output cannot be read (not JSON, truncated, an unknown layout)."""


# -- rocminfo --------------------------------------------------------------------------------------------

@dataclass
class RocmAgent:
    """One GPU agent of rocminfo (the CPU agents are skipped)."""

    gfx: str
    marketing_name: str = ""
    uuid: str = ""
    node: int | None = None
    compute_units: int | None = None
    max_clock_mhz: int | None = None
    vram_bytes: int | None = None
    isa: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """The agent as JSON-ready values."""
        return {"gfx": self.gfx, "marketing_name": self.marketing_name, "uuid": self.uuid, "node": self.node,
                "compute_units": self.compute_units, "max_clock_mhz": self.max_clock_mhz,
                "vram_bytes": self.vram_bytes, "isa": self.isa}


@dataclass
class RocminfoReport:
    """What ``rocminfo`` says: the HSA runtime and KFD versions and the GPU agents (CPU agents left out)."""
    runtime_version: str | None
    #: Version of the amdgpu kernel driver (KFD) when rocminfo prints it ("ROCk module version X is loaded").
    kfd_version: str | None
    gpus: list[RocmAgent]


_AGENT = re.compile(r"^\s*Agent\s+\d+\s*$")
_FIELD = re.compile(r"^(\s*)([^:]+?):\s*(.*?)\s*$")
_INT = re.compile(r"^(\d+)")
_GFX = re.compile(r"\bgfx[0-9a-f]+\b")
_ISA = re.compile(r"amdgcn-amd-amdhsa--(gfx[0-9a-z-]+)")


def _int(text: str) -> int | None:
    found = _INT.match(text.strip())
    return int(found.group(1)) if found else None


def parse_rocminfo(text: str) -> RocminfoReport:
    """Every GPU agent in ``rocminfo`` output, with the runtime and kernel-driver versions."""
    if "HSA Agents" not in text and not _AGENT.search(text):
        raise ToolOutputError("this is not rocminfo output (no 'HSA Agents' section)")
    kfd = re.search(r"ROCk module (?:version (\S+) )?is loaded", text)
    runtime = re.search(r"^Runtime Version:\s*(\S+)", text, re.M)
    blocks: list[list[str]] = []
    for line in text.splitlines():
        if _AGENT.match(line):
            blocks.append([])
        elif blocks:
            blocks[-1].append(line)
    gpus = [agent for agent in (_agent(block) for block in blocks) if agent is not None]
    return RocminfoReport(runtime.group(1) if runtime else None, kfd.group(1) if kfd else None, gpus)


def _agent(lines: list[str]) -> RocmAgent | None:
    top: dict[str, str] = {}
    isa: list[str] = []
    coarse_pool_kb: int | None = None
    in_coarse_pool = False
    for line in lines:
        found = _FIELD.match(line)
        if not found:
            continue
        indent, key, value = len(found.group(1)), found.group(2).strip(), found.group(3)
        if indent <= 2:
            top.setdefault(key, value)
        if key == "Segment":
            in_coarse_pool = "GLOBAL" in value and "COARSE GRAINED" in value
        elif key == "Size" and in_coarse_pool and coarse_pool_kb is None:
            coarse_pool_kb = _int(value)
        elif key == "Name" and indent > 2:
            isa_name = _ISA.search(value)
            if isa_name:
                isa.append(isa_name.group(1))
    if top.get("Device Type", "").upper() != "GPU":
        return None
    gfx = _GFX.search(top.get("Name", "")) or (_GFX.search(isa[0]) if isa else None)
    if gfx is None:
        return None
    return RocmAgent(
        gfx=gfx.group(0), marketing_name=top.get("Marketing Name", ""), uuid=top.get("Uuid", ""),
        node=_int(top.get("Node", "")), compute_units=_int(top.get("Compute Unit", "")),
        max_clock_mhz=_int(top.get("Max Clock Freq. (MHz)", "")),
        vram_bytes=coarse_pool_kb * 1024 if coarse_pool_kb is not None else None, isa=isa,
    )


# -- rocm-smi --json -------------------------------------------------------------------------------------

_CARD = re.compile(r"^card(\d+)$")
_KEYS = {
    "utilization_pct": re.compile(r"^GPU use \(%\)$", re.I),
    "memory_total_bytes": re.compile(r"^VRAM Total Memory \(B\)$", re.I),
    "memory_used_bytes": re.compile(r"^VRAM Total Used Memory \(B\)$", re.I),
    # "Average ..." or "Current Socket ..." (rocm_smi.py at a1295714: the prefix is its power_type);
    # never "Max Graphics Package Power (W)".
    "power_w": re.compile(r"^(?!Max\b).*Graphics Package Power \(W\)$", re.I),
    "gfx_clock_mhz": re.compile(r"^sclk clock speed:?$", re.I),
    "mem_clock_mhz": re.compile(r"^mclk clock speed:?$", re.I),
    "name": re.compile(r"^(Card Series|Device Name)$", re.I),
}
# Edge first: it is the sensor every GPU has; junction/memory are extra.
_TEMPS = (re.compile(r"^Temperature \(Sensor edge\) \(C\)$", re.I),
          re.compile(r"^Temperature \(Sensor junction\) \(C\)$", re.I))
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _number(value: object) -> float | None:
    """'49.0' -> 49.0, '(800Mhz)' -> 800.0, 'N/A' / 'N/A (Secondary die)' -> None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, str) or value.strip().upper().startswith("N/A"):
        return None
    found = _NUMBER.search(value)
    return float(found.group(0)) if found else None


def _load_json(text: str, tool: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        if text.strip() and exc.pos >= len(text.rstrip()):
            raise ToolOutputError(f"{tool} printed JSON that stops before it is complete (line {exc.lineno}): "
                                  "the output was cut off") from None
        snippet = text.strip().splitlines()[0][:80] if text.strip() else "(empty)"
        raise ToolOutputError(f"{tool} did not print valid JSON ({exc.msg} at line {exc.lineno}; "
                              f"it began with: {snippet})") from None


def parse_rocm_smi_json(text: str) -> list[GpuSample]:
    """Readings per card from ``rocm-smi --showuse --showmeminfo vram --showpower --showtemp ... --json``."""
    data = _load_json(text, "rocm-smi")
    if not isinstance(data, dict):
        raise ToolOutputError("rocm-smi JSON is not an object keyed by card")
    readings = []
    for key, card in data.items():
        index = _CARD.match(key)
        if index is None or not isinstance(card, dict):
            continue  # e.g. "system": {"Driver version": ...}
        values: dict = {}
        for name, value in card.items():
            for attr, pattern in _KEYS.items():
                if pattern.match(name) and values.get(attr) is None:
                    if attr == "name":
                        values["name"] = value if isinstance(value, str) and value != "N/A" else None
                    else:
                        number = _number(value)
                        if number is not None:
                            values[attr] = int(number) if attr.endswith("bytes") else number
        for pattern in _TEMPS:
            value = next((_number(v) for k, v in card.items() if pattern.match(k)), None)
            if value is not None:
                values["temperature_c"] = value
                break
        readings.append(GpuSample(int(index.group(1)), values.pop("name", None), "amd", **values))
    return sorted(readings, key=lambda r: r.gpu)


# -- amd-smi ... --json ----------------------------------------------------------------------------------

def _amd_value(node: object, *path: str) -> object:
    for key in path:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    if isinstance(node, dict) and "value" in node:
        unit = str(node.get("unit", "")).upper()
        value = node["value"]
        if unit in ("MB", "MIB") and isinstance(value, (int, float)):
            return int(value * MIB)  # amd-smi's "MB" are MiB: a 16 GiB card reports 16368 MB (nathaninline/ajean#39)
        return value
    return None if isinstance(node, str) and node.upper().startswith("N/A") else node


def _amd_gpus(text: str) -> list[dict]:
    data = _load_json(text, "amd-smi")
    if isinstance(data, dict) and isinstance(data.get("gpu_data"), list):
        data = data["gpu_data"]
    if not isinstance(data, list) or not all(isinstance(g, dict) for g in data):
        raise ToolOutputError("amd-smi JSON is neither a list of GPUs nor {'gpu_data': [...]}")
    return data


def parse_amd_smi_json(text: str) -> list[GpuSample]:
    """Readings per GPU from ``amd-smi metric --json`` and/or ``amd-smi static --json`` (either layout)."""
    readings = []
    for position, gpu in enumerate(_amd_gpus(text)):
        index = gpu.get("gpu", position)
        temp = _number(_amd_value(gpu, "temperature", "edge"))
        if temp is None:
            temp = _number(_amd_value(gpu, "temperature", "hotspot"))
        total = _amd_value(gpu, "mem_usage", "total_vram") or _amd_value(gpu, "vram", "size")
        readings.append(GpuSample(
            gpu=int(index) if isinstance(index, (int, float)) else position, vendor="amd",
            name=_text(_amd_value(gpu, "asic", "market_name")),
            utilization_pct=_number(_amd_value(gpu, "usage", "gfx_activity")),
            memory_used_bytes=_bytes(_amd_value(gpu, "mem_usage", "used_vram")),
            memory_total_bytes=_bytes(total),
            power_w=_number(_amd_value(gpu, "power", "socket_power")),
            temperature_c=temp,
            gfx_clock_mhz=_number(_amd_value(gpu, "clock", "gfx_0", "clk")),
            mem_clock_mhz=_number(_amd_value(gpu, "clock", "mem_0", "clk")),
            gfx=_text(_amd_value(gpu, "asic", "target_graphics_version")),
            compute_units=_int_or_none(_amd_value(gpu, "asic", "num_compute_units")),
            driver_version=_text(_amd_value(gpu, "driver", "version")),
        ))
    return readings


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value and value.upper() != "N/A" else None


def _bytes(value: object) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _int_or_none(value: object) -> int | None:
    number = _number(value)
    return int(number) if number is not None else None
