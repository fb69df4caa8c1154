"""Pinning's metrics: live leases and pinned blocks per pod, engine calls, expiries,
re-pins and refusals."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

PIN_OPS = ("pin", "unpin")
PIN_OUTCOMES = ("ok", "error")
PIN_REFUSALS = ("budget", "no_pin_support", "unknown_capacity", "no_kv_events")


class PinMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.pins_active = Gauge(
            "kvgate_pins_active", "Live pin leases, by pod", ["pod"], registry=registry
        )
        self.pinned_blocks = Gauge(
            "kvgate_pinned_blocks",
            "Engine blocks the gateway holds pinned, by pod",
            ["pod"],
            registry=registry,
        )
        self.pin_calls = Counter(
            "kvgate_pin_calls",
            "Engine pin/unpin calls, by op (pin, unpin) and outcome (ok, error)",
            ["op", "outcome"],
            registry=registry,
        )
        self.pin_lease_expiries = Counter(
            "kvgate_pin_lease_expiries", "Pin leases unpinned because their TTL ran out",
            registry=registry,
        )  # fmt: skip
        self.repins = Counter(
            "kvgate_repins", "Leases pinned again after the engine lost their pins",
            registry=registry,
        )  # fmt: skip
        self.pin_refusals = Counter(
            "kvgate_pin_refusals",
            "Pins refused, by reason (budget, no_pin_support, unknown_capacity, no_kv_events)",
            ["reason"],
            registry=registry,
        )
        for op in PIN_OPS:
            for outcome in PIN_OUTCOMES:
                self.pin_calls.labels(op, outcome)
        for reason in PIN_REFUSALS:
            self.pin_refusals.labels(reason)
