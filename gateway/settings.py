"""The gateway's settings: environment variables (the seed's AIBRIX_* names, KVGATE_* for
the rest) overridden by command-line flags. Every invalid value stops start-up with the
variable, the value and what is allowed."""

from __future__ import annotations

import ipaddress
import logging
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from gateway.config_files import read_document
from gateway.control.discovery.poolspec import PoolRef
from gateway.control.replication.keys import (
    KEY_HELP,
    MAX_TRUSTED_KEYS,
    local_endpoint,
    z85_key,
    z85_keys,
)
from gateway.errors import ConfigError
from gateway.routing.config import builtin_names
from gateway.runtime import DEFAULT_GC_GEN0_THRESHOLD
from indexer import IndexConfig, IndexLimits, Tier
from predictor import CALIBRATED_CONTEXT_SHARE, CostParams

logger = logging.getLogger(__name__)

POLICIES = builtin_names()
"""The built-in policies (gateway/routing/policies.toml); a routing config may add more."""
AIBRIX_STRATEGIES = {
    "random": "random",
    "least-request": "least-request",
    "prefix-cache": "prefix-cache",
    "prefix-cache-and-load": "prefix-share",
    "least-kv-cache": "least-kv-cache",
    "least-gpu-cache": "least-kv-cache",
    "least-latency": "predicted-latency",
}
"""AIBrix's routing strategy names (`routing-strategy` header, `ROUTING_ALGORITHM`) that kvgate
has a counterpart for, and the policy each means here. AIBrix's `throughput` and
`least-busy-time` have none: they are refused, naming these."""
ENGINES = ("vllm", "sglang")
TOKENIZER_MODES = ("auto", "local", "remote")
DISCOVERIES = ("static", "kubernetes", "inference-pool")
LOG_FORMATS = ("text", "json")
DEFAULT_TIER_WEIGHTS = {Tier.GPU: 1.0, Tier.CPU: 0.8, Tier.STORAGE: 0.25, Tier.EXPECTED: 0.9}


def _one_of(choices: tuple[str, ...]) -> str:
    return "one of " + ", ".join(choices)


def _choice(choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        if raw not in choices:
            raise ValueError(raw)
        return raw

    return parse


def _bool(raw: str) -> bool:
    lowered = raw.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)


_MAX_INT = 2**31 - 1
"""Every integer setting's bound (a C int: what CPython's GC threshold takes; no count,
size or limit of the gateway's comes near it)."""
_POSITIVE_INT_HELP = f"an integer in 1..{_MAX_INT}"
_NON_NEGATIVE_INT_HELP = f"an integer in 0..{_MAX_INT}"


def _positive_int(raw: str) -> int:
    value = _integer(raw)
    if not 0 < value <= _MAX_INT:
        raise ValueError(raw)
    return value


def _non_negative_int(raw: str) -> int:
    value = _integer(raw)
    if not 0 <= value <= _MAX_INT:
        raise ValueError(raw)
    return value


def _retries(raw: str) -> int:
    value = _integer(raw)
    if not 0 <= value <= 10:
        raise ValueError(raw)
    return value


def _fraction(raw: str) -> float:
    value = float(raw)
    if not 0 < value <= 1:
        raise ValueError(raw)
    return value


def _port(raw: str) -> int:
    value = _integer(raw)
    if not 0 < value < 65536:
        raise ValueError(raw)
    return value


def _namespaces(raw: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in raw.split(",") if name.strip())
    if not all(re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", name) for name in names):
        raise ValueError(raw)
    return names


def _pool_ref(raw: str) -> str:
    return str(PoolRef.parse(raw))


def _networks(raw: str) -> tuple[str, ...]:
    """Comma-separated addresses or CIDR ranges, normalized (`10.0.0.0/8`, `fd00::/8`)."""
    return tuple(
        str(ipaddress.ip_network(part.strip(), strict=False))
        for part in raw.split(",")
        if part.strip()
    )


def _zmq_endpoint(raw: str) -> str:
    if not re.fullmatch(r"(tcp://[^\s:/]+:\d{1,5}|ipc://\S+)", raw):
        raise ValueError(raw)
    return raw


def _host_port(raw: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9.-]+:\d{1,5}", raw):
        raise ValueError(raw)
    return raw


def _zmq_endpoints(raw: str) -> tuple[str, ...]:
    return tuple(_zmq_endpoint(part.strip()) for part in raw.split(",") if part.strip())


def _url(raw: str) -> str:
    if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", raw):
        raise ValueError(raw)
    return raw.rstrip("/")


def _header(raw: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9-]+", raw):
        raise ValueError(raw)
    return raw.lower()


_MAX_DURATION_S = 7 * 24 * 3600.0
"""Every duration's bound (7 days): every timeout, interval and lease stays a finite time
the event loop can wait for."""
_DURATION_HELP = "a duration in (0, 7 days]: seconds (2.5) or Go-style (500ms, 30s, 1m30s, 2h)"
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0,
          "h": 3600.0}  # fmt: skip
