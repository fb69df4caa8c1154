"""Replicas that share their routing decisions over an authenticated, bounded channel."""

from __future__ import annotations

from gateway.replication.bounds import Fleet, RegistryFleet
from gateway.replication.channel import ReplicaSync
from gateway.replication.collector import ReplicaSyncCollector
from gateway.replication.keys import CurveKeys, load_keys, local_endpoint
from gateway.replication.wire import MAX_MESSAGE_BYTES

__all__ = [
    "MAX_MESSAGE_BYTES",
    "CurveKeys",
    "Fleet",
    "RegistryFleet",
    "ReplicaSync",
    "ReplicaSyncCollector",
    "load_keys",
    "local_endpoint",
]
