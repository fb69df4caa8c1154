#!/usr/bin/env bash
# tests/indexer against indexer/_native.c built with AddressSanitizer and
# UndefinedBehaviorSanitizer: any out-of-bounds access, use after free, misaligned read,
# overflowing shift or signed overflow in the C index stops the run with a report.
#
# The sanitized build goes to build/sanitize/ (never over the installed extension);
# tests/indexer/conftest.py imports it as indexer._native when KVGATE_TEST_NATIVE_BUILD
# names it, and tests/indexer/test_native.py checks that it is the module under test.
# Python itself is not instrumented: libasan is preloaded, and PYTHONMALLOC=malloc sends
# every PyMem_* allocation (the extension's own) through the sanitizer's malloc. Leak
# detection is off: the interpreter keeps its own objects alive at exit.
# Extra arguments go to pytest (e.g. -k map). Run by scripts/test.sh after its pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-}"
if [ -z "$PYTHON" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python; fi
fi
CC="${CC:-gcc}"

if ! command -v "$CC" >/dev/null 2>&1; then
    echo "sanitize: installing gcc with apt (it brings libasan and libubsan)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends gcc libc6-dev python3-dev >/dev/null
fi
libasan="$("$CC" -print-file-name=libasan.so)"
if [ ! -f "$libasan" ]; then
    echo "sanitize: $CC has no AddressSanitizer runtime (libasan.so); install gcc's" >&2
    echo "sanitize: runtime libraries (Debian: libgcc-<version>-dev) and re-run" >&2
    exit 2
fi

include="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
suffix="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"
out="build/sanitize/indexer/_native$suffix"
mkdir -p "$(dirname "$out")"
# -ffp-contract=off as in the normal build (pyproject.toml). No -fwrapv (Python's own
# CFLAGS have it): signed overflow is reported, not defined away.
"$CC" -shared -fPIC -std=gnu11 -I"$include" -o "$out" indexer/_native.c \
    -O1 -g -fno-omit-frame-pointer -ffp-contract=off \
    -fsanitize=address,undefined -fno-sanitize-recover=all \
    -Wall -Wextra -Wno-unused-parameter -Werror
echo "sanitize: built $out" >&2

# --capture=sys: a sanitizer writes its report to file descriptor 2 and ends the process,
# so pytest must not hold that descriptor in a capture file it never prints.
env -u KVGATE_PURE_PYTHON \
    KVGATE_TEST_NATIVE_BUILD="$out" \
    LD_PRELOAD="$libasan" \
    PYTHONMALLOC=malloc \
    ASAN_OPTIONS=detect_leaks=0:strict_string_checks=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$PYTHON" -m pytest -q -p no:cacheprovider --capture=sys \
    tests/indexer "$@"
