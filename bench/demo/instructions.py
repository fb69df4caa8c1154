"""What the demo prints once the comparison is done and the gateway keeps serving."""

from __future__ import annotations

import json

_EXAMPLE_MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant. Answer each question about "
     "the cache of the engine in one short line, and explain why the request went to the "
     "engine it went to, with the value of the prefix and the hash of each block."},
    {"role": "user", "content": "hello"},
]  # fmt: skip


def serving_instructions(gateway_url: str, model: str, admin_token: str, engines: int) -> str:
    body = json.dumps({"model": model, "messages": _EXAMPLE_MESSAGES})
    return f"""
The gateway keeps running at {gateway_url} (default policy prefix-cache) in front of
{engines} simulated engines. Admin token of this demo: {admin_token}

Send a request with curl (the x-kvgate-* headers say where it went and what was cached):

  curl -s {gateway_url}/v1/chat/completions -H 'content-type: application/json' \\
    -d '{body}' -D - | grep -i x-kvgate

or with the openai SDK:

  from openai import OpenAI
  client = OpenAI(base_url="{gateway_url}/v1", api_key="unused")
  reply = client.chat.completions.create(
      model="{model}", messages=[{{"role": "user", "content": "hello"}}])
  print(reply.choices[0].message.content)

Why a request goes where it goes (blocks matched per pod, scores, choice):

  curl -s {gateway_url}/admin/match -H 'authorization: Bearer {admin_token}' \\
    -d '{body}'
  curl -s {gateway_url}/admin/pods -H 'authorization: Bearer {admin_token}'

Ctrl-C to stop (gateway and engines).
"""
