"""The simulated engine's latency model (all figures in model time, seconds).

Calibrated on SIM-CALIBRATION.md (Qwen3-14B-FP8 on one GPU): a cold prompt of P tokens costs
    overhead + a·P + q·P²            (20 ms + 111 µs/token + 0.00475 µs/token², fitted on the
                                      five cold points within 4 %)
and a prompt with C cached and N new tokens costs
    overhead + a·N + q·((C+N)² − C²) + load cost of the cached tokens found off-GPU,
so only new tokens pay the linear term while attention over the cached part still costs
something (≈ 230–280 ms for ≈ 1–1.7 k new tokens whatever the depth, as measured).
A decode step costs `decode_ms_per_token + decode_ms_per_seq × batch`. `time_scale`
divides every duration when converting to wall time.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LatencyModel:
    request_overhead_ms: float = 20.0
    prefill_us_per_token: float = 111.0
    prefill_us_per_token_sq: float = 0.00475
    host_load_us_per_token: float = 2.0
    disk_load_us_per_token: float = 20.0
    decode_ms_per_token: float = 25.0
    decode_ms_per_seq: float = 0.2
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        for name in (
            "request_overhead_ms",
            "prefill_us_per_token",
            "prefill_us_per_token_sq",
            "host_load_us_per_token",
            "disk_load_us_per_token",
            "decode_ms_per_token",
            "decode_ms_per_seq",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {self.time_scale}")

    def prefill_seconds(
        self,
        new_tokens: int,
        cached_tokens: int = 0,
        *,
        host_tokens: int = 0,
        disk_tokens: int = 0,
        overhead: bool = True,
    ) -> float:
        """Model time to prefill `new_tokens` after `cached_tokens` (of which some were
        loaded back from the host or from disk); `overhead`: with the per-request overhead
        (a chunked prefill's later chunks come without it)."""
        total = cached_tokens + new_tokens
        attention = self.prefill_us_per_token_sq * (total * total - cached_tokens * cached_tokens)
        micros = (
            self.prefill_us_per_token * new_tokens
            + attention
            + self.host_load_us_per_token * host_tokens
            + self.disk_load_us_per_token * disk_tokens
        )
        return (self.request_overhead_ms / 1e3 if overhead else 0.0) + micros / 1e6

    def decode_step_seconds(self, batch_size: int) -> float:
        """Model time of one decode step producing one token for each of `batch_size` requests."""
        if batch_size <= 0:
            return 0.0
        return (self.decode_ms_per_token + self.decode_ms_per_seq * batch_size) / 1e3

    def to_wall(self, model_seconds: float) -> float:
        return model_seconds / self.time_scale