_GO_TERM = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def _duration(raw: str) -> float:
    """Seconds from a number (`2.5`) or a Go duration: `500ms`, `30s`, `1m30s`, `2h45m`,
    `1.5h` (AIBrix's gateway, written in Go, takes Go durations)."""
    if re.fullmatch(r"\d+(?:\.\d+)?", raw):
        value = float(raw)
    else:
        terms = list(_GO_TERM.finditer(raw))
        if not terms or "".join(match.group(0) for match in terms) != raw:
            raise ValueError(raw)
        value = sum(float(match.group(1)) * _UNITS[match.group(2)] for match in terms)
    if not 0 < value <= _MAX_DURATION_S:  # inf and nan too ("9" * 400 is inf)
        raise ValueError(raw)
    return value


def _duration_text(seconds: float) -> str:
    for unit, size in (("h", 3600.0), ("m", 60.0), ("s", 1.0)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds * 1000:g}ms"


def _bytes_text(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return str(size)


def _minutes_text(seconds: float) -> str:
    return f"{seconds / 60:g} min"


def _weights_text(weights: Mapping[Tier, float]) -> str:
    return ",".join(f"{tier.name}={weight:g}" for tier, weight in weights.items())


_WEIGHTS_HELP = "comma-separated TIER=WEIGHT with tiers GPU, CPU, STORAGE, EXPECTED (e.g. CPU=0.8)"


def _tokenizer_dirs(raw: str) -> dict[str, Path]:
    directories: dict[str, Path] = {}
    for item in raw.split(","):
        if not item.strip():
            continue
        model, separator, directory = item.partition("=")
        path = Path(directory.strip()).expanduser()
        if not separator or not model.strip() or not (path / "tokenizer.json").is_file():
            raise ValueError(raw)
        directories[model.strip()] = path
    return directories


def _tier_weights(raw: str) -> dict[Tier, float]:
    weights = dict(DEFAULT_TIER_WEIGHTS)
    for item in raw.split(","):
        name, _, value = item.partition("=")
        weight = float(value)
        tier = Tier.__members__.get(name.strip().upper())
        if tier is None or not 0 <= weight <= 1:
            raise ValueError(raw)
        weights[tier] = weight
    return weights


_PORT_HELP = "a TCP port in 1..65535"
_BOOL_HELP = "true or false"


def _integer(raw: str) -> int:
    """A plain decimal integer: `int()` alone would take `3_000` or other scripts' digits."""
    if not re.fullmatch(r"[+-]?[0-9]+", raw):
        raise ValueError(raw)
    return int(raw)


def _number_in(low: float, high: float, *, above: bool = False) -> Callable[[str], float]:
    """A parser of a finite number in [low, high] ((low, high] when `above`)."""

    def parse(raw: str) -> float:
        value = float(raw)
        if not ((low < value) if above else (low <= value)) or not value <= high:
            raise ValueError(raw)  # nan and inf too
        return value

    return parse


_seconds = _number_in(0.0, _MAX_DURATION_S, above=True)
_SECONDS_HELP = "a number of seconds in (0, 604800] (7 days)"
_minutes_only = _number_in(0.0, _MAX_DURATION_S / 60.0, above=True)


def _minutes(raw: str) -> float:
    return _minutes_only(raw) * 60.0


def _hash_seed(raw: str) -> int:
    value = int(raw, 0)
    if not 0 <= value < 2**64:
        raise ValueError(raw)
    return value


@dataclass(frozen=True, slots=True)
class Alias:
    """Another name a setting is read from (an AIBrix name), when the setting's own is
    unset; `parse` and `allowed` when it spells values differently."""

    variable: str
    parse: Callable[[str], Any] | None = None
    allowed: str | None = None


@dataclass(frozen=True, slots=True)
class Declaration:
    """Everything said about one setting but its default, which is the field's."""

    variable: str
    parse: Callable[[str], Any]
    allowed: str
    meaning: str
    aliases: tuple[Alias, ...] = ()
    shown: Callable[[Any], str] | None = None
    """How docs/configuration.md shows the default when its Python value reads badly (16 MiB)."""
    secret: bool = False
    """Its value is never shown, not even in the error that refuses it."""

    def default_text(self, default: object) -> str:
        """The default as docs/configuration.md and `kvgate settings` show it."""
        if self.shown is not None and default is not None:
            return self.shown(default)
        if default is None or default == ():
            return "—"
        if isinstance(default, bool):
            return "true" if default else "false"
        if self.parse is _duration and isinstance(default, float):
            return _duration_text(default)
        if isinstance(default, float):
            return f"{default:g}"
        return str(default)

    def names(self) -> Iterator[tuple[str, Callable[[str], Any], str]]:
        """(variable, parser, allowed) for the setting's own name, then its aliases."""
        yield self.variable, self.parse, self.allowed
        for alias in self.aliases:
            yield alias.variable, alias.parse or self.parse, alias.allowed or self.allowed


_DECLARATION = "kvgate.setting"


def _setting(
    default: Any,
    variable: str,
    parse: Callable[[str], Any],
    allowed: str,
    meaning: str,
    *,
    aliases: tuple[Alias, ...] = (),
    shown: Callable[[Any], str] | None = None,
    factory: Callable[[], Any] | None = None,
    secret: bool = False,
) -> Any:
    """A Settings field and its one declaration: default, variable, parser, help."""
    declaration = Declaration(variable, parse, allowed, meaning, aliases, shown, secret)
    metadata = {_DECLARATION: declaration}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata, repr=not secret)
    return field(default=default, metadata=metadata, repr=not secret)


