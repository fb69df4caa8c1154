"""Custom resources checked offline against the `openAPIV3Schema` of their vendored CRD
(tests/deploy/crds/), as the API server's structural validation would: the subset of
OpenAPI v3 the CRDs use.

Checked: `type` (object, array, string, integer, number, boolean), `properties` (a field
the schema does not declare is an error, as with `kubectl apply`'s strict field
validation), `required`, `additionalProperties`, `minProperties`/`maxProperties`, `items`,
`minItems`/`maxItems`, `enum`, `minLength`/`maxLength`, `pattern` (searched, as the API
server does), `minimum`/`maximum`. Not checked: `format`, defaults, and the CEL rules
(`x-kubernetes-validations`), which need a CEL evaluator; `metadata` is left to the API
server's ObjectMeta validation.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

CRDS = Path(__file__).parent / "crds"
_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
}


def load_crds(directory: Path = CRDS) -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) → the served version's openAPIV3Schema, for every CRD file."""
    schemas: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(directory.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        assert crd["kind"] == "CustomResourceDefinition", path
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if version["served"]:
                schemas[(f"{group}/{version['name']}", kind)] = version["schema"]["openAPIV3Schema"]
    return schemas


def errors(obj: Any, schema: dict[str, Any], path: str = "") -> Iterator[str]:
    """Every way `obj` breaks `schema`, as `path: what` lines (none: valid)."""
    where = path or "."
    expected = schema.get("type")
    if expected is not None:
        ok = isinstance(obj, _TYPES[expected]) and not (
            expected in ("integer", "number") and isinstance(obj, bool)
        )
        if not ok:
            yield f"{where}: expected {expected}, got {type(obj).__name__}"
            return
    if "enum" in schema and obj not in schema["enum"]:
        yield f"{where}: {obj!r} is not one of {schema['enum']}"
    if isinstance(obj, dict):
        yield from _object(obj, schema, path)
    elif isinstance(obj, list):
        yield from _array(obj, schema, path)
    elif isinstance(obj, str):
        if len(obj) < schema.get("minLength", 0):
            yield f"{where}: shorter than {schema['minLength']}"
        if "maxLength" in schema and len(obj) > schema["maxLength"]:
            yield f"{where}: longer than {schema['maxLength']}"
        if "pattern" in schema and re.search(schema["pattern"], obj) is None:
            yield f"{where}: {obj!r} does not match {schema['pattern']}"
    elif isinstance(obj, (int, float)):
        if "minimum" in schema and obj < schema["minimum"]:
            yield f"{where}: {obj} is below {schema['minimum']}"
        if "maximum" in schema and obj > schema["maximum"]:
            yield f"{where}: {obj} is above {schema['maximum']}"


def _object(obj: dict[str, Any], schema: dict[str, Any], path: str) -> Iterator[str]:
    where = path or "."
    for name in schema.get("required", []):
        if name not in obj:
            yield f"{where}: missing required field {name!r}"
    if len(obj) < schema.get("minProperties", 0):
        yield f"{where}: fewer than {schema['minProperties']} entries"
    if "maxProperties" in schema and len(obj) > schema["maxProperties"]:
        yield f"{where}: more than {schema['maxProperties']} entries"
    properties = schema.get("properties")
    extra = schema.get("additionalProperties")
    if path == ".metadata" or schema.get("x-kubernetes-preserve-unknown-fields"):
        return
    for key, value in obj.items():
        if properties is not None and key in properties:
            yield from errors(value, properties[key], f"{path}.{key}")
        elif isinstance(extra, dict):
            yield from errors(value, extra, f"{path}.{key}")
        elif properties is not None or extra is False:
            yield f"{where}: unknown field {key!r}"


def _array(obj: list[Any], schema: dict[str, Any], path: str) -> Iterator[str]:
    where = path or "."
    if len(obj) < schema.get("minItems", 0):
        yield f"{where}: fewer than {schema['minItems']} items"
    if "maxItems" in schema and len(obj) > schema["maxItems"]:
        yield f"{where}: more than {schema['maxItems']} items"
    items = schema.get("items")
    if isinstance(items, dict):
        for index, item in enumerate(obj):
            yield from errors(item, items, f"{path}[{index}]")


def validate(obj: dict[str, Any], schemas: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    """The errors of a custom resource against its CRD's schema; an unknown kind is one."""
    schema = schemas.get((obj.get("apiVersion", ""), obj.get("kind", "")))
    if schema is None:
        return [f"no vendored CRD serves {obj.get('apiVersion')} {obj.get('kind')}"]
    return list(errors(obj, schema))
