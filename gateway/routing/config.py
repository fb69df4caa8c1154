"""Routing configs: profiles of named plugins, from TOML or YAML; the built-ins are one.

    [profiles.NAME]
    filters = ["routable", { type = "hot-spot-guard", margin = 16 }]
    scorers = [{ type = "prefix", weight = 1.0 }, { type = "load", scale = 2.0 }]
    picker = "max-score"                # or { type = "…", param = … }
    prefer = ["pin-affinity"]

    [profiles.COSTED]                   # the `min-cost` picker sums `costs`
    filters = ["routable"]
    costs = ["ttft-cost", { type = "delay-cost", weight = 2.0 }]
    placement = "first-turn"            # optional
    picker = "min-cost"

A plugin is its name, or a table with `type` and its parameters (a scorer's `weight`
defaults to 1). The default policy is KVGATE_DEFAULT_POLICY (`--policy`). A user's file
is laid over the built-ins (`policies.toml` beside this module): its profiles add to them
or replace them by name. Anything unknown or invalid
stops start-up with a ConfigError naming the file, profile, plugin and parameter.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from gateway.config_files import read_document
from gateway.errors import ConfigError
from gateway.routing.plugins import (
    COSTS,
    FILTERS,
    MAX_WEIGHT,
    PICKERS,
    PLACEMENTS,
    PREFERENCES,
    SCORERS,
    WEIGHT_MEANING,
    Params,
    PluginContext,
)
from gateway.routing.profile import PluginTimer, RoutingProfile, Weighted

T = TypeVar("T")
BUILTIN = Path(__file__).with_name("policies.toml")
_PROFILE_KEYS = ("filters", "scorers", "costs", "placement", "picker", "prefer")


def read_config(path: Path) -> dict[str, Any]:
    """A routing config file (`.yaml` / `.yml`, else TOML), parsed; bounded in size and
    nesting (`gateway/config_files.py`)."""
    variable = "KVGATE_ROUTING_CONFIG"
    kind = "yaml" if path.suffix.lower() in (".yaml", ".yml") else "toml"
    data = read_document(path, variable, kind=kind)
    if not isinstance(data, dict):
        raise ConfigError(variable, str(path), "a table with a `profiles` table")
    return data


def normalise(data: Mapping[str, Any], source: str) -> dict[str, Any]:
    """{profile name: normalised spec} of a parsed config."""
    unknown = set(data) - {"profiles"}
    if unknown:
        raise ConfigError(source, ", ".join(sorted(unknown)), "only a `profiles` table")
    profiles = data.get("profiles", {})
    if not isinstance(profiles, dict):
        raise ConfigError(f"{source}: profiles", profiles, "a table of profiles")
    specs: dict[str, Any] = {}
    for name, body in profiles.items():
        where = f"{source}: profiles.{name}"
        if not isinstance(body, dict):
            raise ConfigError(where, body, "a table")
        extra = set(body) - set(_PROFILE_KEYS)
        if extra:
            raise ConfigError(where, ", ".join(sorted(extra)), "only " + ", ".join(_PROFILE_KEYS))
        if "picker" not in body:
            raise ConfigError(f"{where}.picker", None, "a picker: " + ", ".join(PICKERS))
        specs[str(name).lower()] = {
            "filters": _plugins(body.get("filters", []), f"{where}.filters", FILTERS),
            "scorers": [
                {"weight": 1.0, **spec}
                for spec in _plugins(body.get("scorers", []), f"{where}.scorers", SCORERS)
            ],
            "costs": _plugins(body.get("costs", []), f"{where}.costs", COSTS),
            "placement": [_plugin(body["placement"], f"{where}.placement", PLACEMENTS)]
            if "placement" in body
            else [],
            "picker": _plugin(body["picker"], f"{where}.picker", PICKERS),
            "prefer": _plugins(body.get("prefer", []), f"{where}.prefer", PREFERENCES),
        }
    return specs


def load_specs(path: Path | None) -> dict[str, Any]:
    """The built-in profiles with `path`'s laid over them (added, or replaced by name)."""
    specs = normalise(read_config(BUILTIN), str(BUILTIN.name))
    if path is not None:
        specs.update(normalise(read_config(path), str(path)))
    return specs


