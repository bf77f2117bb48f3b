"""The execution providers onnxaccel knows, one module each (cpu, cuda, tensorrt, migraphx, rocm), and the
registry every consumer reads them through: a target's device words and option keys, the doctor's list,
``best_target``'s order, the server's arena and graph-capture knobs.

    get("cuda").options            # the option table a cuda target is validated against
    register(spec)                 # a plugin (or a test's toy) provider: seen by parse_target, doctor, best_target

Only this package (and engines/, which applies the options) names a provider's options or its ORT name;
scripts/check_provider_names.py holds the rest of the code to that.
"""

from __future__ import annotations

import difflib

from onnxaccel.errors import TargetError
from onnxaccel.providers import cpu, cuda, migraphx, rocm, tensorrt
from onnxaccel.providers.base import DOCTOR_CHECKS, CompileCache, Flavour, Knob, Prewarm, ProviderSpec, Source

__all__ = ["DOCTOR_CHECKS", "CompileCache", "Flavour", "Knob", "Prewarm", "ProviderSpec", "Source", "all_specs",
           "by_preference", "devices", "get", "graph_options", "register", "unregister"]

_REGISTRY: dict[str, ProviderSpec] = {}


def register(spec: ProviderSpec) -> ProviderSpec:
    """Add ``spec`` to the registry (after the others); a spec for a device already registered replaces it in
    place. Returns the spec."""
    if not spec.device or not spec.device.isidentifier() or spec.device != spec.device.lower():
        raise ValueError(f"A provider's device word must be a lower-case identifier, got {spec.device!r}.")
    _REGISTRY[spec.device] = spec
    return spec


def unregister(device: str) -> None:
    """Remove a registered provider (a test's toy provider, when the test ends)."""
    _REGISTRY.pop(device, None)


def get(device: str) -> ProviderSpec:
    """The spec for a target's device word; TargetError (with the closest device) for an unknown one."""
    spec = _REGISTRY.get(device)
    if spec is None:
        close = difflib.get_close_matches(str(device), list(_REGISTRY), n=1)
        raise TargetError(f"Unknown target device '{device}'.",
                          (f"Did you mean '{close[0]}'? " if close else "") + f"Targets: {', '.join(devices())}.")
    return spec


def all_specs() -> tuple[ProviderSpec, ...]:
    """Every registered provider, in registration order."""
    return tuple(_REGISTRY.values())


def devices() -> tuple[str, ...]:
    """The device words a target may start with, in registration order."""
    return tuple(_REGISTRY)


def graph_options() -> tuple[str, ...]:
    """The options that turn graph capture on, one per provider that has it (for help texts)."""
    return tuple(s.graph_option for s in _REGISTRY.values() if s.graph_option)


def by_preference() -> tuple[ProviderSpec, ...]:
    """The providers ``best_target`` tries, first choice first (those with a preference rank)."""
    ranked = [s for s in _REGISTRY.values() if s.preference is not None]
    return tuple(sorted(ranked, key=lambda s: s.preference))


for _module in (cpu, cuda, tensorrt, migraphx, rocm):
    register(_module.SPEC)
