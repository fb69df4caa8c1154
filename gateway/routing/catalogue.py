"""What a routing config may use, generated from the code: every registered plugin with
the parameters it declares (`Params`), and the built-in policies of `policies.toml`.

`kvgate routing plugins` prints it; docs/routing.md's tables are its Markdown, between
`<!-- routing:NAME -->` markers (a test keeps them equal)."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from gateway.routing.config import BUILTIN, normalise, read_config
from gateway.routing.load import LoadEstimator
from gateway.routing.plugins import (
    COSTS,
    FILTERS,
    MAX_WEIGHT,
    PICKERS,
    PLACEMENTS,
    PREFERENCES,
    SCORERS,
    WEIGHT_MEANING,
    Parameter,
    Params,
    PluginContext,
    default_costs,
)
from gateway.settings import AIBRIX_STRATEGIES, Settings
from predictor import Predictor

KINDS: tuple[tuple[str, Mapping[str, Callable[[Params, PluginContext], object]]], ...] = (
    ("filter", FILTERS),
    ("scorer", SCORERS),
    ("cost", COSTS),
    ("placement", PLACEMENTS),
    ("picker", PICKERS),
    ("preference", PREFERENCES),
)


@dataclass(frozen=True, slots=True)
class PluginDoc:
    kind: str
    name: str
    meaning: str
    parameters: tuple[Parameter, ...]


def _context(settings: Settings) -> PluginContext:
    ctx = PluginContext(
        rng=random.Random(0),
        load=LoadEstimator(),
        cost=Predictor(),
        affinity=None,
        block_size=settings.index.block_size,
        hot_spot_margin=settings.hot_spot_margin,
        tier_weights=settings.tier_weights,
        slo_shed=settings.slo_shed,
    )
    return replace(ctx, costs=default_costs(ctx))  # what the `min-cost` picker sums


def plugins() -> list[PluginDoc]:
    """Every registered plugin, built once with no parameters given, with what it read
    (its defaults as `kvgate serve` gives them without settings)."""
    ctx = _context(Settings())
    weight = Params("weight", {})
    weight.number("weight", 1.0, high=MAX_WEIGHT, meaning=WEIGHT_MEANING)
    docs = []
    for kind, registry in KINDS:
        for name, factory in registry.items():
            params = Params(name, {})
            factory(params, ctx)
            declared = (*weight.declared, *params.declared) if kind == "scorer" else params.declared
            meaning = " ".join((factory.__doc__ or "").split())
            docs.append(PluginDoc(kind, name, meaning, tuple(declared)))
    return docs


def default_parameters() -> list[str]:
    """Every parameter the default policy sets or inherits that can change its pick: its
    plugins' parameters (`plugin.parameter`, or the KVGATE_* setting a default comes
    from) and the settings of the predictor's parameters."""
    settings = Settings()
    spec = normalise(read_config(BUILTIN), BUILTIN.name)[settings.default_policy]
    ctx = _context(settings)
    registries = dict(KINDS)
    found: list[str] = []
    for kind, key in (
        ("filter", "filters"),
        ("scorer", "scorers"),
        ("cost", "costs"),
        ("placement", "placement"),
        ("picker", "picker"),
        ("preference", "prefer"),
    ):
        for plugin in [spec[key]] if key == "picker" else spec[key]:
            given = {k: v for k, v in plugin.items() if k not in ("type", "weight")}
            params = Params(plugin["type"], given)
            registries[kind][plugin["type"]](params, ctx)
            named = [p.setting or f"{plugin['type']}.{p.name}" for p in params.declared]
            found += [f"{plugin['type']}.weight"] * (kind == "scorer") + named
    found += settings.DECISION_SETTINGS
    return list(dict.fromkeys(found))  # a setting read by two plugins is one parameter


def default_markdown() -> str:
    names = default_parameters()
    shown = ", ".join(f"`{name}`" for name in names)
    return f"default policy: {len(names)} parameters ({shown})\n"


def plugins_markdown() -> str:
    rows = [
        "| kind | plugin | parameter | type | default | range | meaning |",
        "|---|---|---|---|---|---|---|",
    ]
    for doc in plugins():
        rows.append(f"| {doc.kind} | `{doc.name}` | — | | | | {_cell(doc.meaning)} |")
        for p in doc.parameters:
            rows.append(
                f"| {doc.kind} | `{doc.name}` | `{p.name}` | {p.kind} | {_cell(p.default)} "
                f"| {_cell(p.allowed)} | {_cell(p.meaning)} |"
            )
    return "\n".join(rows) + "\n"


def plugins_listing() -> str:
    lines = []
    for doc in plugins():
        lines.append(f"{doc.kind} {doc.name}: {doc.meaning}")
        for p in doc.parameters:
            lines.append(f"  {p.name:<26} {p.kind:<8} {p.default:<30} {p.allowed}")
            lines.append(f"  {'':<26} {p.meaning}")
    names = default_parameters()
    lines.append(f"default policy: {len(names)} parameters")
    lines.append("  " + ", ".join(names))
    return "\n".join(lines)


def policies_markdown() -> str:
    """The built-in policies (`policies.toml`), a profile identical to an earlier one
    shown as its alias."""
    specs = normalise(read_config(BUILTIN), BUILTIN.name)
    default = Settings().default_policy
    aibrix: dict[str, list[str]] = {}
    for strategy, policy in AIBRIX_STRATEGIES.items():
        if strategy != policy:
            aibrix.setdefault(policy, []).append(f"`{strategy}`")
    rows = [
        "| policy | filters | scorers | costs | placement | picker | preferences |",
        "|---|---|---|---|---|---|---|",
    ]
    seen: dict[str, str] = {}
    for name, spec in specs.items():
        notes = ["default"] if name == default else []
        key = repr(spec)
        if key in seen:
            notes.append(f"alias of `{seen[key]}`")
        seen.setdefault(key, name)
        if name in aibrix:
            notes.append("AIBrix " + ", ".join(aibrix[name]))
        label = f"`{name}`" + (f" ({'; '.join(notes)})" if notes else "")
        cells = [
            _plugins(spec["filters"]),
            _plugins(spec["scorers"]),
            _plugins(spec["costs"]),
            _plugins(spec["placement"]),
            _plugins([spec["picker"]]),
            _plugins(spec["prefer"]),
        ]
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


TABLES: dict[str, Callable[[], str]] = {
    "plugins": plugins_markdown,
    "policies": policies_markdown,
    "default": default_markdown,
}


def _plugins(specs: list[dict[str, Any]]) -> str:
    if not specs:
        return "—"
    shown = []
    for spec in specs:
        params = [f"{k} {_value(v)}" for k, v in spec.items() if k != "type"]
        shown.append(f"`{spec['type']}`" + (f" ({', '.join(params)})" if params else ""))
    return ", ".join(shown)


def _value(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")
