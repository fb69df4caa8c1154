"""One record per client request, whichever benchmark sent it."""

from __future__ import annotations

from dataclasses import dataclass

from bench.harness.streaming import ChatAnswer


@dataclass(frozen=True, slots=True)
class RequestRecord:
    started: float
    ended: float
    status: int | None
    """None: no HTTP status came back."""
    error: str | None
    """None when the request got a complete answer."""
    pod: str | None = None
    """The pod that served it (`x-kvgate-pod`), when the router says."""
    stream: bool = True
    conversation: str = ""
    tag: str = ""
    turn: int = 0
    ttft_s: float | None = None
    """Seconds from sending the request to the first generated text."""
    itl_s: float | None = None
    chunks: int = 0
    """Chunks that carried generated text."""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    predicted_ttft_s: float | None = None
    """kvgate's prediction for the pod that served (`x-kvgate-predicted-ttft-ms`), if any."""
    router_url: str = ""
    """Which router (gateway replica) the request was sent to, when there are several."""

    @property
    def e2e_s(self) -> float:
        """Seconds from sending the request to the end of the answer."""
        return self.ended - self.started

    @classmethod
    def of(
        cls,
        answer: ChatAnswer,
        *,
        error: str | None,
        stream: bool = True,
        conversation: str = "",
        tag: str = "",
        turn: int = 0,
        router_url: str = "",
    ) -> RequestRecord:
        """The record of `answer`, with `error` as the benchmark classes failures."""
        return cls(
            started=answer.started,
            ended=answer.ended,
            status=answer.status,
            error=error,
            pod=answer.headers.get("x-kvgate-pod"),
            stream=stream,
            conversation=conversation,
            tag=tag,
            turn=turn,
            ttft_s=answer.ttft_s,
            itl_s=answer.itl_s,
            chunks=len(answer.token_times),
            prompt_tokens=answer.usage_int("prompt_tokens"),
            cached_tokens=answer.cached_tokens,
            completion_tokens=answer.usage_int("completion_tokens"),
            predicted_ttft_s=_seconds(answer.headers.get("x-kvgate-predicted-ttft-ms")),
            router_url=router_url,
        )


def _seconds(milliseconds: str | None) -> float | None:
    try:
        return float(milliseconds) / 1e3 if milliseconds is not None else None
    except ValueError:
        return None
