"""What discovery knows about an engine pod, and how a pod list is parsed."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import ConfigError

ENGINES = ("vllm", "sglang")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
_ZMQ = re.compile(r"(tcp://[^\s]+:\d+|ipc://\S+)")
_HTTP = re.compile(r"https?://[^\s/]+/?")
_KEYS = frozenset(
    ("name", "url", "model", "engine", "events", "replay", "topic", "events_bind", "loras",
     "lora_ids", "ready")
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Pod:
    """An engine pod the gateway may route to."""

    name: str
    url: str
    """Base URL of the engine's HTTP API (no trailing slash)."""
    model: str
    engine: str = "vllm"
    events: str | None = None
    """ZMQ endpoint of its KV event PUB socket; None: it publishes no events."""
    replay: str | None = None
    topic: str = ""
    events_bind: bool = False
    """The gateway binds `events` and the engine connects to it."""
    loras: tuple[str, ...] = ()
    lora_ids: Mapping[int, str] = field(default_factory=dict)
    """Engine LoRA ids -> names, for events that carry only `lora_id`."""
    ready: bool = True
    """False while the pod is not Ready (Kubernetes) or is draining."""

    def serves(self, model: str) -> bool:
        return model == self.model or model in self.loras


def parse_pods(document: Any, *, source: str) -> list[Pod]:
    """Validate a pod list (`{"pods": [...]}` or a bare list) into `Pod`s.

    Errors name the source, the pod and the field: a bad file must be fixable from the
    message alone.
    """
    items = document.get("pods") if isinstance(document, Mapping) else document
    if not isinstance(items, list):
        raise ConfigError(source, type(document).__name__, 'a list of pods or {"pods": [...]}')
    pods: list[Pod] = []
    seen: set[str] = set()
    for position, item in enumerate(items):
        where = f"{source}: pods[{position}]"
        if not isinstance(item, Mapping):
            raise ConfigError(where, item, "an object with name, url and model")
        pod = _parse_pod(item, where)
        if pod.name in seen:
            raise ConfigError(f"{where}.name", pod.name, "a name no other pod has")
        seen.add(pod.name)
        pods.append(pod)
    return pods


def _parse_pod(item: Mapping[str, Any], where: str) -> Pod:
    def text(key: str, pattern: re.Pattern[str] | None, allowed: str, *, required: bool) -> Any:
        value = item.get(key)
        if value is None:
            if required:
                raise ConfigError(f"{where}.{key}", None, allowed)
            return None
        if not isinstance(value, str) or (pattern is not None and not pattern.fullmatch(value)):
            raise ConfigError(f"{where}.{key}", value, allowed)
        return value

    name = text("name", _NAME, "a pod name (letters, digits, . _ -)", required=True)
    unknown = sorted(set(item) - _KEYS)
    if unknown:
        raise ConfigError(
            f"{where}.{unknown[0]}", item[unknown[0]], "one of " + ", ".join(sorted(_KEYS))
        )
    url = text("url", _HTTP, "an http(s)://host[:port] URL", required=True).rstrip("/")
    model = text("model", None, "a model name", required=True)
    engine = text("engine", re.compile("|".join(ENGINES)), "vllm or sglang", required=False)
    events = text("events", _ZMQ, "a ZMQ endpoint (tcp://host:port)", required=False)
    replay = text("replay", _ZMQ, "a ZMQ endpoint (tcp://host:port)", required=False)
    topic = text("topic", None, "a topic string", required=False)
    loras = item.get("loras", [])
    if not isinstance(loras, list) or not all(isinstance(x, str) and x for x in loras):
        raise ConfigError(f"{where}.loras", loras, "a list of LoRA adapter names")
    raw_ids = item.get("lora_ids", {})
    if not isinstance(raw_ids, Mapping):
        raise ConfigError(f"{where}.lora_ids", raw_ids, 'an object {"<id>": "<name>"}')
    try:
        lora_ids = {int(key): str(value) for key, value in raw_ids.items()}
    except ValueError:
        raise ConfigError(f"{where}.lora_ids", raw_ids, "integer ids mapped to names") from None
    bind = item.get("events_bind", False)
    if not isinstance(bind, bool):
        raise ConfigError(f"{where}.events_bind", bind, "true or false")
    ready = item.get("ready", True)
    if not isinstance(ready, bool):
        raise ConfigError(f"{where}.ready", ready, "true or false (false drains the pod)")
    if replay is not None and events is None:
        raise ConfigError(f"{where}.replay", replay, "set only together with events")
    return Pod(
        name=name,
        url=url,
        model=model,
        engine=engine or "vllm",
        events=events,
        replay=replay,
        topic=topic or "",
        events_bind=bind,
        loras=tuple(loras),
        lora_ids=lora_ids,
        ready=ready,
    )
