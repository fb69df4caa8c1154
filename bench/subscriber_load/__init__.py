"""`kvgate bench subscriber`: KV events/s one gateway process ingests, and gap recovery time.

The gateway side (a `SubscriberManager` feeding an `IndexSink` over a `SyncPrefixHashTable`,
as `kvgate serve` runs it) lives in this process. Each simulated engine is a separate
process (`python -m bench.subscriber_load.engines`, driven over its stdin and stdout) that
drives the simulator's own paged prefix cache, event collector, vLLM wire encoder and
`EventPublisher` (PUB + replay ROUTER on loopback ports it binds itself): every step
serves a few requests (shared system prompts, continued conversations, unique tails), and
the cache changes of that step — BlockStored chains with their parents, BlockRemoved
evictions once the cache is full — are one vLLM batch.

Phases (the subscriber stays live throughout):
1. live (`--seconds`): every engine steps its cache and publishes each batch at once, as
   fast as it can; on a small machine the engines, not the subscriber, set the pace;
2. burst (`--batches`): every engine prepares N batches (untimed, nothing sent), then sends
   them back to back: the subscriber drains a backlog at its own pace, which is the ingest
   rate reported: batches, events and block hashes applied to the index from the first
   send until the last batch is applied (the live rates leave out the first 20 % and the
   last 10 % of that window). A probe task records how long the event loop went without
   running it (stalls).
   After each of these phases, every pod's `table.dump` is compared with the hashes its
   engine's cache holds;
3. gaps: one engine drops K batches from its PUB socket (they stay in its replay buffer, as
   the sim's `drop_batches` fault does) and publishes one more; recovery is the time from
   that batch's send to the moment the pod's index holds everything the engine announced;
4. overrun: an engine whose replay buffer is smaller than the gap; recovery is the time
   until the pod is live again; the index must hold nothing the engine does not. Then the
   engine publishes for another second: how much of its cache does the index learn again?

Figures (JSON keys): ingest_events_per_s, ingest_batches_per_s, ingest_blocks_per_s,
ingest_events_per_cpu_s, subscriber_cpu_s, ingest_event_loop_max_stall_ms, live_*,
index_equals_engines, gap_recovery_p50_ms, gap_recovery_max_ms, overrun_recovery_ms,
overrun_missing_after_churn (and the counters behind them).

Modules: `workload` (what an engine serves), `engines` (the engine processes), `gateway`
(the subscriber side and its counters), `phases` (what is measured), `report` (table and
plot) and `cli` (flags, config, the run).
"""
