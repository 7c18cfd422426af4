"""Check a KServe manifest against KServe's published API types (run with .venv-peers).

Every key must be a field of the type the kserve package (and the kubernetes client it
builds on) declares at that place, recursively; each problem is printed as PATH: what.
Exit status 1 when there is any.

    python kserve_schema_check.py deploy/kserve.yaml
"""

from __future__ import annotations

import re
import sys

import kserve
import kubernetes.client
import yaml

PRIMITIVES = {"str": str, "int": int, "bool": bool, "float": (int, float), "object": object}


def model_class(name: str):
    return getattr(kserve, name, None) or getattr(kubernetes.client, name)


def check(value, kind: str, path: str, problems: list[str]) -> None:
    if match := re.fullmatch(r"[lL]ist\[(.+)\]", kind):
        if not isinstance(value, list):
            problems.append(f"{path}: expected a list")
            return
        for i, item in enumerate(value):
            check(item, match[1], f"{path}[{i}]", problems)
        return
    if match := re.fullmatch(r"(?:dict\(|Dict\[)(\w+), (.+)[)\]]", kind):
        if not isinstance(value, dict):
            problems.append(f"{path}: expected a mapping")
            return
        for key, item in value.items():
            check(item, match[2], f"{path}.{key}", problems)
        return
    if kind in PRIMITIVES:
        if not isinstance(value, PRIMITIVES[kind]):
            problems.append(f"{path}: expected {kind}, got {type(value).__name__}")
        return
    if kind == "datetime":
        return
    cls = model_class(kind)
    if not isinstance(value, dict):
        problems.append(f"{path}: expected a {kind} mapping")
        return
    fields = {json_name: attr for attr, json_name in cls.attribute_map.items()}
    for key, item in value.items():
        if key not in fields:
            problems.append(f"{path}.{key}: not a field of {kind}")
            continue
        check(item, cls.openapi_types[fields[key]], f"{path}.{key}", problems)


def main() -> int:
    with open(sys.argv[1]) as f:
        document = yaml.safe_load(f)
    problems: list[str] = []
    check(document, "V1beta1InferenceService", "", problems)
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
