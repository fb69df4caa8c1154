"""The `sticky-rr` baseline: the simplest cache-friendly client, as a router process.

`python -m bench.routing.sticky_rr PODS PORT`. A conversation's first turn goes to the next
engine in turn; every later turn of it (same `x-session-id`, which the load generator sends
on every request) goes to that same engine. No index, no load signal: it is what a client
that pins each conversation to the engine of its first turn gets, and the default policy
must beat or match it.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.routing.oracle import Engine, engines_of, serve

_MAX_CONVERSATIONS = 100_000


class StickyRoundRobin:
    def __init__(self, engines: list[Engine]) -> None:
        self.engines = engines
        self._turns = itertools.cycle(range(len(engines)))
        self._homes: OrderedDict[str, Engine] = OrderedDict()

    def pick(self, body: dict[str, Any], headers: Mapping[str, str]) -> Engine:
        conversation = headers.get("x-session-id")
        home = self._homes.get(conversation) if conversation is not None else None
        if home is None:
            home = self.engines[next(self._turns)]
            if conversation is not None:
                self._homes[conversation] = home
                if len(self._homes) > _MAX_CONVERSATIONS:
                    self._homes.popitem(last=False)
        return home

    async def run(self, ready: asyncio.Event) -> None:
        ready.set()
        await asyncio.Event().wait()  # nothing to do in the background


def main(argv: list[str]) -> int:
    return serve(StickyRoundRobin(engines_of(Path(argv[0]))), int(argv[1]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
