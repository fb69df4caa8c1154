"""`kvgate bench joiners LOG`: where a gateway's TTFT prediction error comes from, from its
`kvgate.predictions` lines (`KVGATE_PREDICTION_LOG=true`, `KVGATE_LOG_FORMAT=json`).

An engine admits every request waiting at the end of a step into the next one, and a
request's first token leaves at the end of the step that prefilled it. So requests whose
first bytes reached the gateway from one pod within `--gap` of each other shared a step,
and a request sent *after* one of them — a joiner — lengthened that step with its own
prefill. No decision-time prediction knows a joiner. This splits the answers into joined
and not joined, gives each group's |observed − predicted| / observed, and the error left
once each answer's joiners' prefill (their uncached tokens at the pod's learned price per
token) is taken out of its observed TTFT: what no routing-time model can remove.

It also bounds what any decision-time model could do on these very answers: a least-squares
fit in hindsight (relative to each observed TTFT, in-sample, so optimistic) of the observed
TTFT on everything the decision knew — the gateway's own prediction, its inputs, the pod's
speed, their squares and products — against the same fit given each answer's actual
joiners too. What the first leaves is error no model of the decision's inputs removes.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.results_io import percentile, write_json

LOGGER = "kvgate.predictions"
DEFAULT_GAP_S = 0.004
DECISION_INPUTS = (
    "predicted_ms", "own_tokens", "queued_tokens", "queued_requests", "decoding", "busy",
    "step_remaining_ms", "in_step_tokens", "speed",
)  # fmt: skip
"""A prediction line's fields that a decision knew, in `Answer.inputs` order."""
_RIDGE = 1e-9


@dataclass(frozen=True, slots=True)
class Answer:
    """One learned answer, as its prediction line gives it (seconds, tokens)."""

    pod: str
    sent_s: float
    observed_s: float
    predicted_s: float
    own_tokens: float
    prefill_s_per_token: float
    """The pod's price of one uncached token in this prediction (0: not known)."""
    inputs: tuple[float, ...] = ()
    """What the decision knew (`DECISION_INPUTS`; empty for lines without them)."""

    @property
    def first_byte_s(self) -> float:
        return self.sent_s + self.observed_s

    @property
    def error(self) -> float:
        """(observed − predicted) / observed: > 0 when the answer came later than predicted."""
        return (self.observed_s - self.predicted_s) / self.observed_s


def answers_of(lines: Iterable[str]) -> list[Answer]:
    """The answers of a gateway's JSON log lines (every other line is skipped)."""
    answers = []
    for line in lines:
        if LOGGER not in line:
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("logger") != LOGGER or not entry.get("observed_ms"):
            continue
        prefill_tokens = entry["own_tokens"] + entry["queued_tokens"]
        prefill_ms = entry["terms_ms"]["prefill_tokens"]
        answers.append(
            Answer(
                pod=entry["pod"],
                sent_s=entry["sent_s"],
                observed_s=entry["observed_ms"] / 1e3,
                predicted_s=entry["predicted_ms"] / 1e3,
                own_tokens=entry["own_tokens"],
                prefill_s_per_token=prefill_ms / 1e3 / prefill_tokens if prefill_tokens else 0.0,
                inputs=tuple(float(entry.get(name, 0.0)) for name in DECISION_INPUTS),
            )
        )
    return answers


@dataclass(frozen=True, slots=True)
class Joined:
    answer: Answer
    joiners: int
    """Requests sent after it whose first byte came in its step."""
    joiner_tokens: float
    joiner_prefill_s: float
    """The joiners' uncached tokens at this answer's pod's price per token."""


