"""`kvgate bench subscriber`: KV events/s one gateway process ingests, and gap recovery time
(figures: docs/benchmarks.md).

The gateway side (a `SubscriberManager` feeding an `IndexSink` over a
`SyncPrefixHashTable`, as `kvgate serve` runs it) lives in this process; each engine is a
process of its own driving the simulator's paged prefix cache, event collector, vLLM wire
encoder and `EventPublisher`, so one step's cache changes are one vLLM batch.

Phases, the subscriber live throughout (`phases.py`): live (engines step and publish as
fast as they can: on a small machine they, not the subscriber, set the pace); burst
(batches prepared untimed, then sent back to back: the subscriber drains a backlog at its
own pace, the ingest rate reported); gaps (batches dropped from PUB but kept for replay:
time until the index holds everything announced); overrun (a gap longer than the replay
buffer: time until live again, and how much the index learns back from new events).
After each, every pod's index is compared with what its engine's cache holds.

Modules: `workload` (what an engine serves), `engines` (the engine processes), `gateway`
(the subscriber side and its counters), `phases`, `report` (table and plot), `cli`.
"""
