"""The latency model through the scheduler, on a virtual clock (model time, not wall time)."""

from __future__ import annotations

import random

import pytest

from simulator import LatencyModel, PagedPrefixCache, RecordingSink, Tier
from simulator.block_hash import BlockHasher
from simulator.scheduler import Scheduler, SimRequest


class VirtualTime:
    """A clock that only moves when the scheduler sleeps."""

    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


def make_scheduler(
    max_batch: int = 8, gpu_blocks: int = 512, max_batched_tokens: int = 8192
) -> tuple[Scheduler, VirtualTime]:
    time = VirtualTime()
    cache = PagedPrefixCache(BlockHasher(16), RecordingSink(), gpu_blocks=gpu_blocks)

    async def nothing() -> None:
        return None

    scheduler = Scheduler(
        cache,
        LatencyModel(),
        max_batch=max_batch,
        max_batched_tokens=max_batched_tokens,
        on_step_end=nothing,
        clock=time.clock,
        sleep=time.sleep,
    )
    return scheduler, time


def request(name: str, prompt: list[int], max_tokens: int = 4) -> SimRequest:
    return SimRequest(name, prompt, max_tokens, random.Random(0), (300, 301))


async def drain(scheduler: Scheduler) -> None:
    for _ in range(10_000):
        if not await scheduler.step():
            return
    raise AssertionError("scheduler did not go idle")


def ttft(req: SimRequest) -> float:
    assert req.first_token_at is not None
    return req.first_token_at - req.arrival


async def test_cached_prefix_makes_ttft_smaller() -> None:
    scheduler, _ = make_scheduler()
    prompt = list(range(1000, 4000))
    cold = request("cold", prompt)
    scheduler.submit(cold)
    await drain(scheduler)
    warm = request("warm", [*prompt[:2900], *range(9000, 9100)])
    scheduler.submit(warm)
    await drain(scheduler)
    assert warm.cached_tokens == 2896  # 181 full blocks of 16
    assert ttft(warm) < ttft(cold) / 3
    assert scheduler.prefill_cost(warm, warm.alloc) < scheduler.prefill_cost(cold, cold.alloc)  # type: ignore[arg-type]


async def test_the_step_budget_counts_uncached_tokens_as_vllm_does() -> None:
    """vLLM's token budget counts what a step computes: a running request's decode token,
    a prompt's uncached tokens. A long prompt that is mostly cached joins a step whose
    budget its whole length would exceed; one that is not waits for the next step."""
    scheduler, _ = make_scheduler(max_batched_tokens=1024)
    history = list(range(1000, 4000))
    scheduler.submit(request("earlier turn", history, max_tokens=1))
    await drain(scheduler)
    fresh = request("fresh", list(range(20_000, 20_600)))
    later = request("later turn", [*history, *range(9000, 9100)])
    uncached = request("uncached", list(range(30_000, 33_100)))
    for req in (fresh, later, uncached):
        scheduler.submit(req)
    steps_before = scheduler.stats.steps
    await scheduler.step()
    # 600 + (3100 - 2992 cached) tokens fit 1024; the uncached 3100 do not
    assert [r.request_id for r in scheduler.running] == ["fresh", "later turn"]
    assert later.cached_tokens == 2992
    assert uncached.alloc is None and list(scheduler.waiting) == [uncached]
    await drain(scheduler)
    assert uncached.first_token_at is not None and scheduler.stats.steps > steps_before + 1


async def test_longer_uncached_prompts_take_longer() -> None:
    scheduler, _ = make_scheduler()
    short, long = request("s", list(range(500))), request("l", list(range(5000, 9000)))
    scheduler.submit(short)
    await drain(scheduler)
    scheduler.submit(long)
    await drain(scheduler)
    assert ttft(long) > ttft(short)


async def test_queueing_grows_ttft_when_the_batch_is_full() -> None:
    scheduler, _ = make_scheduler(max_batch=1)
    first, second = request("a", list(range(100))), request("b", list(range(200, 300)))
    scheduler.submit(first)
    scheduler.submit(second)
    await drain(scheduler)
    assert second.first_token_at is not None and first.first_token_at is not None
    assert second.first_token_at > first.first_token_at
    assert ttft(second) > ttft(first) + 3 * scheduler.latency.decode_step_seconds(1)
    assert [len(r.generated) for r in (first, second)] == [4, 4]


async def test_decode_steps_cost_more_with_a_bigger_batch() -> None:
    model = LatencyModel()
    assert model.decode_step_seconds(64) > model.decode_step_seconds(1) > 0
    assert LatencyModel(time_scale=10).to_wall(1.0) == 0.1


async def test_every_reference_is_released() -> None:
    scheduler, _ = make_scheduler(max_batch=3, gpu_blocks=64)
    requests = [request(str(i), list(range(i * 7, i * 7 + 150)), 20) for i in range(12)]
    for req in requests:
        scheduler.submit(req)
    await drain(scheduler)
    assert all(r.finished for r in requests)
    assert scheduler.cache.reserved == 0
    assert all(b.ref_count == 0 for b in scheduler.cache.resident(Tier.GPU))


async def test_a_prompt_beyond_the_step_budget_is_prefilled_in_chunks_while_others_decode() -> None:
    """vLLM's chunked prefill: a prompt whose uncached tokens exceed a step's budget is
    computed a budget at a time after the running requests' decode tokens, its full blocks
    stored as each chunk completes; its first token leaves with the last chunk, and the
    chunks cost what the prompt costs in one piece (plus the decode steps they share)."""
    scheduler, time = make_scheduler(max_batched_tokens=1024)
    decoder = request("decoder", list(range(100)), max_tokens=50)
    scheduler.submit(decoder)
    await scheduler.step()
    long = request("long", list(range(5000, 8000)))
    short = request("short", list(range(9000, 9100)))
    scheduler.submit(long)
    scheduler.submit(short)
    started, tokens_before = time.now, len(decoder.generated)
    await scheduler.step()
    assert long.prefilled == 1023  # the budget less the decoder's token
    assert len(scheduler.cache.match(long.prompt)) == 1023 // 16  # first chunk's full blocks
    assert long.first_token_at is None and short.alloc is None  # nothing joins a long prefill
    steps = 1
    while long.first_token_at is None:
        await scheduler.step()
        steps += 1
    assert steps == 3  # 1023 + 1023 + 954 tokens
    assert len(decoder.generated) - tokens_before == 3  # the stream kept its pace
    decode = scheduler.latency.decode_step_seconds(1)
    whole = scheduler.latency.prefill_seconds(3000)
    assert long.first_token_at - started == pytest.approx(whole + 3 * decode)
    await drain(scheduler)
    assert short.first_token_at is not None and short.first_token_at > long.first_token_at
    assert scheduler.cache.reserved == 0


async def test_a_prompt_within_the_budget_is_prefilled_in_one_step() -> None:
    scheduler, _ = make_scheduler(max_batched_tokens=4096)
    whole = request("whole", list(range(3000)))
    scheduler.submit(whole)
    await scheduler.step()
    assert whole.prefilled == 3000 and whole.first_token_at is not None
