"""The `kvgate` command line: one sub-command per product component.

Each component owns its own flags (`configure_parser`) and entry point (`run`);
this module only wires them together and imports them lazily, so `kvgate serve`
never imports the simulator or the benchmarks.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Protocol

from gateway.version import version


class _Component(Protocol):
    def configure_parser(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


# name -> (module that implements it, one-line help, longer description)
_COMMANDS: dict[str, tuple[str, str, str]] = {
    "serve": (
        "gateway.commands.serve",
        "run the KV-cache-aware OpenAI-compatible gateway",
        "Serve the OpenAI-compatible endpoint, subscribe to every pod's KV events and "
        "route each request to the pod holding the longest cached prefix of its prompt.",
    ),
    "epp": (
        "gateway.commands.epp",
        "run kvgate's routing as a Gateway API endpoint picker (Envoy ext_proc)",
        "Serve Envoy's external processing protocol over gRPC (--grpc-port, default 9002) as a "
        "Gateway API Inference Extension endpoint picker: each request's pod is chosen as "
        "`kvgate serve` would and named in x-gateway-destination-endpoint (docs/epp.md).",
    ),
    "settings": (
        "gateway.commands.settings",
        "every setting of kvgate serve: variable, default, meaning",
        "List every setting `kvgate serve` reads (environment or --config file), its default, "
        "its meaning and the value the current environment gives it.",
    ),
    "routing": (
        "gateway.commands.routing",
        "routing plugins and their parameters, from the code",
        "`kvgate routing plugins`: every plugin a routing config may name, with each "
        "parameter's type, default, range and meaning (--markdown: docs/routing.md's tables).",
    ),
    "replica-keys": (
        "gateway.commands.replica_keys",
        "a new CURVE key pair for the replica sync channel",
        "Print a new CURVE key pair (Z85) for KVGATE_REPLICA_CURVE_*: secret-key=/public-key= "
        "lines, or with --kubernetes a Secret manifest for kubectl apply.",
    ),
    "sim": (
        "simulator.cli",
        "run simulated vLLM/SGLang engines",
        "Start one simulated engine (or a fleet with --fleet N) that speaks vLLM's HTTP API "
        "and publishes vLLM-format KV cache events over ZMQ with a replay socket.",
    ),
    "demo": (
        "bench.demo_cli",
        "simulated fleet + gateway + workload, showing what KV-aware routing gains",
        "Start a small fleet of simulated engines and the gateway on loopback, run a multi-turn "
        "workload with round-robin and with prefix-cache routing, and print the comparison.",
    ),
    "bench": (
        "bench.cli",
        "benchmarks (indexer, sim, subscriber, routing, chaos)",
        "Run one of kvgate's benchmarks; each prints a table and writes JSON (and PNG plots) "
        "under bench/results/runs/ (--keep: the committed bench/results/).",
    ),
}


def _load(module_name: str) -> _Component:
    component: _Component = importlib.import_module(module_name)
    return component


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvgate",
        description="kvgate: a KV-cache-aware gateway for LLM inference fleets.",
    )
    parser.add_argument("--version", action="version", version=f"kvgate {version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, summary, description) in _COMMANDS.items():
        sub = commands.add_parser(name, help=summary, description=description)
        component = _load(module_name)
        component.configure_parser(sub)
        sub.set_defaults(_run=component.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args._run
    try:
        return run(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
