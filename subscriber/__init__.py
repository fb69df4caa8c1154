"""kvgate subscriber: KV event decoding, per-pod ZMQ subscribers with replay, their manager."""

from indexer import EngineHash
from subscriber.client import PodSubscriber
from subscriber.events import (
    DECODE_REASONS,
    DEFAULT_LIMITS,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    DecodeError,
    DecodeLimits,
    DecodeReason,
    KVEvent,
    KVEventBatch,
    decode_batch,
    encode_batch,
)
from subscriber.frames import (
    REPLAY_END_SEQ,
    ReplayEnd,
    ReplayEntry,
    decode_pub_message,
    decode_replay_message,
    decode_replay_request,
    encode_pub_message,
    encode_replay_end,
    encode_replay_entry,
    encode_replay_request,
)
from subscriber.manager import SubscriberManager
from subscriber.rejects import RejectCounter, RejectVerdict
from subscriber.replay import ReplayUnavailableError, fetch_replay
from subscriber.sink import BatchSink, IndexSink
from subscriber.status import (
    RESET_CAUSES,
    Phase,
    PodEndpoint,
    PodSubscriberStatus,
    ResumePoint,
    SubscriberSettings,
)

__all__ = [
    "DECODE_REASONS",
    "DEFAULT_LIMITS",
    "REPLAY_END_SEQ",
    "RESET_CAUSES",
    "AllBlocksCleared",
    "BatchSink",
    "BlockRemoved",
    "BlockStored",
    "DecodeError",
    "DecodeLimits",
    "DecodeReason",
    "EngineHash",
    "IndexSink",
    "KVEvent",
    "KVEventBatch",
    "Phase",
    "PodEndpoint",
    "PodSubscriber",
    "PodSubscriberStatus",
    "RejectCounter",
    "RejectVerdict",
    "ReplayEnd",
    "ReplayEntry",
    "ReplayUnavailableError",
    "ResumePoint",
    "SubscriberManager",
    "SubscriberSettings",
    "decode_batch",
    "decode_pub_message",
    "decode_replay_message",
    "decode_replay_request",
    "encode_batch",
    "encode_pub_message",
    "encode_replay_end",
    "encode_replay_entry",
    "encode_replay_request",
    "fetch_replay",
]