@dataclass(frozen=True, slots=True)
class Settings:
    """Every setting of `kvgate serve`, each declared once: its field carries the default,
    the variable it is read from (and AIBrix's name for it, if any), the parser, what is
    allowed and what it means. docs/configuration.md's table is generated from them
    (`kvgate settings --markdown`) and a test keeps the two equal."""

    host: str = _setting(
        "127.0.0.1", "KVGATE_HOST", str, "a host name or address", "address to listen on (`--host`)"
    )
    port: int = _setting(8080, "KVGATE_PORT", _port, _PORT_HELP, "the API's port (`--port`)")
    pods_file: Path | None = _setting(
        None, "KVGATE_PODS_FILE", Path, "a file path",
        "static discovery file, JSON or TOML, reloaded when it changes or on SIGHUP (`--pods`)",
    )  # fmt: skip
    discovery: str = _setting(
        "static", "KVGATE_DISCOVERY", _choice(DISCOVERIES), _one_of(DISCOVERIES),
        "where pods come from: `static` (the pods file), `kubernetes` (labelled pods) or "
        "`inference-pool` (a Gateway API InferencePool's pods, `KVGATE_INFERENCE_POOL`), "
        "both by the API: [docs/kubernetes.md](docs/kubernetes.md)",
    )  # fmt: skip
    k8s_namespaces: tuple[str, ...] = _setting(
        (), "KVGATE_K8S_NAMESPACES", _namespaces, "comma-separated namespace names",
        "namespaces watched by Kubernetes discovery; unset: the gateway's own",
    )  # fmt: skip
    k8s_label_selector: str = _setting(
        "model.aibrix.ai/name", "KVGATE_K8S_LABEL_SELECTOR", str, "a label selector",
        "which pods Kubernetes discovery takes",
    )  # fmt: skip
    inference_pool: str | None = _setting(
        None, "KVGATE_INFERENCE_POOL", _pool_ref, "a pool name, or namespace/name",
        "the InferencePool (`inference.networking.k8s.io/v1`) whose pods "
        "`KVGATE_DISCOVERY=inference-pool` takes, followed as it changes; a bare name is "
        "in the gateway's own namespace",
    )  # fmt: skip
    default_policy: str = _setting(
        "prefix-cache", "KVGATE_DEFAULT_POLICY", str, "a policy name: " + _one_of(POLICIES),
        "a built-in policy or a profile of the routing config (`--policy`)",
        aliases=(Alias("ROUTING_ALGORITHM", AIBRIX_STRATEGIES.__getitem__,
                       "an AIBrix strategy kvgate has: " + _one_of(tuple(AIBRIX_STRATEGIES))),),
    )  # fmt: skip
    routing_config: Path | None = _setting(
        None, "KVGATE_ROUTING_CONFIG", Path, "a file path",
        "routing profiles (TOML or YAML) laid over the built-ins "
        "([docs/routing.md](docs/routing.md)); `--routing-config`",
    )  # fmt: skip
    slo_shed: bool = _setting(
        False, "KVGATE_SLO_SHED", _bool, _BOOL_HELP,
        "429 + `Retry-After` when no pod is predicted to meet a request's `x-slo-ttft-ms`",
    )  # fmt: skip
    cost_prior_scale: float = _setting(
        1.0, "KVGATE_COST_PRIOR_SCALE", _number_in(0.0, 1000.0, above=True),
        "a number in (0, 1000]",
        "how many times slower than the cost model's prior (a 14B model on one GPU) this "
        "fleet answers: the TTFT model starts from its prior times this and learns the rest "
        "from the pods' answers ([docs/routing.md](docs/routing.md))",
    )  # fmt: skip
    cost_context_share: float = _setting(
        CALIBRATED_CONTEXT_SHARE, "KVGATE_COST_CONTEXT_SHARE", _number_in(0.0, 0.01),
        "a number in [0, 0.01]",
        "how much more a prompt token costs to prefill per token of context before it (the "
        "attention over it): the cost model counts a request with C tokens cached and N to "
        "compute as N + share · ((C + N)² − C²) tokens of work. The default is a 14B model's "
        "on one GPU; ~3e-5 suits an 8B, ~2e-5 a 70B; 0 counts N alone "
        "([docs/routing.md](docs/routing.md))",
    )  # fmt: skip
    hot_spot_margin: int = _setting(
        16, "KVGATE_HOT_SPOT_MARGIN", _positive_int, _POSITIVE_INT_HELP,
        "`prefix-share`: a pod with this many more requests in flight than the least loaded "
        "candidate is not chosen for its cache",
        aliases=(Alias("AIBRIX_PREFIX_CACHE_POD_RUNNING_REQUEST_IMBALANCE_ABS_COUNT"),
                 Alias("AIBRIX_LOAD_BALANCE_IMBALANCE_MIN_GAP")),
    )  # fmt: skip
    tier_weights: Mapping[Tier, float] = _setting(
        None, "KVGATE_TIER_WEIGHTS", _tier_weights, _WEIGHTS_HELP,
        "what a block held off-GPU (or only expected) is worth against one in GPU memory",
        factory=lambda: dict(DEFAULT_TIER_WEIGHTS), shown=_weights_text,
    )  # fmt: skip
    session_header: str = _setting(
        "x-session-id", "KVGATE_SESSION_HEADER", _header, "an HTTP header name",
        "the header the `session` policy keys on",
    )  # fmt: skip
    use_remote_tokenizer: bool = _setting(
        True, "AIBRIX_USE_REMOTE_TOKENIZER", _bool, _BOOL_HELP,
        "tokenize prompts (needed for prefix routing; where: `KVGATE_TOKENIZER`)",
        aliases=(Alias("AIBRIX_PREFIX_CACHE_USE_REMOTE_TOKENIZER"),),
    )  # fmt: skip
    kv_event_sync: bool = _setting(
        True, "AIBRIX_KV_EVENT_SYNC_ENABLED", _bool, _BOOL_HELP,
        "subscribe to KV events; needs `AIBRIX_USE_REMOTE_TOKENIZER`, else disabled with a "
        "warning",
        aliases=(Alias("AIBRIX_PREFIX_CACHE_KV_EVENT_SYNC_ENABLED"),),
    )  # fmt: skip
    tokenizer: str = _setting(
        "auto", "KVGATE_TOKENIZER", _choice(TOKENIZER_MODES), _one_of(TOKENIZER_MODES),
        "where prompts are tokenized: `local` in-process with the model's own tokenizer files, "
        "`remote` at the engines' `/tokenize`, `auto` local where a model's files are found "
        "(`KVGATE_TOKENIZERS`, the Hugging Face cache), else remote",
        aliases=(Alias("AIBRIX_PREFIX_CACHE_TOKENIZER_TYPE", _choice(("remote",)), "remote"),),
    )  # fmt: skip
    tokenizers: Mapping[str, Path] = _setting(
        None, "KVGATE_TOKENIZERS", _tokenizer_dirs,
        "`model=/dir,…`, each dir holding the model's `tokenizer.json`",
        "each model's tokenizer directory (`tokenizer.json`, `tokenizer_config.json`, "
        "`chat_template.jinja`), for `KVGATE_TOKENIZER=auto|local`",
        factory=dict, shown=lambda value: "none",
    )  # fmt: skip
    hf_hub_cache: Path | None = _setting(
        None, "HF_HUB_CACHE", Path, "a directory path",
        "the Hugging Face hub cache a model id is looked up in for its tokenizer files (as "
        "vLLM pods mount it); unset: `HF_HOME`'s `hub/`, else `~/.cache/huggingface/hub`",
        aliases=(Alias("HF_HOME", lambda raw: Path(raw) / "hub", "a directory path"),),
    )  # fmt: skip
    tokenizer_engine: str = _setting(
        "vllm", "AIBRIX_REMOTE_TOKENIZER_ENGINE", _choice(ENGINES), _one_of(ENGINES),
        "the kind of `AIBRIX_REMOTE_TOKENIZER_ENDPOINT` (SGLang's `/tokenize` takes text "
        "prompts only, no chat messages)",
    )  # fmt: skip
    tokenizer_endpoint: str | None = _setting(
        None, "AIBRIX_REMOTE_TOKENIZER_ENDPOINT", _url, "an http(s):// URL",
        "a fixed tokenizer URL; unset: the model's own pods (chat prompts only at vLLM pods, "
        "so SGLang-only models need it for chat prefix routing)",
        aliases=(Alias("AIBRIX_PREFIX_CACHE_REMOTE_TOKENIZER_ENDPOINT"),),
    )  # fmt: skip
    tokenizer_timeout_s: float = _setting(
        2.0, "AIBRIX_REMOTE_TOKENIZER_TIMEOUT", _duration, _DURATION_HELP,
        "one tokenization call", aliases=(Alias("AIBRIX_TOKENIZER_REQUEST_TIMEOUT"),),
    )  # fmt: skip
    tokenizer_max_retries: int = _setting(
        1, "AIBRIX_REMOTE_TOKENIZER_MAX_RETRIES", _retries, "an integer in 0..10",
        "retries of a failed tokenization (then the request is routed on load)",
    )  # fmt: skip
    tokenizer_cache_size: int = _setting(
        4096, "KVGATE_TOKENIZER_CACHE_SIZE", _non_negative_int, _NON_NEGATIVE_INT_HELP,
        "LRU entries keyed by (model, exact content)",
    )  # fmt: skip
    index: IndexConfig = field(default_factory=IndexConfig)
    """Read from the declarations of `INDEX_SETTINGS` (defaults: the indexer's own)."""
    admin_token: str | None = _setting(
        None, "KVGATE_ADMIN_TOKEN", str, "a token",
        "enables the admin API (`Authorization: Bearer …`)", secret=True,
    )  # fmt: skip
    pin_token: str | None = _setting(
        None, "KVGATE_PIN_TOKEN", str, "a token",
        "grants the per-request pin opt-in (`x-kvgate-pin-token`) without admin rights",
        secret=True,
    )  # fmt: skip
    max_body_bytes: int = _setting(
        16 * 1024 * 1024, "KVGATE_MAX_BODY_BYTES", _positive_int, _POSITIVE_INT_HELP,
        "413 beyond it", shown=_bytes_text,
    )  # fmt: skip
    max_concurrent_requests: int = _setting(
        1024, "KVGATE_MAX_CONCURRENT_REQUESTS", _positive_int, _POSITIVE_INT_HELP,
        "requests in progress (not probes, `/metrics`), from a complete body to the answer's "
        "last byte; 429 + `Retry-After` beyond it",
    )  # fmt: skip
    max_bodies_per_client: int = _setting(
        64, "KVGATE_MAX_BODIES_PER_CLIENT", _positive_int, _POSITIVE_INT_HELP,
        "request bodies per client address still arriving 1 s after their headers (a "
        "body complete within that second never counts; slow senders hold no request "
        "slot); 429 beyond it",
    )  # fmt: skip
    trusted_proxies: tuple[str, ...] = _setting(
        (), "KVGATE_TRUSTED_PROXIES", _networks, "comma-separated IP addresses or CIDR ranges",
        "proxies in front of the gateway (ingress, load balancer, sidecar): only a request "
        "from one of them has its client address read from `X-Forwarded-For` (or "
        "`Forwarded`); unset: the TCP peer's address, headers ignored",
    )  # fmt: skip
    max_prompt_tokens: int | None = _setting(
        None, "KVGATE_MAX_PROMPT_TOKENS", _positive_int, _POSITIVE_INT_HELP,
        "400 beyond it (checked when the prompt was tokenized); unset: no limit",
    )  # fmt: skip
    max_header_bytes: int = _setting(
        32 * 1024, "KVGATE_MAX_HEADER_BYTES", _positive_int, _POSITIVE_INT_HELP,
        "URL + headers; 431 beyond it", shown=_bytes_text,
    )  # fmt: skip
    body_timeout_s: float = _setting(
        30.0, "KVGATE_BODY_TIMEOUT", _duration, _DURATION_HELP,
        "longest time a client may take to send its body (408): the slow-loris bound",
    )  # fmt: skip
    header_timeout_s: float = _setting(
        10.0, "KVGATE_HEADER_TIMEOUT", _duration, _DURATION_HELP,
        "longest time a connection may take to send a request's headers (then closed)",
    )  # fmt: skip
    upstream_connect_timeout_s: float = _setting(
        2.0, "KVGATE_UPSTREAM_CONNECT_TIMEOUT", _duration, _DURATION_HELP, "connecting to a pod"
    )
    upstream_timeout_s: float = _setting(
        600.0, "KVGATE_UPSTREAM_TIMEOUT", _duration, _DURATION_HELP,
        "longest wait for the engine's next byte (headers, or the next chunk of a stream)",
    )  # fmt: skip
    dead_pod_grace_s: float = _setting(
        10.0, "KVGATE_DEAD_POD_GRACE", _duration, _DURATION_HELP,
        "requests in flight to a pod that left discovery or failed its health checks are cut "
        "after this (streams cut, waiting requests fail over)",
    )  # fmt: skip
    max_connections_per_pod: int = _setting(
        256, "KVGATE_MAX_CONNECTIONS_PER_POD", _positive_int, _POSITIVE_INT_HELP,
        "kept-alive connections per pod",
    )  # fmt: skip
    scrape_interval_s: float = _setting(
        1.0, "KVGATE_SCRAPE_INTERVAL", _duration, _DURATION_HELP,
        "engine `/metrics` scrape period (load and health)",
    )  # fmt: skip
    unhealthy_after: int = _setting(
        3, "KVGATE_UNHEALTHY_AFTER", _positive_int, _POSITIVE_INT_HELP,
        "consecutive failed scrapes that mark a pod unhealthy",
    )  # fmt: skip
    drain_timeout_s: float = _setting(
        20.0, "KVGATE_DRAIN_TIMEOUT", _duration, _DURATION_HELP,
        "on shutdown, how long in-flight requests may finish",
    )  # fmt: skip
    gc_gen0_threshold: int = _setting(
        DEFAULT_GC_GEN0_THRESHOLD, "KVGATE_GC_GEN0_THRESHOLD", _non_negative_int,
        _NON_NEGATIVE_INT_HELP, "CPython's generation-0 GC threshold (`gateway/runtime.py`); 0 "
        "keeps CPython's default",
    )  # fmt: skip
    pin_budget_fraction: float = _setting(
        0.5, "KVGATE_PIN_BUDGET_FRACTION", _fraction, "a number in (0, 1]",
        "pinned blocks per pod may not exceed this share of its GPU KV cache",
    )  # fmt: skip
    pin_default_ttl_s: float = _setting(
        600.0, "KVGATE_PIN_DEFAULT_TTL", _duration, _DURATION_HELP,
        "lease of a pin that asks for none (capped by `KVGATE_PIN_MAX_TTL` when unset)",
    )  # fmt: skip
    pin_max_ttl_s: float = _setting(
        3600.0, "KVGATE_PIN_MAX_TTL", _duration, _DURATION_HELP,
        "longest lease a pin may ask for (a longer `ttl` is refused with a 400)",
    )  # fmt: skip
    pin_max_leases: int = _setting(
        1024, "KVGATE_PIN_MAX_LEASES", _positive_int, _POSITIVE_INT_HELP,
        "live pin leases in total (beyond it: 409 `lease_cap`)",
    )  # fmt: skip
    pin_max_leases_per_pod: int = _setting(
        128, "KVGATE_PIN_MAX_LEASES_PER_POD", _positive_int, _POSITIVE_INT_HELP,
        "live pin leases per pod (beyond it: 409 `lease_cap`)",
    )  # fmt: skip
    pin_interval_s: float = _setting(
        1.0, "KVGATE_PIN_INTERVAL", _duration, _DURATION_HELP,
        "pin reconciliation and lease expiry period",
    )  # fmt: skip
    snapshot_dir: Path | None = _setting(
        None, "KVGATE_SNAPSHOT_DIR", Path, "a directory path",
        "where each pod's index snapshot is written and read at start-up, for fast restarts "
        "([docs/reliability.md](docs/reliability.md#index-snapshots)); unset: not at all",
    )  # fmt: skip
    snapshot_interval_s: float = _setting(
        10.0, "KVGATE_SNAPSHOT_INTERVAL_S", _duration, _DURATION_HELP, "snapshot period"
    )
    snapshot_max_bytes: int = _setting(
        64 * 1024 * 1024, "KVGATE_SNAPSHOT_MAX_BYTES", _positive_int, _POSITIVE_INT_HELP,
        "a pod's snapshot larger than this is neither written nor read", shown=_bytes_text,
    )  # fmt: skip
    bootstrap_peer: str | None = _setting(
        None, "KVGATE_BOOTSTRAP_PEER", _url, "an http(s):// URL of a running gateway",
        "a running gateway whose index snapshots a new replica starts from",
    )  # fmt: skip
    admin_port: int | None = _setting(
        None, "KVGATE_ADMIN_PORT", _port, _PORT_HELP + ", not KVGATE_PORT",
        "a second port for `/metrics` and `/admin/*`, which then 404 on `KVGATE_PORT` (the "
        "API 404s on this one; `/health` and `/ready` answer on both), so the API's Service "
        "need not expose them",
    )  # fmt: skip
    replica_sync_bind: str | None = _setting(
        None, "KVGATE_REPLICA_SYNC_BIND", _zmq_endpoint, "a ZMQ endpoint (tcp://host:port)",
        "ZMQ endpoint (`tcp://0.0.0.0:5590`) on which this replica publishes its routing "
        "decisions to the others; unset: independent replicas "
        "([docs/kubernetes.md](docs/kubernetes.md#high-availability-several-replicas-that-route-as-one))",
    )  # fmt: skip
    replica_peers: tuple[str, ...] = _setting(
        (), "KVGATE_REPLICA_PEERS", _zmq_endpoints, "comma-separated ZMQ endpoints",
        "the other replicas' sync endpoints (`tcp://host:port,…`)",
    )  # fmt: skip
    replica_peer_service: str | None = _setting(
        None, "KVGATE_REPLICA_PEER_SERVICE", _host_port, "host:port (a headless Service)",
        "a `host:port` resolved every 5 s to every replica's sync address: the peers, as they "
        "come and go",
    )  # fmt: skip
    replica_curve_secret_key: str | None = _setting(
        None, "KVGATE_REPLICA_CURVE_SECRET_KEY", z85_key, KEY_HELP,
        "this replica's CURVE secret key: the sync channel is then encrypted and admits only "
        "trusted keys; required when `KVGATE_REPLICA_SYNC_BIND` is not loopback or `ipc://` "
        "(or `KVGATE_REPLICA_CURVE_KEYS_DIR`)", secret=True,
    )  # fmt: skip
    replica_curve_peer_keys: tuple[str, ...] = _setting(
        (), "KVGATE_REPLICA_CURVE_PEER_KEYS", z85_keys,
        f"public keys separated by commas, each {KEY_HELP}, at most {MAX_TRUSTED_KEYS - 1}",
        "public keys of other key pairs trusted besides this replica's own (a key rotation, "
        "or replicas with pairs of their own)",
    )  # fmt: skip
    replica_curve_keys_dir: Path | None = _setting(
        None, "KVGATE_REPLICA_CURVE_KEYS_DIR", Path, "a directory path",
        "a mounted Secret holding `secret-key` (and optionally `public-key`, `peer-keys`), "
        "instead of `KVGATE_REPLICA_CURVE_SECRET_KEY`",
    )  # fmt: skip
    log_format: str = _setting(
        "text", "KVGATE_LOG_FORMAT", _choice(LOG_FORMATS), _one_of(LOG_FORMATS),
        "`text` (timestamped lines) or `json` (one object per line: `time`, `level`, "
        "`logger`, `message`, `request_id`, `pod`)",
    )  # fmt: skip
    access_log: bool = _setting(
        True, "KVGATE_ACCESS_LOG", _bool, _BOOL_HELP,
        "one `kvgate.access` line per request (status, pod, policy, cached blocks, TTFT, "
        "duration)",
    )  # fmt: skip
    prediction_log: bool = _setting(
        False, "KVGATE_PREDICTION_LOG", _bool, _BOOL_HELP,
        "one `kvgate.predictions` line per streamed answer the cost model learns from: pod, "
        "predicted and observed TTFT, and each feature and term of the prediction (to tune "
        "`KVGATE_COST_*` or see where a prediction error comes from; "
        "[docs/routing.md](docs/routing.md))",
    )  # fmt: skip

    def __post_init__(self) -> None:
        if self.routing_config is None and self.default_policy not in POLICIES:
            raise ConfigError("KVGATE_DEFAULT_POLICY", self.default_policy, _one_of(POLICIES))
        if self.log_format not in LOG_FORMATS:
            raise ConfigError("KVGATE_LOG_FORMAT", self.log_format, _one_of(LOG_FORMATS))
        if self.discovery not in DISCOVERIES:
            raise ConfigError("KVGATE_DISCOVERY", self.discovery, _one_of(DISCOVERIES))
        if self.pin_default_ttl_s > self.pin_max_ttl_s:
            raise ConfigError("KVGATE_PIN_DEFAULT_TTL", self.pin_default_ttl_s,
                              f"at most KVGATE_PIN_MAX_TTL ({self.pin_max_ttl_s:g} s)")  # fmt: skip
        if not 0 < self.port < 65536:
            raise ConfigError("KVGATE_PORT", self.port, _PORT_HELP)
        if self.admin_port is not None and self.admin_port == self.port:
            raise ConfigError("KVGATE_ADMIN_PORT", self.admin_port, "a port other than KVGATE_PORT")
        self._check_replica_keys()

    def _check_replica_keys(self) -> None:
        """A sync channel others can reach needs keys; keys come from one place."""
        secret, directory = self.replica_curve_secret_key, self.replica_curve_keys_dir
        keyed = secret is not None or directory is not None
        if secret is not None and directory is not None:
            raise ConfigError(
                "KVGATE_REPLICA_CURVE_KEYS_DIR", str(directory),
                "unset when KVGATE_REPLICA_CURVE_SECRET_KEY is set (one of them)",
            )  # fmt: skip
        if self.replica_curve_peer_keys and not keyed:
            raise ConfigError(
                "KVGATE_REPLICA_CURVE_PEER_KEYS", ",".join(self.replica_curve_peer_keys),
                "unset without this replica's own key (KVGATE_REPLICA_CURVE_SECRET_KEY or "
                "KVGATE_REPLICA_CURVE_KEYS_DIR)",
            )  # fmt: skip
        bind = self.replica_sync_bind
        if bind is not None and not keyed and not local_endpoint(bind):
            raise ConfigError(
                "KVGATE_REPLICA_SYNC_BIND", bind,
                "a loopback or ipc:// endpoint, or CURVE keys for the channel "
                "(KVGATE_REPLICA_CURVE_SECRET_KEY or KVGATE_REPLICA_CURVE_KEYS_DIR; "
                "`kvgate replica-keys` makes them, docs/kubernetes.md)",
            )  # fmt: skip

    @property
    def prefix_routing(self) -> bool:
        """Whether prompts are tokenized and matched against the index at all."""
        return self.use_remote_tokenizer

    DECISION_SETTINGS = ("KVGATE_COST_PRIOR_SCALE", "KVGATE_COST_CONTEXT_SHARE")
    """The settings `cost_params` reads: they feed every cost-ranked decision (`kvgate
    routing plugins` counts them among the default policy's parameters)."""

    def cost_params(self) -> CostParams:
        """The cost model's parameters as these settings ask (the gateway's, and any
        benchmark that measures what the gateway runs)."""
        params = CostParams(context_share=self.cost_context_share)
        return params.with_prior_scale(self.cost_prior_scale)

    @classmethod
    def load(cls, env: Mapping[str, str], overrides: Mapping[str, Any] | None = None) -> Settings:
        """Settings from `env`, then `overrides` (command-line flags; None = not given)."""
        values: dict[str, Any] = {}
        defaults: dict[str, Any] = {}
        for name, declaration, default in _declared():
            defaults[name] = default
            value = _read(env, declaration)
            if value is not _UNSET:
                values[name] = value
        values["index"] = _index_config(env)
        if "pin_default_ttl_s" not in values:  # a lower maximum caps the default
            maximum = values.get("pin_max_ttl_s", defaults["pin_max_ttl_s"])
            values["pin_default_ttl_s"] = min(maximum, defaults["pin_default_ttl_s"])
        settings = cls(**values)
        if overrides:
            given = {key: value for key, value in overrides.items() if value is not None}
            settings = replace(settings, **given)
        return settings.validated()

    def validated(self) -> Settings:
        """Apply the seed's dependency rule: KV sync needs the remote tokenizer."""
        if self.kv_event_sync and not self.use_remote_tokenizer:
            logger.warning(
                "AIBRIX_KV_EVENT_SYNC_ENABLED=true needs AIBRIX_USE_REMOTE_TOKENIZER=true: "
                "KV event sync is disabled (routing uses load only)"
            )
            return replace(self, kv_event_sync=False)
        return self


