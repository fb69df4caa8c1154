#!/usr/bin/env bash
# The main job. Sets up .venv/ and runs kvgate's demonstration; extra arguments are passed on.
# Until the gateway and the simulated fleet land, the demonstration is the indexer benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
exec .venv/bin/kvgate bench indexer "$@"
