"""`kvgate demo`: a simulated fleet, the gateway and a chat workload, round-robin vs
prefix-cache routing (see `runner.py`)."""

from __future__ import annotations

from bench.demo.plan import DemoPlan, make_plan
from bench.demo.runner import DemoOptions, run_demo

__all__ = ["DemoOptions", "DemoPlan", "make_plan", "run_demo"]
