#!/usr/bin/env bash
# The whole check: lint, format, types, tests. This is what .ci/run runs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"

echo "== ruff check" && ruff check .
echo "== ruff format --check" && ruff format --check .
echo "== mypy --strict indexer/ subscriber/ simulator/" && mypy --strict indexer/ subscriber/ simulator/
echo "== pytest"
set +e
pytest "$@"
status=$?
set -e
# 5 = no tests collected; not a failure for this project.
if [ "$status" -eq 5 ]; then exit 0; fi
exit "$status"
