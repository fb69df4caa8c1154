"""The gateway's settings: environment variables (the seed's AIBRIX_* names, KVGATE_* for
the rest) overridden by command-line flags. Every invalid value stops start-up with the
variable, the value and what is allowed."""

from __future__ import annotations

import contextlib
import logging
import re
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import yaml

from gateway.runtime import DEFAULT_GC_GEN0_THRESHOLD
from indexer import ConfigError, IndexConfig, Tier

logger = logging.getLogger(__name__)

POLICIES = (
    "prefix-cache", "predicted-latency", "prefix-share", "least-request", "round-robin", "random",
    "session", "least-kv-cache",
)  # fmt: skip
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
DISCOVERIES = ("static", "kubernetes")
LOG_FORMATS = ("text", "json")
DEFAULT_TIER_WEIGHTS = {Tier.GPU: 1.0, Tier.CPU: 0.8, Tier.STORAGE: 0.25, Tier.EXPECTED: 0.9}

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8080
    pods_file: Path | None = None
    """Static discovery file (JSON or TOML)."""
    discovery: str = "static"
    """Where pods come from: `static` (the pods file) or `kubernetes` (the API)."""
    k8s_namespaces: tuple[str, ...] = ()
    """Namespaces watched by Kubernetes discovery; empty: the gateway's own, else default."""
    k8s_label_selector: str = "model.aibrix.ai/name"
    default_policy: str = "prefix-cache"
    routing_config: Path | None = None
    """A routing config file (TOML or YAML) laid over the built-in policies."""
    slo_shed: bool = False
    """Answer 429 + Retry-After when no pod is predicted to meet a request's x-slo-ttft-ms."""
    use_remote_tokenizer: bool = True
    kv_event_sync: bool = True
    tokenizer_engine: str = "vllm"
    tokenizer_endpoint: str | None = None
    """A fixed /tokenize endpoint; unset: each model's pods tokenize for it."""
    tokenizer_timeout_s: float = 2.0
    tokenizer_max_retries: int = 1
    tokenizer_cache_size: int = 4096
    index: IndexConfig = field(default_factory=IndexConfig)
    admin_token: str | None = field(default=None, repr=False)
    """Kept out of repr: a logged or printed Settings must not show it."""
    max_body_bytes: int = 16 * 1024 * 1024
    max_concurrent_requests: int = 1024
    """Requests handled at once (/v1 and /admin), from a complete body to the last byte of
    the answer; beyond it 429 + Retry-After."""
    max_bodies_per_client: int = 64
    """Request bodies being received at once per client address; beyond it 429."""
    max_prompt_tokens: int | None = None
    """Longest prompt in tokens, checked when the tokenizer answered (400); None: no limit."""
    body_timeout_s: float = 30.0
    """Longest time a client may take to send its request body (408): slow-loris bound."""
    header_timeout_s: float = 10.0
    """Longest time a connection may take to send a request's headers (then closed)."""
    max_header_bytes: int = 32 * 1024
    """Bound on a request's URL + headers (431 beyond it)."""
    upstream_connect_timeout_s: float = 2.0
    dead_pod_grace_s: float = 10.0
    """In-flight requests of a pod gone from discovery or unhealthy are cut after this."""
    upstream_timeout_s: float = 600.0
    """Longest wait for the engine's next byte (headers, or the next chunk of a stream)."""
    max_connections_per_pod: int = 256
    scrape_interval_s: float = 1.0
    """Engine /metrics scrape period (load and health)."""
    unhealthy_after: int = 3
    """Consecutive failed scrapes that mark a pod unhealthy."""
    session_header: str = "x-session-id"
    hot_spot_margin: int = 16
    """A pod with this many more requests in flight than the least loaded candidate is not
    chosen for its cache."""
    tier_weights: Mapping[Tier, float] = field(default_factory=lambda: dict(DEFAULT_TIER_WEIGHTS))
    gc_gen0_threshold: int = DEFAULT_GC_GEN0_THRESHOLD
    drain_timeout_s: float = 20.0
    """On shutdown, how long in-flight requests may finish."""
    pin_budget_fraction: float = 0.5
    """Pinned blocks per pod may not exceed this share of its GPU KV cache."""
    pin_default_ttl_s: float = 600.0
    pin_max_ttl_s: float = 3600.0
    """Longest lease a pin may ask for (a longer `ttl` is refused with a 400)."""
    pin_max_leases: int = 1024
    pin_max_leases_per_pod: int = 128
    """Caps on live pin leases, in total and per pod (beyond them: 409 `lease_cap`)."""
    pin_token: str | None = field(default=None, repr=False)
    """Grants the per-request pin opt-in (`x-kvgate-pin-token`) without admin rights."""
    pin_interval_s: float = 1.0
    """Pin reconciliation and lease expiry period."""
    snapshot_dir: Path | None = None
    """Where each pod's index snapshot is written and read at start-up (None: not at all)."""
    snapshot_interval_s: float = 10.0
    snapshot_max_bytes: int = 64 * 1024 * 1024
    """A pod's snapshot larger than this is neither written nor read."""
    bootstrap_peer: str | None = None
    """A running gateway (http://host:port) whose index snapshots a new replica starts from."""
    admin_port: int | None = None
    """A second port for `/metrics` and `/admin/*` (then not served on `port`), so the API's
    Service need not expose them; None: everything on `port`."""
    replica_sync_bind: str | None = None
    """ZMQ endpoint on which this replica publishes its routing decisions to its peers
    (`tcp://0.0.0.0:5590`); None: no sharing (independent replicas)."""
    replica_peers: tuple[str, ...] = ()
    """The other replicas' sync endpoints (`tcp://host:port`), whose decisions this one
    follows."""
    replica_peer_service: str | None = None
    """`host:port` resolved every few seconds to every replica's address (a headless
    Service in Kubernetes): the peers, as they come and go."""
    log_format: str = "text"
    """`text` (timestamped lines) or `json` (one object per line), see `gateway/logs.py`."""
    access_log: bool = True
    """One `kvgate.access` line per request (status, pod, policy, cached blocks, TTFT,
    duration)."""

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
            raise ConfigError("KVGATE_PORT", self.port, "a TCP port in 1..65535")
        if self.admin_port is not None and self.admin_port == self.port:
            raise ConfigError("KVGATE_ADMIN_PORT", self.admin_port, "a port other than KVGATE_PORT")

    @property
    def prefix_routing(self) -> bool:
        """Whether prompts are tokenized and matched against the index at all."""
        return self.use_remote_tokenizer

    @classmethod
    def load(cls, env: Mapping[str, str], overrides: Mapping[str, Any] | None = None) -> Settings:
        """Settings from `env`, then `overrides` (command-line flags; None = not given)."""
        values: dict[str, Any] = {}
        reader = _EnvReader(env)
        values["host"] = reader.get("KVGATE_HOST", str, "127.0.0.1", "a host name or address")
        values["port"] = reader.get("KVGATE_PORT", _port, 8080, "a TCP port in 1..65535")
        pods_file = reader.get("KVGATE_PODS_FILE", Path, None, "a file path")
        values["pods_file"] = pods_file
        values["discovery"] = reader.get(
            "KVGATE_DISCOVERY", _choice(DISCOVERIES), "static", _one_of(DISCOVERIES)
        )
        every_namespace: tuple[str, ...] = ()
        values["k8s_namespaces"] = reader.get(
            "KVGATE_K8S_NAMESPACES", _namespaces, every_namespace, "comma-separated namespace names"
        )
        values["k8s_label_selector"] = reader.get(
            "KVGATE_K8S_LABEL_SELECTOR", str, "model.aibrix.ai/name", "a label selector"
        )
        values["routing_config"] = reader.get("KVGATE_ROUTING_CONFIG", Path, None, "a file path")
        aibrix_default = reader.get(
            "ROUTING_ALGORITHM", _choice(tuple(AIBRIX_STRATEGIES)), "prefix-cache",
            "an AIBrix strategy kvgate has: " + _one_of(tuple(AIBRIX_STRATEGIES)),
        )  # fmt: skip
        values["default_policy"] = reader.get(
            "KVGATE_DEFAULT_POLICY", str, AIBRIX_STRATEGIES[aibrix_default],
            "a policy name: " + _one_of(POLICIES),
        )  # fmt: skip
        values["slo_shed"] = reader.get("KVGATE_SLO_SHED", _bool, False, "true or false")
        values["use_remote_tokenizer"] = reader.get(
            "AIBRIX_USE_REMOTE_TOKENIZER", _bool, True, "true or false"
        )
        values["kv_event_sync"] = reader.get(
            "AIBRIX_KV_EVENT_SYNC_ENABLED", _bool, True, "true or false"
        )
        reader.get("AIBRIX_PREFIX_CACHE_TOKENIZER_TYPE", _choice(("remote",)), "remote", "remote")
        values["tokenizer_engine"] = reader.get(
            "AIBRIX_REMOTE_TOKENIZER_ENGINE", _choice(ENGINES), "vllm", _one_of(ENGINES)
        )
        values["tokenizer_endpoint"] = reader.get(
            "AIBRIX_REMOTE_TOKENIZER_ENDPOINT", _url, None, "an http(s):// URL"
        )
        values["tokenizer_timeout_s"] = reader.get(
            "AIBRIX_REMOTE_TOKENIZER_TIMEOUT", _duration, 2.0, _DURATION_HELP
        )
        values["tokenizer_max_retries"] = reader.get(
            "AIBRIX_REMOTE_TOKENIZER_MAX_RETRIES", _non_negative_int, 1, "an integer >= 0"
        )
        values["tokenizer_cache_size"] = reader.get(
            "KVGATE_TOKENIZER_CACHE_SIZE", _non_negative_int, 4096, "an integer >= 0"
        )
        values["admin_token"] = reader.get("KVGATE_ADMIN_TOKEN", str, None, "a token") or None
        values["max_body_bytes"] = reader.get(
            "KVGATE_MAX_BODY_BYTES", _positive_int, 16 * 1024 * 1024, "an integer > 0"
        )
        values["max_concurrent_requests"] = reader.get(
            "KVGATE_MAX_CONCURRENT_REQUESTS", _positive_int, 1024, "an integer > 0"
        )
        values["max_bodies_per_client"] = reader.get(
            "KVGATE_MAX_BODIES_PER_CLIENT", _positive_int, 64, "an integer > 0"
        )
        values["max_prompt_tokens"] = reader.get(
            "KVGATE_MAX_PROMPT_TOKENS", _positive_int, None, "an integer > 0"
        )
        values["max_header_bytes"] = reader.get(
            "KVGATE_MAX_HEADER_BYTES", _positive_int, 32 * 1024, "an integer > 0"
        )
        for variable, name, default in (
            ("KVGATE_BODY_TIMEOUT", "body_timeout_s", 30.0),
            ("KVGATE_HEADER_TIMEOUT", "header_timeout_s", 10.0),
            ("KVGATE_UPSTREAM_CONNECT_TIMEOUT", "upstream_connect_timeout_s", 2.0),
            ("KVGATE_UPSTREAM_TIMEOUT", "upstream_timeout_s", 600.0),
            ("KVGATE_DEAD_POD_GRACE", "dead_pod_grace_s", 10.0),
            ("KVGATE_SCRAPE_INTERVAL", "scrape_interval_s", 1.0),
            ("KVGATE_DRAIN_TIMEOUT", "drain_timeout_s", 20.0),
            ("KVGATE_PIN_DEFAULT_TTL", "pin_default_ttl_s", 600.0),
            ("KVGATE_PIN_MAX_TTL", "pin_max_ttl_s", 3600.0),
            ("KVGATE_PIN_INTERVAL", "pin_interval_s", 1.0),
        ):
            values[name] = reader.get(variable, _duration, default, _DURATION_HELP)
        values["max_connections_per_pod"] = reader.get(
            "KVGATE_MAX_CONNECTIONS_PER_POD", _positive_int, 256, "an integer > 0"
        )
        values["unhealthy_after"] = reader.get(
            "KVGATE_UNHEALTHY_AFTER", _positive_int, 3, "an integer > 0"
        )
        values["session_header"] = reader.get(
            "KVGATE_SESSION_HEADER", _header, "x-session-id", "an HTTP header name"
        )
        values["hot_spot_margin"] = reader.get(
            "KVGATE_HOT_SPOT_MARGIN", _positive_int, 16, "an integer > 0"
        )
        values["tier_weights"] = reader.get(
            "KVGATE_TIER_WEIGHTS", _tier_weights, dict(DEFAULT_TIER_WEIGHTS), _WEIGHTS_HELP
        )
        values["gc_gen0_threshold"] = reader.get(
            "KVGATE_GC_GEN0_THRESHOLD", _non_negative_int, DEFAULT_GC_GEN0_THRESHOLD, ">= 0"
        )
        values["snapshot_dir"] = reader.get("KVGATE_SNAPSHOT_DIR", Path, None, "a directory path")
        values["snapshot_interval_s"] = reader.get(
            "KVGATE_SNAPSHOT_INTERVAL_S", _duration, 10.0, _DURATION_HELP
        )
        values["snapshot_max_bytes"] = reader.get(
            "KVGATE_SNAPSHOT_MAX_BYTES", _positive_int, 64 * 1024 * 1024, "an integer > 0"
        )
        values["bootstrap_peer"] = reader.get(
            "KVGATE_BOOTSTRAP_PEER", _url, None, "an http(s):// URL of a running gateway"
        )
        values["admin_port"] = reader.get(
            "KVGATE_ADMIN_PORT", _port, None, "a TCP port in 1..65535, not KVGATE_PORT"
        )
        values["replica_sync_bind"] = reader.get(
            "KVGATE_REPLICA_SYNC_BIND", _zmq_endpoint, None, "a ZMQ endpoint (tcp://host:port)"
        )
        no_peers: tuple[str, ...] = ()
        values["replica_peers"] = reader.get(
            "KVGATE_REPLICA_PEERS", _zmq_endpoints, no_peers, "comma-separated ZMQ endpoints"
        )
        values["replica_peer_service"] = reader.get(
            "KVGATE_REPLICA_PEER_SERVICE", _host_port, None, "host:port (a headless Service)"
        )
        values["pin_token"] = reader.get("KVGATE_PIN_TOKEN", str, None, "a token") or None
        values["pin_max_leases"] = reader.get(
            "KVGATE_PIN_MAX_LEASES", _positive_int, 1024, "an integer > 0"
        )
        values["pin_max_leases_per_pod"] = reader.get(
            "KVGATE_PIN_MAX_LEASES_PER_POD", _positive_int, 128, "an integer > 0"
        )
        values["pin_budget_fraction"] = reader.get(
            "KVGATE_PIN_BUDGET_FRACTION", _fraction, 0.5, "a number in (0, 1]"
        )
        values["log_format"] = reader.get(
            "KVGATE_LOG_FORMAT", _choice(LOG_FORMATS), "text", _one_of(LOG_FORMATS)
        )
        values["access_log"] = reader.get("KVGATE_ACCESS_LOG", _bool, True, "true or false")
        values["index"] = IndexConfig.from_env(env)
        if (
            values["pin_default_ttl_s"] > values["pin_max_ttl_s"]
            and not env.get("KVGATE_PIN_DEFAULT_TTL", "").strip()
        ):
            values["pin_default_ttl_s"] = values["pin_max_ttl_s"]  # a lower maximum caps it
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


