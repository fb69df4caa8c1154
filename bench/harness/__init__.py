"""The pipeline every benchmark shares: child processes, ports, simulated engines and
their counters, the gateway under test, streamed requests and their records, and a probe
of the event loop."""

from bench.harness.engine_stats import (
    EngineCounters,
    cache_capacity_tokens,
    deltas,
    read_counters,
    reset_prefix_caches,
)
from bench.harness.fleet import (
    MODEL,
    EngineEndpoint,
    SimOptions,
    SimProcess,
    endpoints_of,
    start_all,
    write_pods_file,
)
from bench.harness.gateway import AdminClient, GatewayProcess, serve_command, serve_in_process
from bench.harness.ports import choose_port, free_port_block, port_is_free
from bench.harness.probe import LoopLagProbe
from bench.harness.processes import ChildProcess, cpu_seconds, log_tail, open_fds, rss_bytes
from bench.harness.readiness import StartError, eventually, wait_http
from bench.harness.records import RequestRecord
from bench.harness.streaming import ChatAnswer, post_chat

__all__ = [
    "MODEL",
    "AdminClient",
    "ChatAnswer",
    "ChildProcess",
    "EngineCounters",
    "EngineEndpoint",
    "GatewayProcess",
    "LoopLagProbe",
    "RequestRecord",
    "SimOptions",
    "SimProcess",
    "StartError",
    "cache_capacity_tokens",
    "choose_port",
    "cpu_seconds",
    "deltas",
    "endpoints_of",
    "eventually",
    "free_port_block",
    "log_tail",
    "open_fds",
    "port_is_free",
    "post_chat",
    "read_counters",
    "reset_prefix_caches",
    "rss_bytes",
    "serve_command",
    "serve_in_process",
    "start_all",
    "wait_http",
    "write_pods_file",
]
