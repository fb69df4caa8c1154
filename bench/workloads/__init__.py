"""Workload generators for kvgate's benchmarks and demo (deterministic per seed)."""