def builtin_names() -> tuple[str, ...]:
    """The built-in policies' names: policies.toml's profiles, in the file's order."""
    return tuple(normalise(read_config(BUILTIN), BUILTIN.name))


def build_profiles(
    specs: Mapping[str, Any], ctx: PluginContext, timer: PluginTimer | None = None
) -> dict[str, RoutingProfile]:
    profiles = {}
    for name, spec in specs.items():
        where = f"profile {name}"
        scorers = []
        for i, p in enumerate(spec["scorers"]):
            params = _params(p, f"{where}.scorers[{i}]")
            weight = params.number("weight", 1.0, high=MAX_WEIGHT, meaning=WEIGHT_MEANING)
            scorers.append(Weighted(_built(SCORERS[p["type"]], params, ctx), weight))
        picker_ctx = _costed(spec, where, ctx)
        picker = spec["picker"]
        profiles[name] = RoutingProfile(
            name,
            filters=[
                _built(FILTERS[p["type"]], _params(p, f"{where}.filters[{i}]"), ctx)
                for i, p in enumerate(spec["filters"])
            ],
            scorers=scorers,
            picker=_built(PICKERS[picker["type"]], _params(picker, where), picker_ctx),
            preferences=[
                _built(PREFERENCES[p["type"]], _params(p, f"{where}.prefer[{i}]"), ctx)
                for i, p in enumerate(spec["prefer"])
            ],
            spec=spec,
            **({} if timer is None else {"timer": timer}),
        )
    return profiles


def _costed(spec: Mapping[str, Any], where: str, ctx: PluginContext) -> PluginContext:
    """`ctx` with the profile's costs and placement, built (for its `min-cost` picker)."""
    if not spec["costs"] and not spec["placement"]:
        return ctx
    if spec["picker"]["type"] != "min-cost":
        raise ConfigError(f"{where}.picker", spec["picker"]["type"], "min-cost (with `costs`)")
    costs = tuple(
        _built(COSTS[p["type"]], _params(p, f"{where}.costs[{i}]"), ctx)
        for i, p in enumerate(spec["costs"])
    )
    placement = [
        _built(PLACEMENTS[p["type"]], _params(p, f"{where}.placement"), ctx)
        for p in spec["placement"]
    ]
    return replace(ctx, costs=costs, placement=placement[0] if placement else None)


def configured_profiles(
    path: Path | None, default: str, ctx: PluginContext, timer: PluginTimer | None = None
) -> dict[str, RoutingProfile]:
    """The built-ins with the routing config at `path` laid over them, built; `default`
    must name one of them."""
    profiles = build_profiles(load_specs(path), ctx, timer)
    if default not in profiles:
        raise ConfigError("KVGATE_DEFAULT_POLICY", default, "one of " + ", ".join(profiles))
    return profiles


def _params(spec: Mapping[str, Any], where: str) -> Params:
    given = {key: value for key, value in spec.items() if key != "type"}
    return Params(f"{where} ({spec['type']})", given)


def _built(factory: Callable[[Params, PluginContext], T], params: Params, ctx: PluginContext) -> T:
    """The plugin, once every parameter it was given was one it knows."""
    plugin = factory(params, ctx)
    params.done()
    return plugin


def _plugins(raw: Any, where: str, known: Mapping[str, Any]) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise ConfigError(where, raw, "a list of plugins")
    return [_plugin(item, f"{where}[{i}]", known) for i, item in enumerate(raw)]


def _plugin(raw: Any, where: str, known: Mapping[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any]
    if isinstance(raw, str):
        spec = {"type": raw}
    elif isinstance(raw, dict) and isinstance(raw.get("type"), str):
        spec = dict(raw)
    else:
        raise ConfigError(where, raw, "a plugin name or a table with `type`")
    if spec["type"] not in known:
        raise ConfigError(f"{where}.type", spec["type"], "one of " + ", ".join(known))
    return spec
