"""The chat workload generator: deterministic per seed, and shaped like multi-turn chat."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench.workloads.chat import ChatWorkloadConfig, generate

SMALL = ChatWorkloadConfig(sessions=6, turns=4, system_prompts=2, system_words=64, seed=7)


def test_same_seed_gives_the_same_workload() -> None:
    assert generate(SMALL) == generate(replace(SMALL))


def test_different_seeds_give_different_workloads() -> None:
    other = replace(SMALL, seed=8)
    assert generate(SMALL).sessions != generate(other).sessions
    assert generate(SMALL).system_prompts != generate(other).system_prompts


def test_sessions_share_a_few_system_prompts() -> None:
    workload = generate(ChatWorkloadConfig(sessions=40, turns=2, system_prompts=3, seed=1))
    assert len(workload.system_prompts) == 3
    assert len(set(workload.system_prompts)) == 3
    used = [session.system for session in workload.sessions]
    assert set(used) == {0, 1, 2}
    assert all(len(p.split()) == workload.config.system_words for p in workload.system_prompts)
    # No two system prompts share their first block: distinct openings.
    assert len({p[:40] for p in workload.system_prompts}) == 3


def test_each_turn_extends_the_previous_prompt() -> None:
    workload = generate(SMALL)
    session = workload.sessions[0]
    answers = [f"answer {i}" for i in range(len(session.turns))]
    previous = workload.messages(session, 0, [])
    assert previous[0] == {"role": "system", "content": workload.system_prompts[session.system]}
    for turn in range(1, len(session.turns)):
        messages = workload.messages(session, turn, answers[:turn])
        assert messages[: len(previous)] == previous
        assert messages[len(previous)] == {"role": "assistant", "content": answers[turn - 1]}
        assert messages[-1] == {"role": "user", "content": session.turns[turn].user}
        assert len(messages) == len(previous) + 2
        previous = messages
    with pytest.raises(ValueError, match="earlier answers"):
        workload.messages(session, 2, answers[:1])


def test_sizes_and_times_follow_the_config() -> None:
    config = ChatWorkloadConfig(sessions=30, turns=5, user_words_max=50, answer_tokens_max=20)
    workload = generate(config)
    assert workload.requests == 150
    turns = [turn for session in workload.sessions for turn in session.turns]
    assert all(1 <= len(turn.user.split()) <= 50 for turn in turns)
    assert all(1 <= turn.max_tokens <= 20 for turn in turns)
    assert all(turn.think_s >= 0 for turn in turns)
    assert len({turn.user for turn in turns}) == len(turns)  # every user message is new
    assert all(0 <= s.start_s <= config.start_spread_s for s in workload.sessions)
    assert len({s.session_id for s in workload.sessions}) == 30
    assert workload.longest_request_tokens() < workload.working_set_tokens()


def test_invalid_config_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="sessions"):
        ChatWorkloadConfig(sessions=0)
    with pytest.raises(ValueError, match="think_s_mean"):
        ChatWorkloadConfig(think_s_mean=-1.0)
