"""kvgate simulator: a simulated vLLM/SGLang engine speaking the real HTTP and KV-event wire."""

from simulator.cache import PagedPrefixCache
from simulator.cache_types import Allocation, Block, RecordingSink, Tier
from simulator.config import SimConfig
from simulator.engine import SimEngine
from simulator.latency import LatencyModel
from simulator.publisher import EventPublisher
from simulator.server import EngineServer
from simulator.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    EventEncoder,
    decode_batch,
)

__all__ = [
    "AllBlocksCleared",
    "Allocation",
    "Block",
    "BlockRemoved",
    "BlockStored",
    "EngineServer",
    "EventBatch",
    "EventEncoder",
    "EventPublisher",
    "LatencyModel",
    "PagedPrefixCache",
    "RecordingSink",
    "SimConfig",
    "SimEngine",
    "Tier",
    "decode_batch",
]
