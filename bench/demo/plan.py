"""What the demo runs: the workload, the engines' cache size and the time scale.

The engines' GPU caches are sized from the workload: the whole fleet holds the working set
(every system prompt once plus every session's own context), so one engine holds
1 / engines of it. Round-robin spreads each conversation over every engine, so each engine
would need the whole working set; prefix-cache keeps a conversation where its prefix is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bench.workloads.chat import ChatWorkload, ChatWorkloadConfig, generate

BLOCK_SIZE = 16


@dataclass(frozen=True, slots=True)
class DemoPlan:
    engines: int
    time_scale: float
    workload_config: ChatWorkloadConfig
    max_batch: int = 32

    def workload(self) -> ChatWorkload:
        return generate(self.workload_config)

    def gpu_blocks(self, workload: ChatWorkload) -> int:
        per_engine = math.ceil(workload.working_set_tokens() / self.engines / BLOCK_SIZE)
        # Room for at least two of the longest requests at once, whatever the split.
        floor = 2 * math.ceil(workload.longest_request_tokens() / BLOCK_SIZE) + 8
        return max(per_engine, floor)


def make_plan(
    *,
    engines: int,
    sessions: int | None,
    turns: int | None,
    time_scale: float | None,
    seed: int,
    quick: bool,
) -> DemoPlan:
    if quick:  # seconds, for tests: a few short conversations
        config = ChatWorkloadConfig(
            sessions=sessions or 4, turns=turns or 3, system_prompts=2, system_words=256,
            user_words_median=40, answer_tokens_median=8, answer_tokens_max=16,
            think_s_mean=0.5, start_spread_s=0.5, seed=seed,
        )  # fmt: skip
        return DemoPlan(engines, time_scale or 20.0, config)
    config = ChatWorkloadConfig(
        sessions=sessions or 24, turns=turns or 10, system_prompts=4, system_words=1536,
        user_words_median=250, answer_tokens_median=48, think_s_mean=2.0, seed=seed,
    )  # fmt: skip
    return DemoPlan(engines, time_scale or 2.0, config)