INDEX_SETTINGS: tuple[tuple[str, Declaration], ...] = (
    ("block_size", Declaration(
        "AIBRIX_PREFIX_CACHE_BLOCK_SIZE", _positive_int, _POSITIVE_INT_HELP + " (tokens)",
        "gateway block size in tokens")),
    ("hash_seed", Declaration(
        "KVGATE_HASH_SEED", _hash_seed, "an unsigned 64-bit integer (decimal or 0x hex)",
        "seed of the chained hash; identical on every replica",
        shown=hex)),
    ("pure_python", Declaration(
        "KVGATE_PURE_PYTHON", _bool, _BOOL_HELP,
        "run the index on dicts and the xxhash package instead of its compiled primitives "
        "(`indexer/_native.c`, built by the install where a C compiler is found); unset: "
        "compiled when built")),
    ("limits.max_contexts", Declaration(
        "AIBRIX_SYNC_MAX_CONTEXTS", _positive_int, _POSITIVE_INT_HELP,
        "(model, LoRA) contexts; the least recently used goes")),
    ("limits.max_prefixes_per_context", Declaration(
        "AIBRIX_SYNC_MAX_PREFIXES_PER_CONTEXT", _positive_int, _POSITIVE_INT_HELP,
        "blocks per context; the least recently used 10 % are trimmed when crossed")),
    ("limits.eviction_interval_s", Declaration(
        "AIBRIX_SYNC_EVICTION_INTERVAL_SECONDS", _seconds, _SECONDS_HELP,
        "how often the eviction pass runs")),
    ("limits.eviction_duration_s", Declaration(
        "AIBRIX_SYNC_EVICTION_DURATION_MINUTES", _minutes,
        "a number of minutes in (0, 10080] (7 days)",
        "lifetime of router-side entries of pods without events", shown=_minutes_text)),
    ("limits.max_blocks_per_pod", Declaration(
        "KVGATE_INDEX_MAX_BLOCKS_PER_POD", _positive_int, _POSITIVE_INT_HELP,
        "engine blocks per pod; further stores are refused and counted")),
    ("limits.max_expected_per_pod", Declaration(
        "KVGATE_INDEX_MAX_EXPECTED_PER_POD", _positive_int, _POSITIVE_INT_HELP,
        "router-side entries per pod; the oldest go first")),
    ("limits.expected_ttl_s", Declaration(
        "KVGATE_INDEX_EXPECTED_TTL_SECONDS", _seconds, _SECONDS_HELP,
        "lifetime of an unconfirmed router-side entry")),
)  # fmt: skip
"""The index's settings: the field of `IndexConfig` (or of its `limits`) each one sets.
Their defaults are the indexer's own."""


