"""`kvgate bench routing`: routing quality per router and workload, on a simulated fleet."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import re
import time
from pathlib import Path

from bench.results_io import results_dir
from bench.routing.engines import REAL_SIZE, REAL_TRACE_SCALE, EngineChoice
from bench.routing.fleet import TRACE_WALL_RATE, WALL_RATE
from bench.routing.routers import BASELINES, KVGATE_POLICIES, PEERS, VIAS
from bench.routing.trace import TraceError, TraceSpec, load_trace
from bench.routing.workloads import WORKLOADS, WorkloadSize

DEFAULT_ROUTERS = (
    "prefix-cache",
    "prefix-share",
    "least-request",
    "round-robin",
    "random",
    "sticky-rr",
    "oracle",
)
SWEEP_LOADS = (0.2, 0.4, 0.6, 0.8, 1.0, 1.2)


def _split(raw: str) -> list[str]:
    return [n.strip() for n in raw.split(",") if n.strip()]


def _name_list(raw: str) -> list[str]:
    names = _split(raw)
    if not names:
        raise argparse.ArgumentTypeError("name at least one router")
    return names


def _names(known: tuple[str, ...]) -> type:
    def parse(raw: str) -> list[str]:
        names = _split(raw)
        unknown = [n for n in names if n not in known]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"choose from {', '.join(known)}")
        return names

    return parse  # type: ignore[return-value]


def _replicas(raw: str) -> list[tuple[int, bool]]:
    """`1,3i,3`: (count, sharing decisions) per entry; a trailing `i`: independent."""
    values: list[tuple[int, bool]] = []
    for part in (p.strip() for p in raw.split(",") if p.strip()):
        match = re.fullmatch(r"(\d+)(i?)", part)
        if match is None or int(match.group(1)) < 1:
            raise argparse.ArgumentTypeError("counts of at least 1, e.g. 1,3i,3")
        count = int(match.group(1))
        values.append((count, count > 1 and not match.group(2)))
    if not values:
        raise argparse.ArgumentTypeError("counts of at least 1, e.g. 1,3i,3")
    return values


def _window(raw: str) -> tuple[float, float]:
    try:
        start, end = (float(part) for part in raw.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError("START:END in seconds, e.g. 600:960") from None
    if not 0 <= start < end:
        raise argparse.ArgumentTypeError("0 <= START < END")
    return start, end


def _floats(raw: str) -> list[float]:
    try:
        values = [float(v) for v in raw.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("comma-separated numbers, e.g. 0.4,0.8") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError("positive numbers")
    return values


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add(
        "--workloads",
        type=_names(WORKLOADS),
        default=None,
        help=f"comma-separated, of {', '.join(WORKLOADS)} (default chat,unique; none with --trace)",
    )
    add(
        "--trace",
        type=Path,
        action="append",
        default=[],
        metavar="PATH",
        help="replay a Mooncake request trace (JSONL: timestamp, input_length, output_length, "
        "hash_ids) as the workload trace:<file stem>, its prefixes exact and its arrivals "
        "in their recorded rhythm at --load; repeatable (docs/benchmarks.md)",
    )
    add(
        "--trace-window",
        type=_window,
        default=None,
        metavar="START:END",
        help="replay the requests of this slice of each trace, in seconds of trace time",
    )
    add(
        "--trace-max-output",
        type=int,
        default=None,
        metavar="N",
        help="cap each replayed answer at N tokens",
    )
    add(
        "--trace-scale",
        type=float,
        default=None,
        metavar="F",
        help="every length of each trace times F: its 512-token blocks, prompts and answers "
        f"(default 1; {REAL_TRACE_SCALE:g} with --engines vllm:N)",
    )
    add(
        "--trace-speed",
        type=float,
        default=None,
        metavar="X",
        help="replay traces X times faster than recorded instead of at --load",
    )
    add(
        "--routers",
        type=_name_list,
        default=list(DEFAULT_ROUTERS),
        help="comma-separated routers (default: kvgate's prefix-cache, prefix-share, "
        "least-request, round-robin, random, the sticky-rr baseline and the oracle); "
        f"of {', '.join((*KVGATE_POLICIES, *BASELINES, *PEERS))} and the profiles "
        "--routing-config declares",
    )
    add(
        "--routing-config",
        type=Path,
        default=os.environ.get("KVGATE_ROUTING_CONFIG") or None,
        metavar="FILE",
        help="a routing config (TOML or YAML, docs/routing.md) laid over the built-in "
        "policies of every kvgate in the run: its profiles can be named in --routers and "
        "the run folder keeps a copy (default: $KVGATE_ROUTING_CONFIG)",
    )
    add(
        "--mode",
        type=_names(VIAS),
        default=["proxy"],
        metavar="proxy|epp[,...]",
        help="how the load reaches kvgate's policies: proxy (through kvgate serve, the "
        "default) or epp (kvgate epp picks over Envoy's ext_proc, the load generator plays "
        "Envoy and sends each request straight to the picked engine; one replica); "
        "proxy,epp runs each policy both ways, side by side (NAME@epp). The oracle, "
        "sticky-rr and the peers run as proxies only",
    )
    add(
        "--peers",
        action="store_true",
        help="also run sglang-router and vllm-router (cache_aware) and vllm-router's kv_aware "
        "(fed by the engines' KV events), from bench/.venvs",
    )
    add(
        "--engines",
        type=EngineChoice.parse,
        default=EngineChoice(8),
        metavar="N|sglang:N|vllm:N",
        help="N simulated engines, one process each (8); sglang:N: simulated SGLang engines "
        "(kvgate tokenizes chats in-process with the simulated model's files); "
        "vllm:N: N real vLLM engines on CPU, "
        "each on its own core (the scripts/e2e-vllm.sh venv; smaller workloads, traces "
        f"scaled by {REAL_TRACE_SCALE:g}; docs/benchmarks.md)",
    )
    add(
        "--replicas",
        type=_replicas,
        default=[(1, False)],
        metavar="N[,N...]",
        help="run kvgate's policies behind N gateway replicas, requests spread over them one "
        "by one, sharing their decisions (KVGATE_REPLICA_PEERS); Ni: N independent replicas; "
        "a list runs each (e.g. 1,3i,3; default 1)",
    )
    add(
        "--load",
        type=float,
        default=0.8,
        help="offered load, fraction of the fleet's ideal capacity (0.8)",
    )
    add(
        "--sweep",
        action="store_true",
        help=f"offered loads {','.join(map(str, SWEEP_LOADS))} (light to overload)",
    )
    add("--loads", type=_floats, default=None, help="the sweep's loads, e.g. 0.3,0.9,1.5")
    add(
        "--closed",
        type=int,
        default=None,
        metavar="USERS",
        help="closed loop with USERS concurrent users instead of Poisson arrivals",
    )
    add(
        "--ramp",
        type=float,
        default=None,
        metavar="SECONDS",
        help="closed loop: the users join one by one over this many model seconds "
        "(default: at the rate of 80%% of the fleet's ideal capacity; 0: all at once)",
    )
    add("--conversations", type=int, default=None, help="conversations per workload (160)")
    add("--turns", type=int, default=None, help="turns per chat conversation (5)")
    add(
        "--time-scale",
        type=float,
        default=None,
        help="engines run this many times faster than the modelled GPU "
        "(default: per workload, so that its ideal capacity is --wall-rate)",
    )
    add(
        "--wall-rate",
        type=float,
        default=None,
        help="requests per wall second at 100%% load when --time-scale is not given "
        f"(default {WALL_RATE:g}; {TRACE_WALL_RATE:g} for a trace, whose long prompts cost "
        "more CPU each)",
    )
    add("--seed", type=int, default=0, help="workload seed (same seed, same requests)")
    add(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="run the routers N times per workload and load, their order reversed each "
        "time; the table and the targets then use each figure's median, with its range",
    )
    add(
        "--kill-replica", action="store_true",
        help="with --replicas N (N > 1): kill one replica once a third of the requests are "
        "answered and start its replacement (bootstrapping from a peer); reports requests "
        "lost, failures on the others, and how the replacement routes",
    )  # fmt: skip
    add("--quick", action="store_true", help="a tiny run (2 engines, a few dozen requests)")
    add("--run", default=None,
        help="results folder name under bench/results/runs/routing/ "
        "(with --keep bench/results/routing/)")  # fmt: skip
    add("--out", type=Path, default=None, help="results folder (overrides --run)")
    add("--quiet", action="store_true", help="no per-run status lines on stderr")
    add(
        "--keep-records",
        action="store_true",
        help="keep each run's per-request records (logs/<workload>/load-*.records.json)",
    )
    add(
        "--slo-tpot-ms",
        type=float,
        default=None,
        metavar="MS",
        help="send every request with x-slo-tpot-ms (this many model ms per output token) "
        "and report the share of answers that met it",
    )
    add(
        "--no-slo-header",
        action="store_true",
        help="with --slo-tpot-ms: report the share that met it without sending the header "
        "(the routers as they are without the objective)",
    )


def run(args: argparse.Namespace) -> int:
    from bench.routing.runner import RoutingOptions, run_routing
    from gateway.errors import ConfigError
    from gateway.routing.config import normalise, read_config

    checks = {
        "--load": args.load <= 0,
        "--closed": args.closed is not None and args.closed < 1,
        "--ramp": args.ramp is not None and args.ramp < 0,
        "--conversations": args.conversations is not None and args.conversations < 1,
        "--turns": args.turns is not None and args.turns < 1,
        "--time-scale": args.time_scale is not None and args.time_scale <= 0,
        "--wall-rate": args.wall_rate is not None and args.wall_rate <= 0,
        "--repeat": args.repeat < 1,
        "--trace-max-output": args.trace_max_output is not None and args.trace_max_output < 1,
        "--trace-speed": args.trace_speed is not None and args.trace_speed <= 0,
        "--trace-scale": args.trace_scale is not None and not 0 < args.trace_scale <= 1,
    }
    bad = [name for name, wrong in checks.items() if wrong]
    if bad:
        print(f"kvgate bench routing: invalid value for {', '.join(bad)}")
        return 2
    try:
        traces = _traces(args)
    except (OSError, TraceError) as error:
        print(f"kvgate bench routing: --trace: {error}")
        return 2
    real = args.engines.real
    refused = [name for name in (*args.routers, *(args.workloads or ()))
               if name in ("oracle", "hetero")]  # fmt: skip
    if real and refused:
        print(f"kvgate bench routing: {', '.join(refused)} not with --engines vllm:N (the "
              "oracle reads the simulator's tokenizer; hetero needs engines of two "
              "speeds)")  # fmt: skip
        return 2
    if traces and args.closed:
        print("kvgate bench routing: --trace replays the trace's arrivals (open loop); "
              "--closed does not apply")  # fmt: skip
        return 2
    config_profiles: tuple[str, ...] = ()
    if args.routing_config is not None:
        try:
            declared = normalise(read_config(args.routing_config), str(args.routing_config))
        except ConfigError as error:
            print(f"kvgate bench routing: --routing-config: {error}")
            return 2
        config_profiles = tuple(name for name in declared if name not in KVGATE_POLICIES)
    known = (*KVGATE_POLICIES, *config_profiles, *BASELINES, *PEERS)
    unknown = [name for name in args.routers if name not in known]
    if unknown:
        print(f"kvgate bench routing: unknown router {', '.join(unknown)}; choose from "
              f"{', '.join(known)}")  # fmt: skip
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if real and not args.quick:
        size = dataclasses.replace(
            REAL_SIZE,
            conversations=args.conversations or REAL_SIZE.conversations,
            turns=args.turns or REAL_SIZE.turns,
        )
    elif args.quick:
        size = WorkloadSize(
            conversations=args.conversations or 6,
            turns=args.turns or 3,
            system_words=256,
            user_words_median=40,
            answer_tokens_median=8,
        )
    else:
        default = WorkloadSize()
        size = WorkloadSize(
            conversations=args.conversations or default.conversations,
            turns=args.turns or default.turns,
        )
    routers = list(args.routers) + [p for p in PEERS if args.peers and p not in args.routers]
    workloads = args.workloads or ([] if traces else ["chat", "unique"])
    loads = args.loads or (list(SWEEP_LOADS) if args.sweep else [args.load])
    run_name = args.run or ("sweep" if args.sweep else time.strftime("%Y%m%d-%H%M%S"))
    options = RoutingOptions(
        workloads=[*workloads, *(trace.name for trace in traces)],
        traces=tuple(traces),
        real_engines=real,
        engine_flavor=args.engines.flavor,
        trace_speed=args.trace_speed,
        routers=routers,
        engines=args.engines.count,
        replicas=list(args.replicas),
        kill_replica=args.kill_replica,
        loads=loads,
        mode="closed" if args.closed else "open",
        concurrency=args.closed or 0,
        size=size,
        time_scale=args.time_scale,
        wall_rate=args.wall_rate,
        seed=args.seed,
        out_dir=args.out or results_dir(args.keep) / "routing" / run_name,
        quiet=args.quiet,
        keep_records=args.keep_records,
        slo_tpot_ms=args.slo_tpot_ms,
        send_slo=not args.no_slo_header,
        ramp_s=args.ramp,
        repeat=args.repeat,
        routing_config=args.routing_config,
        config_profiles=config_profiles,
        vias=tuple(dict.fromkeys(args.mode)),
    )
    return run_routing(options)


def _traces(args: argparse.Namespace) -> list[TraceSpec]:
    """The --trace files, each read once here so that a bad one stops the run at once."""
    scale = args.trace_scale or (REAL_TRACE_SCALE if args.engines.real else 1.0)
    specs = [TraceSpec(str(path), args.trace_window, args.trace_max_output, scale)
             for path in args.trace]  # fmt: skip
    names = [spec.name for spec in specs]
    if len(set(names)) < len(names):
        raise TraceError(f"two traces of one name ({', '.join(names)}): rename a file")
    for spec in specs:
        load_trace(spec)
    return specs
