"""Workload generators for kvgate's benchmarks and demo (deterministic per seed)."""

from __future__ import annotations

from bench.workloads.chat import ChatWorkload, ChatWorkloadConfig, Session, Turn, generate

__all__ = ["ChatWorkload", "ChatWorkloadConfig", "Session", "Turn", "generate"]