def _declared() -> Iterator[tuple[str, Declaration, object]]:
    """(field, declaration, default) of every declared Settings field, in order."""
    for spec in fields(Settings):
        declaration = spec.metadata.get(_DECLARATION)
        if declaration is not None:
            factory = spec.default_factory
            default = factory() if factory is not MISSING else spec.default
            yield spec.name, declaration, default


def setting_declaration(name: str) -> tuple[Declaration, object]:
    """The declaration of the Settings field `name`, with its default."""
    for field_name, declaration, default in _declared():
        if field_name == name:
            return declaration, default
    raise KeyError(name)


def setting_groups() -> dict[str, list[tuple[Declaration, object]]]:
    """The declarations with their defaults, as docs/configuration.md's two tables group
    them: the gateway's, then the index's."""
    index = IndexConfig()
    return {
        "gateway": [(declaration, default) for _, declaration, default in _declared()],
        "index": [(declaration, _attribute(index, path)) for path, declaration in INDEX_SETTINGS],
    }


def setting_names() -> list[str]:
    """Every environment variable (and `--config` key) a setting is read from."""
    return sorted(
        name
        for entries in setting_groups().values()
        for declaration, _ in entries
        for name, _, _ in declaration.names()
    )


def unread_variables(env: Mapping[str, str]) -> list[str]:
    """`KVGATE_*` and `AIBRIX_*` variables set in `env` that no setting reads: a typo, or an
    AIBrix setting kvgate has no feature for (warned about once at start-up)."""
    known = set(setting_names())
    return sorted(
        name for name in env if name.startswith(("KVGATE_", "AIBRIX_")) and name not in known
    )


