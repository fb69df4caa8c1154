"""`python burst_client.py URL N MODEL`: N chat requests at once from one process, each on its
own connection (httpx), as a load generator or the clients behind an ingress send them;
prints the count of each status as JSON. Run in its own process so that the gateway reads
each body as it comes, not in the same event-loop turn as its headers."""

from __future__ import annotations

import asyncio
import collections
import json
import sys

import httpx


async def burst(url: str, n: int, model: str) -> dict[int, int]:
    body = json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
    ).encode()
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:
        answers = await asyncio.gather(
            *(client.post("/v1/chat/completions", content=body) for _ in range(n))
        )
    return dict(collections.Counter(answer.status_code for answer in answers))


if __name__ == "__main__":
    url, n, model = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    print(json.dumps(asyncio.run(burst(url, n, model))))