def setting_names() -> list[str]:
    """Every environment variable (and `--config` key) a setting is read from."""
    asked = _AskedNames({})
    Settings.load(asked)
    return sorted(name for name in asked.names if name.startswith(("KVGATE_", "AIBRIX_")))


def read_config_file(path: Path) -> dict[str, str]:
    """`kvgate serve --config FILE`: TOML or YAML, a flat table of the environment's names
    (`KVGATE_PORT = 8080`). Values become the strings the environment would hold; a name no
    setting reads, a nested table or an unreadable file is a ConfigError naming it."""
    where = f"--config {path}"
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(where, str(path), f"a readable file ({exc})") from None
    try:
        yaml_file = path.suffix in (".yaml", ".yml")
        data = (yaml.safe_load(raw) or {}) if yaml_file else tomllib.loads(raw)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(where, str(path), f"valid TOML or YAML ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(where, type(data).__name__, "a table of settings")
    known = set(setting_names())
    values: dict[str, str] = {}
    for name, value in data.items():
        if name not in known:
            raise ConfigError(f"{where}: {name}", value, "a setting's name (README)")
        if isinstance(value, bool):
            values[name] = "true" if value else "false"
        elif isinstance(value, str | int | float):
            values[name] = str(value)
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            values[name] = ",".join(value)
        else:
            raise ConfigError(f"{where}: {name}", value, "a string, number, boolean or list")
    return values


def unread_variables(env: Mapping[str, str]) -> list[str]:
    """`KVGATE_*` and `AIBRIX_*` variables set in `env` that no setting reads: a typo, or an
    AIBrix setting kvgate has no feature for (warned about once at start-up)."""
    asked = _AskedNames(env)
    with contextlib.suppress(ConfigError):
        Settings.load(asked)
    return sorted(
        name for name in env if name.startswith(("KVGATE_", "AIBRIX_")) and name not in asked.names
    )


class _AskedNames(Mapping[str, str]):
    """The environment, remembering which names were looked up."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self._env = env
        self.names: set[str] = set()

    def __getitem__(self, name: str) -> str:
        self.names.add(name)
        return self._env[name]

    def get(self, name: str, default: Any = None) -> Any:
        self.names.add(name)
        return self._env.get(name, default)

    def __contains__(self, name: object) -> bool:
        if isinstance(name, str):
            self.names.add(name)
        return name in self._env

    def __iter__(self) -> Iterator[str]:
        return iter(self._env)

    def __len__(self) -> int:
        return len(self._env)


class _EnvReader:
    def __init__(self, env: Mapping[str, str]) -> None:
        self._env = env

    def get(self, variable: str, parse: Callable[[str], T], default: T, allowed: str) -> T:
        raw = self._env.get(variable)
        if raw is None or raw.strip() == "":
            return default
        try:
            return parse(raw.strip())
        except (ValueError, TypeError):
            raise ConfigError(variable, raw, allowed) from None


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


def _positive_int(raw: str) -> int:
    value = int(raw)
    if value <= 0:
        raise ValueError(raw)
    return value


def _non_negative_int(raw: str) -> int:
    value = int(raw)
    if value < 0:
        raise ValueError(raw)
    return value


def _fraction(raw: str) -> float:
    value = float(raw)
    if not 0 < value <= 1:
        raise ValueError(raw)
    return value


def _port(raw: str) -> int:
    value = int(raw)
    if not 0 < value < 65536:
        raise ValueError(raw)
    return value


def _namespaces(raw: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in raw.split(",") if name.strip())
    if not all(re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", name) for name in names):
        raise ValueError(raw)
    return names


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


_DURATION_HELP = "a positive duration: seconds (2.5) or Go-style (500ms, 30s, 1m30s, 2h)"
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
    if value <= 0:
        raise ValueError(raw)
    return value


_WEIGHTS_HELP = "comma-separated TIER=WEIGHT with tiers GPU, CPU, STORAGE, EXPECTED (e.g. CPU=0.8)"


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