def split_by_step(answers: Sequence[Answer], gap_s: float = DEFAULT_GAP_S) -> list[Joined]:
    """Each answer with the joiners of its step (first bytes on its pod within `gap_s` of
    one another are one step)."""
    by_pod: dict[str, list[Answer]] = defaultdict(list)
    for answer in answers:
        by_pod[answer.pod].append(answer)
    joined: list[Joined] = []
    for pod_answers in by_pod.values():
        pod_answers.sort(key=lambda a: a.first_byte_s)
        prices = [a.prefill_s_per_token for a in pod_answers if a.prefill_s_per_token > 0]
        typical = statistics.median(prices) if prices else 0.0
        steps: list[list[Answer]] = []
        for answer in pod_answers:
            if steps and answer.first_byte_s - steps[-1][-1].first_byte_s < gap_s:
                steps[-1].append(answer)
            else:
                steps.append([answer])
        for step in steps:
            for each in step:
                later = [other for other in step if other.sent_s > each.sent_s]
                tokens = sum(other.own_tokens for other in later)
                price = each.prefill_s_per_token or typical
                joined.append(Joined(each, len(later), tokens, tokens * price))
    return joined


def _errors(values: Sequence[float]) -> dict[str, float]:
    magnitudes = [abs(v) for v in values]
    return {
        "abs_p50": percentile(magnitudes, 50),
        "abs_p90": percentile(magnitudes, 90),
        "signed_p10": percentile(values, 10),
        "signed_p50": percentile(values, 50),
        "signed_p90": percentile(values, 90),
    }


def summarize(joined: Sequence[Joined]) -> dict[str, Any]:
    """Shares and relative errors of the joined, the not joined and all answers, and of
    all answers with their joiners' prefill taken out of the observed TTFT."""
    if not joined:
        return {"answers": 0}
    groups = {
        "joined": [j for j in joined if j.joiners],
        "not_joined": [j for j in joined if not j.joiners],
        "all": list(joined),
    }
    summary: dict[str, Any] = {"answers": len(joined)}
    for name, group in groups.items():
        summary[name] = {
            "share": len(group) / len(joined),
            **(_errors([j.answer.error for j in group]) if group else {}),
        }
    without = []
    for j in joined:
        observed = max(j.answer.observed_s - j.joiner_prefill_s, 1e-9)
        without.append((observed - j.answer.predicted_s) / observed)
    summary["all_without_joiners_prefill"] = _errors(without)
    if all(j.answer.inputs for j in joined):
        summary["hindsight_decision_inputs"] = _errors(_hindsight_errors(joined, False))
        summary["hindsight_with_joiners"] = _errors(_hindsight_errors(joined, True))
    return summary


def _design_row(j: Joined, with_joiners: bool) -> list[float]:
    """One answer's regressors: the decision's inputs, the pod's speed times the work
    terms (a slow pod takes longer for each), a few squares and products (curvature), and
    with `with_joiners`, its actual joiners' tokens and count."""
    predicted, own, queued, requests, decoding, busy, remaining, in_step, speed = j.answer.inputs
    tokens = own + queued
    row = [
        1.0, predicted, tokens, requests, decoding, busy, remaining, in_step, speed,
        tokens * speed, decoding * speed, in_step * speed, remaining * remaining,
        tokens * tokens, tokens * decoding, predicted * predicted,
    ]  # fmt: skip
    if with_joiners:
        row += [j.joiner_tokens, j.joiner_tokens * speed, float(j.joiners)]
    return row


