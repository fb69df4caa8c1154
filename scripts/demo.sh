#!/usr/bin/env bash
# The main job: sets up .venv/ and runs `kvgate demo` — simulated engines + the gateway +
# a multi-turn workload, round-robin vs prefix-cache — then keeps the gateway serving
# until Ctrl-C. Extra arguments are passed on (e.g. --no-serve, --engines 8).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
exec .venv/bin/kvgate demo "$@"
