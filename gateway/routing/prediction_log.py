"""The prediction log (`KVGATE_PREDICTION_LOG`): one `kvgate.predictions` line per streamed
answer the predictor learns from."""

from __future__ import annotations

import logging
from typing import Any

from gateway.observability.logs import ACCESS_FIELDS
from predictor import Ticket

prediction_logger = logging.getLogger("kvgate.predictions")


def log_prediction(ticket: Ticket, observed_s: float) -> None:
    """One `kvgate.predictions` line: what the cost model predicted for this answer, term
    by term, and what was observed. JSON lines carry every figure as a field."""
    prediction = ticket.prediction
    terms = prediction.terms()
    fields: dict[str, Any] = {
        "ticket": ticket.number,
        "sent_s": round(ticket.started, 6),
        "predicted_ms": round(prediction.ttft_s * 1e3, 3),
        "observed_ms": round(observed_s * 1e3, 3),
        "own_tokens": round(prediction.own_tokens, 1),
        "queued_tokens": round(prediction.queued_tokens, 1),
        "queued_requests": round(prediction.queued_requests, 2),
        "decoding": round(prediction.decoding, 2),
        "busy": prediction.busy,
        "step_remaining_ms": round(prediction.step_remaining_s * 1e3, 3),
        "in_step_tokens": round(prediction.in_step_tokens, 1),
        "speed": round(prediction.speed, 4),
        "terms_ms": {name: round(value * 1e3, 3) for name, value in terms.items()},
    }
    shares = " ".join(f"{name}={value * 1e3:.1f}" for name, value in terms.items())
    prediction_logger.info(
        "TTFT predicted %.1f ms, observed %.1f ms (terms, ms: %s)",
        prediction.ttft_s * 1e3, observed_s * 1e3, shares,
        extra={ACCESS_FIELDS: fields, "pod": ticket.pod},
    )  # fmt: skip
