"""`kvgate bench joiners`: prediction lines, as the gateway writes them, split by engine
step."""

from __future__ import annotations

import gzip
import io
import logging
import random
import subprocess
import sys
from pathlib import Path

import pytest

from bench.routing.joiners import DECISION_INPUTS, Answer, answers_of, split_by_step, summarize
from gateway.observability.logs import JsonFormatter
from gateway.routing.router import log_prediction, prediction_logger
from predictor import Predictor


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _lines(sends: list[tuple[str, int, float, float]]) -> list[str]:
    """Prediction lines of the gateway's own making: (pod, uncached tokens, sent at,
    first byte at) per request, through the cost model and the JSON formatter."""
    clock = Clock()
    cost = Predictor(clock=clock)
    tickets = []
    for pod, tokens, sent, _ in sends:
        clock.now = sent
        prediction = cost.predict(pod, tokens, 0.0)
        tickets.append(cost.start(prediction, streamed=True))
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    prediction_logger.addHandler(handler)
    level = prediction_logger.level
    prediction_logger.setLevel(logging.INFO)
    try:
        for ticket, (_, _, sent, first_byte) in zip(tickets, sends, strict=True):
            log_prediction(ticket, first_byte - sent)
    finally:
        prediction_logger.removeHandler(handler)
        prediction_logger.setLevel(level)
    return [*stream.getvalue().splitlines(), '{"logger": "kvgate.access"}', "not json"]


def test_a_request_sent_later_into_the_same_step_is_a_joiner() -> None:
    answers = answers_of(_lines([
        ("a", 400, 0.00, 0.300),   # waits for a's next step...
        ("a", 200, 0.10, 0.301),   # ...and is joined there by this one
        ("a", 300, 0.40, 0.700),   # a later step of a: alone
        ("b", 500, 0.05, 0.250),   # another pod
    ]))  # fmt: skip
    assert len(answers) == 4 and {a.pod for a in answers} == {"a", "b"}
    assert answers[0].observed_s == pytest.approx(0.3) and answers[0].predicted_s > 0
    assert all(a.prefill_s_per_token > 0 for a in answers)
    joined = {round(j.answer.sent_s, 3): j for j in split_by_step(answers)}
    first = joined[0.0]
    assert first.joiners == 1 and first.joiner_tokens == pytest.approx(200, abs=1)
    assert first.joiner_prefill_s == pytest.approx(200 * answers[0].prefill_s_per_token, rel=0.01)
    assert all(j.joiners == 0 for j in joined.values() if j is not first)
    summary = summarize(list(joined.values()))
    assert summary["answers"] == 4
    assert summary["joined"]["share"] == 0.25 and summary["not_joined"]["share"] == 0.75
    # without its joiner's prefill the joined answer is closer to its prediction
    assert summary["all_without_joiners_prefill"]["signed_p90"] < summary["all"]["signed_p90"]
    # every line carries what its decision knew, for the fits in hindsight
    assert all(len(a.inputs) == len(DECISION_INPUTS) for a in answers)
    assert answers[0].inputs[0] == pytest.approx(answers[0].predicted_s * 1e3)


def test_hindsight_fits_bound_what_the_decision_inputs_and_the_joiners_explain() -> None:
    """Pods whose TTFT is exactly linear in what the decision knew, plus a joiner's
    prefill in every third step: the fit of the decision's inputs cannot explain the
    joiners; given them too it explains everything."""
    rng = random.Random(7)
    answers = []
    for step in range(300):
        pod, sent = f"p{step % 3}", step * 1.0
        own, decoding, remaining = rng.uniform(100, 900), rng.uniform(0, 30), rng.uniform(0.01, 0.1)
        ttft = 0.02 + 0.0002 * own + 0.001 * decoding + remaining
        joiner = 500.0 if step % 3 == 0 else 0.0
        predicted_ms = ttft * 1e3 * rng.uniform(0.9, 1.1)  # the gateway's own, a bit off
        inputs = (predicted_ms, own, 0.0, 0.0, decoding, 1.0, remaining * 1e3, 0.0, 1.0)
        answers.append(Answer(pod, sent, ttft + 0.0002 * joiner, predicted_ms / 1e3, own,
                              0.0002, inputs))  # fmt: skip
        if joiner:  # sent 10 ms after it, its first byte in the same step: its own TTFT is
            # as linear in what its decision knew (the first one queued, 10 ms less to wait)
            late = (100.0, joiner, own, 0.0, decoding, 1.0, remaining * 1e3 - 10, 0.0, 1.0)
            answers.append(Answer(pod, sent + 0.01, ttft + 0.0002 * joiner - 0.01, 0.1,
                                  joiner, 0.0002, late))  # fmt: skip
    summary = summarize(split_by_step(answers))
    assert summary["hindsight_decision_inputs"]["abs_p90"] > 0.15
    assert summary["hindsight_with_joiners"]["abs_p90"] < 0.01
    # lines of an older gateway, without the inputs: no fit, the rest as before
    bare = summarize(split_by_step([replace_inputs(a) for a in answers]))
    assert "hindsight_decision_inputs" not in bare and bare["joined"]["share"] > 0


def replace_inputs(answer: Answer) -> Answer:
    return Answer(answer.pod, answer.sent_s, answer.observed_s, answer.predicted_s,
                  answer.own_tokens, answer.prefill_s_per_token)  # fmt: skip


def test_steps_are_told_apart_by_the_gap() -> None:
    answers = [
        Answer("p", sent_s=0.0, observed_s=0.30, predicted_s=0.3, own_tokens=10,
               prefill_s_per_token=0.001),
        Answer("p", sent_s=0.1, observed_s=0.21, predicted_s=0.2, own_tokens=10,
               prefill_s_per_token=0.001),
    ]  # fmt: skip
    assert [j.joiners for j in split_by_step(answers, gap_s=0.004)] == [0, 0]  # 10 ms apart
    assert sorted(j.joiners for j in split_by_step(answers, gap_s=0.02)) == [0, 1]


def test_the_command_reads_a_compressed_log(tmp_path: Path) -> None:
    log = tmp_path / "gateway.log.gz"
    lines = _lines([("a", 400, 0.0, 0.3), ("a", 200, 0.1, 0.301)])
    with gzip.open(log, "wt", encoding="utf-8") as out:
        out.write("\n".join(lines) + "\n")
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "bench", "joiners", str(log),
         "--json", str(tmp_path / "j.json")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "joined by a later request" in result.stdout and "50%" in result.stdout
    assert (tmp_path / "j.json").exists()
    empty = tmp_path / "empty.log"
    empty.write_text("nothing here\n")
    nothing = subprocess.run([sys.executable, "-m", "gateway.cli", "bench", "joiners",
                              str(empty)], capture_output=True, text=True, check=False)  # fmt: skip
    assert nothing.returncode == 1 and "no kvgate.predictions lines" in nothing.stdout
    missing = subprocess.run([sys.executable, "-m", "gateway.cli", "bench", "joiners",
                              str(tmp_path / "absent.log")], capture_output=True, text=True,
                             check=False)  # fmt: skip
    assert missing.returncode == 2 and "cannot read" in missing.stdout
    assert "Traceback" not in missing.stderr
