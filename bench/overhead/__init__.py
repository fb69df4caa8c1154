"""`kvgate bench overhead`: what the gateway adds to calling the engine directly.

Three kinds of process on loopback: simulated engines (`python -m simulator`, huge
`--time-scale`, one generated token, so the engine is fast), one gateway (`kvgate serve`,
the product as users run it; it forwards to the engines over its own keep-alive HTTP/1.1
pool, `gateway/http1.py`, not httpx) and the load generator (this process). Every figure
compares the same requests sent by the same client over keep-alive connections, directly to
the engine and through the gateway:

- added latency p50/p99 (gateway percentile minus direct percentile) at concurrency 1
  (direct and gateway requests alternate) and 32 (alternating blocks, closed loop), for
  `round-robin` (no tokenization) and `prefix-cache` (tokenize + match) with a repeated
  prompt (the gateway's tokenizer cache hits) and with distinct prompts (one /tokenize each);
- the same at concurrency 1 through a byte relay process (`c1_relay`): what one more process
  hop costs on this machine, the floor under any proxy's added latency;
- streaming: time from sending the request to the first SSE chunk, direct and via the gateway;
- max requests/s: closed loop, 64 in flight, small non-streamed round-robin requests.

CPU seconds of every process are read from /proc, so each phase also reports the gateway's
CPU per request and which process saturates. The load generator is a minimal keep-alive
HTTP/1.1 client on asyncio streams (`--client raw`, ~0.1 ms of CPU per request); an
httpx.AsyncClient (`--client httpx`) costs ~1 ms per request at concurrency 1 and ~5 ms at
64 (its connection pool scans every connection on each request), so it would measure itself.
`--profile-gateway PATH` runs the gateway under cProfile with a CPU-time clock (the figures
then include the profiler's overhead) and prints where its CPU goes.

Modules: `fleet` (the child processes), `channels` (the load generator's clients), `phases`
(cases, comparisons, closed loop, throughput, figures), `report` (table, plot, profile) and
`cli` (flags, plan, the run).
"""
