"""The pipeline every benchmark shares: child processes (`processes`), ports, simulated
engines (`fleet`) and their counters (`engine_stats`), the gateway under test (`gateway`),
readiness waits, streamed requests and their records (`streaming`), and a probe of the
event loop."""
