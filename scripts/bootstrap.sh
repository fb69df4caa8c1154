#!/usr/bin/env bash
# Creates .venv/ (once) and installs kvgate with its dev tools into it.
# Re-runs pip only when pyproject.toml or the C extension's source (indexer/_native.c and
# the xxhash.h it includes, compiled by the install) changed since the last install.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
if ! command -v "$PYTHON" >/dev/null 2>&1; then
    echo "bootstrap: installing python3 with apt" >&2
    apt-get update -qq && apt-get install -y -qq python3 python3-venv python3-pip >/dev/null
fi
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "bootstrap: kvgate needs Python >= 3.11, found $("$PYTHON" --version 2>&1)" >&2
    exit 2
fi
if [ ! -x .venv/bin/python ]; then
    if ! "$PYTHON" -m venv .venv 2>/dev/null; then
        echo "bootstrap: installing python3-venv with apt" >&2
        apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
        "$PYTHON" -m venv .venv
    fi
fi

# The index's compiled primitives (indexer/_native.c) need a C compiler and Python's
# headers; without them the install still succeeds and the index runs in pure Python.
if ! command -v cc >/dev/null 2>&1 || ! .venv/bin/python -c 'import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then
    echo "bootstrap: installing a C compiler and Python headers with apt (optional)" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends gcc libc6-dev python3-dev >/dev/null; } \
        || echo "bootstrap: no C compiler: the index will run in pure Python" >&2
fi

stamp=.venv/.kvgate-installed
want="$(cat pyproject.toml indexer/_native.c indexer/third_party/xxhash.h | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] || [ ! -x .venv/bin/kvgate ]; then
    echo "bootstrap: installing kvgate and its dependencies into .venv/" >&2
    .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
    .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]'
    echo "$want" > "$stamp"
fi