def _hindsight_errors(joined: Sequence[Joined], with_joiners: bool) -> list[float]:
    """Each answer's relative error under the least-squares fit, in hindsight, of all the
    observed TTFTs (each row divided by its TTFT: the fit minimises the relative error)."""
    rows = [_design_row(j, with_joiners) for j in joined]
    observed = [j.answer.observed_s for j in joined]
    n = len(rows[0])
    # Columns scaled to unit RMS so that one solve serves tokens² and a 0/1 flag alike.
    scales = [
        math.sqrt(sum((row[c] / o) ** 2 for row, o in zip(rows, observed, strict=True))
                  / len(rows)) or 1.0
        for c in range(n)
    ]  # fmt: skip
    gram = [[0.0] * n for _ in range(n)]
    target = [0.0] * n
    for row, o in zip(rows, observed, strict=True):
        x = [row[c] / o / scales[c] for c in range(n)]
        for a in range(n):
            target[a] += x[a]  # the observed TTFT over itself: 1
            for b in range(a, n):
                gram[a][b] += x[a] * x[b]
    for a in range(n):
        gram[a][a] += _RIDGE * len(rows)
        for b in range(a):
            gram[a][b] = gram[b][a]
    beta = _solve(gram, target)
    fitted = (sum(beta[c] * row[c] / scales[c] for c in range(n)) for row in rows)
    return [(o - f) / o for o, f in zip(observed, fitted, strict=True)]


def _solve(matrix: list[list[float]], vector: list[float]) -> list[float]:
    """x with matrix · x = vector (Gaussian elimination, partial pivoting; the matrix is a
    ridged Gram matrix, so never singular)."""
    n = len(vector)
    rows = [[*matrix[i], vector[i]] for i in range(n)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(rows[r][col]))
        rows[col], rows[pivot] = rows[pivot], rows[col]
        for r in range(col + 1, n):
            factor = rows[r][col] / rows[col][col]
            for c in range(col, n + 1):
                rows[r][c] -= factor * rows[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (rows[r][n] - sum(rows[r][c] * x[c] for c in range(r + 1, n))) / rows[r][r]
    return x


def _read(path: Path) -> list[str]:
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as stream:
            return stream.readlines()
    return path.read_text(encoding="utf-8").splitlines()


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("log", type=Path, help="a gateway's JSON log (or .gz) with its "
                        "kvgate.predictions lines (KVGATE_PREDICTION_LOG=true)")  # fmt: skip
    parser.add_argument(
        "--gap", type=float, default=DEFAULT_GAP_S * 1e3, metavar="MS",
        help="first bytes on one pod closer than this share a step (4 ms)",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")


def run(args: argparse.Namespace) -> int:
    try:
        lines = _read(args.log)
    except (OSError, EOFError, UnicodeDecodeError) as error:
        print(f"cannot read {args.log}: {error}")
        return 2
    answers = answers_of(lines)
    if not answers:
        print(f"no {LOGGER} lines in {args.log} (KVGATE_PREDICTION_LOG=true, json format)")
        return 1
    summary = summarize(split_by_step(answers, args.gap / 1e3))
    print(f"{summary['answers']} answers in {args.log}; relative error (observed − predicted)"
          " / observed")  # fmt: skip
    print(f"{'':42} {'share':>6} {'|err| p50':>10} {'p90':>6} {'signed p10':>11} {'p50':>6} "
          f"{'p90':>6}")  # fmt: skip
    rows = [
        ("joined by a later request", "joined"),
        ("not joined", "not_joined"),
        ("all", "all"),
        ("all, joiners' prefill taken out", "all_without_joiners_prefill"),
        ("best fit in hindsight, decision's inputs", "hindsight_decision_inputs"),
        ("the same, plus its actual joiners", "hindsight_with_joiners"),
    ]
    for label, key in rows:
        if key not in summary:
            continue
        figures = summary[key]
        share = f"{figures['share']:.0%}" if "share" in figures else ""
        if "abs_p50" not in figures:
            print(f"{label:42} {share:>6}")
            continue
        print(f"{label:42} {share:>6} {figures['abs_p50']:>10.2f} {figures['abs_p90']:>6.2f} "
              f"{figures['signed_p10']:>+11.2f} {figures['signed_p50']:>+6.2f} "
              f"{figures['signed_p90']:>+6.2f}")  # fmt: skip
    if args.json is not None:
        write_json(args.json, {"log": str(args.log), "gap_ms": args.gap, **summary})
        print(f"JSON written to {args.json}")
    return 0
