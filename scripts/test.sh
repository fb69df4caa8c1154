#!/usr/bin/env bash
# The whole check: lint, format, types, tests. This is what .ci/run runs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"
# tests/deploy runs `promtool check metrics` on a live /metrics page and a real Prometheus
# server against a live gateway; Debian's `prometheus` package ships both (the tests skip,
# saying why, only if it cannot be installed).
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
    echo "test: installing promtool (Debian package prometheus) with apt" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends prometheus >/dev/null; } \
        || echo "test: could not install promtool; its checks in tests/deploy will skip" >&2
fi

echo "== ruff check" && ruff check .
echo "== ruff format --check" && ruff format --check .
echo "== mypy --strict" && mypy --strict indexer/ predictor/ subscriber/ simulator/ gateway/ bench/ tokenization/
# Fails only on a known vulnerability; says "skipped" when no vulnerability database answers.
echo "== dependency audit" && python scripts/audit_deps.py
echo "== pytest"
set +e
pytest "$@"
status=$?
if [ "$status" -eq 5 ]; then status=0; fi  # 5 = no tests collected: not a failure here
# The index has two implementations (indexer/native.py): the run above used the compiled
# one wherever it was built; the indexer's tests run again on the pure-Python one.
if [ "$#" -eq 0 ] && [ "$status" -eq 0 ]; then
    echo "== pytest tests/indexer with KVGATE_PURE_PYTHON=1"
    KVGATE_PURE_PYTHON=1 pytest -q tests/indexer
    status=$?
fi
# The compiled index is C: its tests run once more on a build with AddressSanitizer and
# UndefinedBehaviorSanitizer (scripts/sanitize_native.sh), which stop at the first error.
if [ "$#" -eq 0 ] && [ "$status" -eq 0 ]; then
    echo "== sanitizers: tests/indexer on indexer/_native.c with ASan+UBSan"
    scripts/sanitize_native.sh
    status=$?
fi
set -e
exit "$status"
