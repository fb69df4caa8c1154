"""Paths of the golden wire captures (see README.md)."""

from pathlib import Path

GOLDEN = Path(__file__).resolve().parent
FRAMES = GOLDEN / "vllm-0.32.0-cpu-frames.jsonl"
TOKENIZE = GOLDEN / "vllm-0.32.0-cpu-frames-tokenize.json"
METRICS = GOLDEN / "vllm-0.32.0-cpu-metrics.txt"
ENDPOINTS = GOLDEN / "vllm-0.32.0-cpu-endpoints.txt"
