"""The gateway overhead benchmark's tables (bench/results/overhead.json): latency added per
case, tokenizing in-process against the engine's `/tokenize`, and long concurrent streams."""

from __future__ import annotations

from pathlib import Path

from bench.tables.components import load
from bench.tables.markdown import num, table

_CASES = (
    ("c1", "round-robin, c=1"),
    ("c1_relay", "a bare byte relay (no HTTP parsing), c=1"),
    ("c32", "round-robin, c=32"),
    ("c1_tokenized_local", "prefix-cache, repeated prompt, c=1"),
    ("c1_tokenized_distinct_local", "prefix-cache, distinct prompts, c=1"),
    ("c1_chat_distinct_local", "prefix-cache, distinct chats, c=1"),
    ("c32_tokenized_distinct_local", "prefix-cache, distinct prompts, c=32"),
    ("c32_chat_distinct_local", "prefix-cache, distinct chats, c=32"),
    ("stream", "first streamed chunk, round-robin, c=1"),
)

_TOKENIZED = (
    ("c1_tokenized", "text, repeated, c=1"),
    ("c1_tokenized_distinct", "text, distinct, c=1"),
    ("c1_chat_distinct", "chat, distinct, c=1"),
    ("c32_tokenized", "text, repeated, c=32"),
    ("c32_tokenized_distinct", "text, distinct, c=32"),
    ("c32_chat_distinct", "chat, distinct, c=32"),
)


def _ms(value: float) -> str:
    return f"{value:+.2f}"


def overhead(results: Path) -> str:
    d = load(results, "overhead.json")
    rows = []
    for key, label in _CASES:
        case = d["cases"][key]
        cpu = case.get("gateway_cpu_us_per_request")
        rows.append((
            label, _ms(case["added_p50_ms"]), _ms(case["added_p99_ms"]),
            "—" if cpu is None or case["via"] == "relay" else num(cpu),
        ))  # fmt: skip
    t = d["throughput"]
    rows.append((
        f"max requests/s at c={t['concurrency']}: gateway / engine alone",
        f"{num(t['max_rps_gateway'])} / {num(t['max_rps_direct'])}", "",
        num(t["gateway_cpu_us_per_request"]["gateway"]),
    ))  # fmt: skip
    head = ["case (in-process tokenizer)", "added p50 (ms)", "added p99 (ms)"]
    return table([*head, "gateway CPU / request (µs)"], rows)


def _pair(sides: tuple[dict[str, float], dict[str, float]], figure: str) -> str:
    """A figure in-process and at `/tokenize`, side by side."""
    if any(figure not in side for side in sides):
        return "—"
    fmt = _ms if figure.endswith("_ms") else num
    return " \\| ".join(fmt(side[figure]) for side in sides)


def tokenizers(results: Path) -> str:
    d = load(results, "overhead.json")["tokenizers"]
    rows = []
    for key, label in _TOKENIZED:
        sides = d[key]["local"], d[key]["remote"]
        rows.append((
            label, _pair(sides, "added_p50_ms"), _pair(sides, "added_p99_ms"),
            _pair(sides, "gateway_cpu_us_per_request"), _pair(sides, "engines_cpu_us_per_request"),
        ))  # fmt: skip
    head = ["case: in-process \\| `/tokenize`", "added p50 (ms)", "added p99 (ms)"]
    return table([*head, "gateway CPU / request (µs)", "engine CPU / request (µs)"], rows)


def streams(results: Path) -> str:
    d = load(results, "overhead.json")["streaming"]
    config, direct = d["config"], d["targets"]["direct"]
    rows = [(
        "direct (absolute)", "—", f"{direct['ttft_p50_ms']:.1f} / {direct['ttft_p99_ms']:.1f}",
        f"{direct['ttft_outside_engine_mean_ms']:.1f}",
        f"{direct['itl_p50_ms']:.1f} / {direct['itl_p99_ms']:.1f}",
    )]  # fmt: skip
    for name, r in d["routers"].items():
        rows.append((
            f"{name} (added)",
            f"{r['stream_cpu_ms_per_1k_chunks']:.1f} "
            f"({r['stream_background_cpu_ms_per_1k_chunks']:.1f})",
            f"{_ms(r['stream_added_ttft_p50_ms'])} / {_ms(r['stream_added_ttft_p99_ms'])}",
            _ms(r["stream_added_ttft_outside_engine_mean_ms"]),
            f"{_ms(r['stream_added_itl_p50_ms'])} / {_ms(r['stream_added_itl_p99_ms'])}",
        ))  # fmt: skip
    head = [
        f"{config['streams']} streams at once, {config['tokens_per_stream']} tokens each",
        "CPU per 1,000 chunks, ms (background)",
        "TTFT p50 / p99 (ms)",
        "TTFT outside the engine, mean (ms)",
        "inter-chunk p50 / p99 (ms)",
    ]
    return table(head, rows)
