"""Check an InferenceService manifest against the KServe Python SDK's generated models (run with a Python that
has `kserve`; tests/deploy/test_kubernetes.py starts it).

The kserve package on PyPI ships no CRD schema (kserve 0.21.0 has no openAPIV3Schema file), so the structure is
checked against the SDK's OpenAPI-generated model classes instead: every key must be a field the model declares
(``attribute_map``), every value must have the declared type (``openapi_types``), recursively into the Kubernetes
client models KServe reuses (V1Container, V1PodSecurityContext, ...). (The SDK's own ApiClient cannot
deserialize it with kubernetes client >= 30: it looks up the client's "Dict[str, str]" type names in kserve.models
and fails, so the walk below is the check.)

Usage: python kserve_structure.py MANIFEST.yaml   -> prints JSON {"ok": bool, "problems": [...], "kserve": version}
"""

from __future__ import annotations

import json
import re
import sys

from importlib import metadata

import kubernetes.client.models as k8s_models
import yaml
from kserve import models as kserve_models

_PRIMITIVES = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,)}


def model_class(name: str):
    return getattr(kserve_models, name, None) or getattr(k8s_models, name, None)


def check(value, type_name: str, path: str, problems: list[str]) -> None:
    if value is None:
        return
    inner = re.fullmatch(r"[lL]ist\[(.+)\]", type_name)
    if inner:
        if not isinstance(value, list):
            problems.append(f"{path}: expected a list, got {type(value).__name__}")
            return
        for i, item in enumerate(value):
            check(item, inner.group(1), f"{path}[{i}]", problems)
        return
    inner = re.fullmatch(r"(?:dict\(str, (.+)\)|Dict\[str, (.+)\])", type_name)
    if inner:
        if not isinstance(value, dict):
            problems.append(f"{path}: expected a mapping, got {type(value).__name__}")
            return
        for key, item in value.items():
            check(item, inner.group(1) or inner.group(2), f"{path}.{key}", problems)
        return
    if type_name in ("object", "datetime"):
        return
    if type_name in _PRIMITIVES:
        allowed = _PRIMITIVES[type_name]
        # Kubernetes quantities (resources) are int-or-string; the client types them str.
        if type_name == "str" and re.search(r"\.(limits|requests)\.", path + "."):
            allowed = (str, int, float)
        if not isinstance(value, allowed) or (type_name == "int" and isinstance(value, bool)):
            problems.append(f"{path}: expected {type_name}, got {type(value).__name__} {value!r}")
        return
    klass = model_class(type_name)
    if klass is None:
        problems.append(f"{path}: unknown model type {type_name}")
        return
    if not isinstance(value, dict):
        problems.append(f"{path}: expected a {type_name} mapping, got {type(value).__name__}")
        return
    by_json = {json_key: attr for attr, json_key in klass.attribute_map.items()}
    for key, item in value.items():
        if key not in by_json:
            problems.append(f"{path}.{key}: not a field of {type_name}")
            continue
        check(item, klass.openapi_types[by_json[key]], f"{path}.{key}", problems)


def main(path: str) -> int:
    with open(path, encoding="utf-8") as handle:
        doc = yaml.safe_load(handle)
    problems: list[str] = []
    if doc.get("apiVersion") != "serving.kserve.io/v1beta1" or doc.get("kind") != "InferenceService":
        problems.append("not a serving.kserve.io/v1beta1 InferenceService")
    check(doc, "V1beta1InferenceService", "$", problems)
    print(json.dumps({"ok": not problems, "problems": problems, "kserve": metadata.version("kserve")}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
