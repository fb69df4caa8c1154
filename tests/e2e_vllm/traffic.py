"""Requests for the real engine: shared long system prompts, variations, chat and plain."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import httpx

SUBJECTS = ("radix trees", "prefix caches", "KV events", "load balancing", "tokenizers")
QUESTIONS = (
    "What is a radix tree?",
    "How does a gateway pick a pod?",
    "Why are blocks evicted?",
    "What does the replay socket do?",
    "Explain prefix hashing in one line.",
)


def system_prompt(index: int) -> str:
    """A long (~700-token) system prompt; each index gives a different one."""
    subject = SUBJECTS[index % len(SUBJECTS)]
    sentence = f"You are assistant {index}, a helpful expert on {subject} for the e2e test. "
    return sentence * 40


@dataclass(frozen=True, slots=True)
class Request:
    """One completion: a plain prompt (text or token ids) or chat messages."""

    prompt: str | tuple[int, ...] | None = None
    messages: tuple[dict[str, str], ...] | None = None
    max_tokens: int = 16

    def tokenize_body(self, model: str) -> dict[str, Any]:
        if self.messages is not None:
            return {"model": model, "messages": list(self.messages)}
        return {"model": model, "prompt": self.prompt}

    def completion(self, model: str) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {
            "model": model,
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "ignore_eos": True,
        }
        if self.messages is not None:
            return "/v1/chat/completions", {**body, "messages": list(self.messages)}
        if isinstance(self.prompt, tuple):
            return "/v1/completions", {**body, "prompt": list(self.prompt)}
        return "/v1/completions", {**body, "prompt": self.prompt}


def chat(system: str, user: str, max_tokens: int = 16) -> Request:
    messages = ({"role": "system", "content": system}, {"role": "user", "content": user})
    return Request(messages=messages, max_tokens=max_tokens)


def plain(system: str, user: str, max_tokens: int = 16) -> Request:
    return Request(prompt=f"{system}\nQuestion: {user}\nAnswer:", max_tokens=max_tokens)


def workload(systems: int = 5, variations: int = 5) -> list[Request]:
    """systems × variations × {chat, plain}: shared prefixes, and more blocks than fit.

    System by system, so the variations of one system prompt hit its cached blocks, and
    the next systems' blocks evict them (5 systems × 2 forms × ~22 blocks > 128).
    """
    requests = []
    for index in range(systems):
        system = system_prompt(index)
        for variation in range(variations):
            question = QUESTIONS[variation % len(QUESTIONS)]
            requests.append(chat(system, question))
            requests.append(plain(system, question))
    return requests


async def send(client: httpx.AsyncClient, model: str, request: Request) -> dict[str, Any]:
    path, body = request.completion(model)
    response = await client.post(path, json=body)
    response.raise_for_status()
    answer: dict[str, Any] = response.json()
    return answer


async def send_all(
    client: httpx.AsyncClient, model: str, requests: list[Request], concurrency: int = 4
) -> list[dict[str, Any]]:
    """Send every request, at most `concurrency` at once; answers in request order."""
    gate = asyncio.Semaphore(concurrency)

    async def one(request: Request) -> dict[str, Any]:
        async with gate:
            return await send(client, model, request)

    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(one(request)) for request in requests]
    return [task.result() for task in tasks]


async def tokenize(client: httpx.AsyncClient, model: str, request: Request) -> list[int]:
    response = await client.post("/tokenize", json=request.tokenize_body(model))
    response.raise_for_status()
    tokens: list[int] = response.json()["tokens"]
    return tokens