def read_config_file(path: Path) -> dict[str, str]:
    """`kvgate serve --config FILE`: TOML or YAML, a flat table of the environment's names
    (`KVGATE_PORT = 8080`). Values become the strings the environment would hold; a name no
    setting reads, a nested table or an unreadable file is a ConfigError naming it."""
    where = f"--config {path}"
    kind = "yaml" if path.suffix in (".yaml", ".yml") else "toml"
    data = read_document(path, where, kind=kind)
    if data is None:  # an empty YAML file
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(where, type(data).__name__, "a table of settings")
    known = set(setting_names())
    values: dict[str, str] = {}
    for name, value in data.items():
        if name not in known:
            raise ConfigError(f"{where}: {name}", value, "a setting's name (docs/configuration.md)")
        if isinstance(value, bool):
            values[name] = "true" if value else "false"
        elif isinstance(value, str | int | float):
            values[name] = str(value)
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            values[name] = ",".join(value)
        else:
            raise ConfigError(f"{where}: {name}", value, "a string, number, boolean or list")
    return values


class _Unset:
    pass


_UNSET = _Unset()


def _read(env: Mapping[str, str], declaration: Declaration) -> Any:
    """The setting's value from its own variable, else from its first alias that is set;
    every name is parsed, so a bad value under any of them stops start-up."""
    found: Any = _UNSET
    for variable, parse, allowed in declaration.names():
        raw = env.get(variable)
        if raw is None or raw.strip() == "":
            continue
        try:
            value = parse(raw.strip())
        except (ValueError, TypeError, KeyError):
            shown = "(hidden)" if declaration.secret else raw
            raise ConfigError(variable, shown, allowed) from None
        if found is _UNSET:
            found = value
    return found


def _index_config(env: Mapping[str, str]) -> IndexConfig:
    values: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    for path, declaration in INDEX_SETTINGS:
        value = _read(env, declaration)
        if value is not _UNSET:
            group, _, name = path.rpartition(".")
            (limits if group == "limits" else values)[name] = value
    return IndexConfig(**values, limits=IndexLimits(**limits))


def _attribute(target: object, path: str) -> object:
    for name in path.split("."):
        target = getattr(target, name)
    return target
