"""A decision's passes over its candidates: each runs once per decision over every pod of
the model, so each has a compiled twin in `indexer._native` (same operations, same
answers), and these pure-Python ones where it was not built or KVGATE_PURE_PYTHON asks."""

from __future__ import annotations

from dataclasses import dataclass

from indexer.native import AffineCosts, AffineOrder, Argsort, load_native


def affine_costs(
    bases: list[float],
    units: list[float],
    ends: list[float],
    cached: list[float],
    prompt_tokens: float,
    step_term: float,
    now: float,
) -> tuple[list[float], list[float]]:
    """Per pod: (TTFT, own prefill) = (base + prefill + θ5 · max(0, end − now), unit · own
    uncached tokens)."""
    ttfts: list[float] = []
    prefills: list[float] = []
    for base, unit, end, held in zip(bases, units, ends, cached, strict=True):
        own = prompt_tokens - held
        prefill = unit * own if own > 0.0 else 0.0
        remaining = end - now
        ttfts.append(base + prefill + step_term * remaining if remaining > 0.0 else base + prefill)
        prefills.append(prefill)
    return ttfts, prefills


def argsort(values: list[float]) -> list[int]:
    """The indices of `values` by ascending value, equal values in index order."""
    return sorted(range(len(values)), key=values.__getitem__)


def affine_order(
    bases: list[float],
    units: list[float],
    ends: list[float],
    cached: list[float],
    prompt_tokens: float,
    step_term: float,
    now: float,
    tolerance: float,
) -> tuple[list[int], int, int]:
    """`affine_costs`' TTFTs ranked: (order, ties, equal). `order` is their `argsort`, but
    its first `ties` pods (those within `tolerance` of the best, at least one) in descending
    order of `cached` tokens (equal ones as they were); `equal`: how many of those hold as
    much as the first. What the cost-model picker ranks by when only the TTFT counts."""
    ttfts, _ = affine_costs(bases, units, ends, cached, prompt_tokens, step_term, now)
    order = argsort(ttfts)
    if not order:
        return order, 0, 0
    ties = near_ties(order, ttfts, tolerance)
    return order, ties, most_cached_first(order, ties, cached)


def near_ties(order: list[int], costs: list[float], tolerance: float) -> int:
    """How many of `order` (indices of `costs`, ascending, not empty) are within
    `tolerance` of the first's cost: at least one."""
    limit = costs[order[0]] * (1.0 + tolerance)
    ties = 1
    while ties < len(order) and costs[order[ties]] <= limit:
        ties += 1
    return ties


def most_cached_first(order: list[int], ties: int, cached: list[float]) -> int:
    """Puts the first `ties` of `order` in descending order of `cached` (equal ones as they
    were), in place; returns how many of them hold as much as the first."""
    head = order[:ties]
    head.sort(key=cached.__getitem__, reverse=True)  # stable: equal ones keep their order
    order[:ties] = head
    equal = 1
    while equal < ties and cached[head[equal]] == cached[head[0]]:
        equal += 1
    return equal


@dataclass(frozen=True, slots=True)
class Kernels:
    affine_costs: AffineCosts
    argsort: Argsort
    affine_order: AffineOrder

    @classmethod
    def load(cls, pure_python: bool | None = None) -> Kernels:
        """The compiled kernels where built, unless `pure_python` (None: as
        KVGATE_PURE_PYTHON says)."""
        native = load_native(pure_python)
        if native is None:
            return cls(affine_costs, argsort, affine_order)
        return cls(native.affine_costs, native.argsort, native.affine_order)
