"""Replicas that share their routing decisions over an authenticated, bounded channel."""

from __future__ import annotations

from gateway.control.replication.bounds import Fleet, RegistryFleet
from gateway.control.replication.channel import ReplicaSync
from gateway.control.replication.collector import ReplicaSyncCollector
from gateway.control.replication.keys import CurveKeys, load_keys, local_endpoint
from gateway.control.replication.wire import MAX_MESSAGE_BYTES

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
