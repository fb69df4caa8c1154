"""`kvgate demo`: a simulated fleet, the gateway and a chat workload, round-robin vs
prefix-cache routing (see `runner.py`)."""
