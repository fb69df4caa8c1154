"""`kvgate demo`, run as users run it (a real subprocess, the quick workload).

Behaviour only: the table is printed, JSON and PNG are written, both policies ran without
errors, and Ctrl-C leaves no process behind. Timings and the size of the improvement are
never asserted.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

DEMO = [sys.executable, "-m", "gateway.cli", "demo", "--quick", "--engines", "2", "--port", "0"]
POLICIES = ("round-robin", "prefix-cache")


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text()
        found.extend(int(child) for child in text.split())
    return found


def test_demo_no_serve_prints_the_table_and_writes_results(tmp_path: Path) -> None:
    out = subprocess.run(
        [*DEMO, "--no-serve", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "prompt-cache hit rate" in out.stdout
    assert "TTFT p90" in out.stdout
    assert all(policy in out.stdout for policy in POLICIES)
    assert str(tmp_path / "demo.png") in out.stdout
    assert (tmp_path / "demo.png").stat().st_size > 0
    document = json.loads((tmp_path / "demo.json").read_text())
    assert set(document["runs"]) == set(POLICIES)
    for run in document["runs"].values():
        assert run["requests"] > 0
        assert run["errors"] == 0
        assert run["first_errors"] == []
        assert 0.0 <= run["hit_rate"] <= 1.0
        assert sum(run["engine_requests"].values()) == run["requests"]
        assert all(record["error"] is None for record in run["records"])


def test_demo_compares_the_policies_it_is_given(tmp_path: Path) -> None:
    chosen = ["prefix-share", "prefix-cache"]
    out = subprocess.run(
        [*DEMO, "--no-serve", "--out", str(tmp_path), "--policies", ",".join(chosen)],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    header = next(line for line in out.stdout.splitlines() if "prefix-share" in line)
    assert header.split() == chosen + ["change"]
    assert "=> prefix-cache vs prefix-share" in out.stdout
    assert list(json.loads((tmp_path / "demo.json").read_text())["runs"]) == chosen
    refused = subprocess.run(
        [*DEMO, "--no-serve", "--policies", "round-robin,no-such-policy"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert refused.returncode == 2 and "--policies" in refused.stdout


def test_demo_serves_until_ctrl_c_and_leaves_no_process(tmp_path: Path) -> None:
    demo = subprocess.Popen(
        [*DEMO, "--out", str(tmp_path), "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()
    reader = threading.Thread(target=_read_lines, args=(demo, lines), daemon=True)
    reader.start()
    children: list[int] = []
    try:
        output = _read_until(lines, "Ctrl-C", timeout_s=60)
        match = re.search(r"keeps running at (http://\S+)", output)
        assert match, output
        url = match.group(1)
        children = _children(demo.pid)
        assert children, "the engines run in a child process"
        token = re.search(r"Admin token of this demo: (\S+)", output)
        assert token, output
        body = {"model": "sim-model", "messages": [{"role": "user", "content": "hello"}]}
        reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=10)
        assert reply.status_code == 200
        assert reply.json()["choices"][0]["message"]["content"]
        assert reply.headers["x-kvgate-pod"]
        match_reply = httpx.post(
            f"{url}/admin/match",
            json=body,
            headers={"authorization": f"Bearer {token.group(1)}"},
            timeout=10,
        )
        assert match_reply.status_code == 200
        assert match_reply.json()["chosen"]
        demo.send_signal(signal.SIGINT)
        assert demo.wait(timeout=30) == 0
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        reader.join(timeout=5)
        assert demo.stdout is not None
        demo.stdout.close()
        for child in children:
            if _running(child):
                os.kill(child, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while any(_running(child) for child in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [child for child in children if _running(child)]


def _read_lines(process: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        lines.put(line)
    lines.put(None)


def _read_until(lines: queue.Queue[str | None], marker: str, timeout_s: float) -> str:
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line is None:
            break
        seen.append(line)
        if marker in line:
            return "".join(seen)
    raise AssertionError(f"no {marker!r} line; output so far:\n{''.join(seen)}")
