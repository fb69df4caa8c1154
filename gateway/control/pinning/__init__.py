"""Pinning: keep a session's KV cache on its pod (leases, engine calls, reconciliation).

Modules: `leases` (the lease book and pin ledger), `client` (the engine's pin API and cache
size), `manager` (PinManager), `api` (admin routes), `session` (the `x-kvgate-pin` header).
"""
