"""`kvgate bench overhead`: what the gateway adds to calling the engine directly (figures
and what limits them: docs/benchmarks.md).

Engines (huge `--time-scale`, one token: fast), one `kvgate serve` and the load generator
(this process) each run in their own process on loopback. Every figure compares the same
requests from the same client over keep-alive connections, directly to the engine and
through the gateway (or a byte relay: one more process hop, the floor under any proxy);
direct and gateway requests alternate, so drift affects both alike. CPU seconds of every
process come from /proc, so each phase also tells which process saturates. The client is
a minimal HTTP/1.1 one (`channels.py`): httpx would mostly measure itself.

Modules: `fleet` (the child processes), `channels` (the clients), `phases` (cases,
closed loop, throughput), `streams` (many concurrent long streams), `report` (table, plot,
profile) and `cli` (flags, plan, the run).
"""
