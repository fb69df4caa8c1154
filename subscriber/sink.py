"""Where a pod's decoded event batches go: the prefix index."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from indexer import EngineHash, SyncPrefixHashTable
from subscriber.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch


class BatchSink(Protocol):
    """Receives one pod's batches in sequence order, each exactly once."""

    def register(self, pod: str, model: str, lora_names: Mapping[int, str]) -> None:
        """The pod starts publishing; it holds nothing yet as far as the sink knows."""

    def apply(self, pod: str, batch: KVEventBatch) -> None: ...

    def reset(self, pod: str) -> None:
        """Forget everything the pod held (engine restarted, or events were lost)."""

    def unregister(self, pod: str) -> None: ...


class IndexSink:
    """Applies batches to a `SyncPrefixHashTable`.

    Consecutive BlockRemoved events of one medium (vLLM sends one hash per event, many
    events per batch) are applied in one call.
    """

    def __init__(self, table: SyncPrefixHashTable) -> None:
        self.table = table

    def register(self, pod: str, model: str, lora_names: Mapping[int, str]) -> None:
        self.table.register_pod(pod, model, lora_names=lora_names)

    def apply(self, pod: str, batch: KVEventBatch) -> None:
        table = self.table
        removed: list[EngineHash] = []
        removed_medium: str | None = None
        for event in batch.events:
            if isinstance(event, BlockRemoved):
                if removed and event.medium != removed_medium:
                    table.apply_removed(pod, removed, removed_medium)
                    removed = []
                removed.extend(event.block_hashes)
                removed_medium = event.medium
                continue
            if removed:
                table.apply_removed(pod, removed, removed_medium)
                removed = []
            if isinstance(event, BlockStored):
                table.apply_stored(pod, event)
            elif isinstance(event, AllBlocksCleared):
                table.apply_cleared(pod)
        if removed:
            table.apply_removed(pod, removed, removed_medium)

    def reset(self, pod: str) -> None:
        self.table.apply_cleared(pod)

    def unregister(self, pod: str) -> None:
        self.table.remove_pod(pod)
