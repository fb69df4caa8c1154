"""Static discovery: parsing, JSON and TOML files, sync_pods, and the live reload loop."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.control.discovery import (
    DiscoveryEvents,
    Pod,
    PodListener,
    StaticFileDiscovery,
    load_pods_file,
    parse_pods,
    sync_pods,
)
from gateway.errors import ConfigError
from tests.gateway.discovery_listener import RecordingListener
from tests.helpers import eventually


def entry(name: str, port: int = 8000, **extra: Any) -> dict[str, Any]:
    return {"name": name, "url": f"http://127.0.0.1:{port}", "model": "m", **extra}


def write_json(path: Path, entries: list[dict[str, Any]]) -> None:
    path.write_text(json.dumps({"pods": entries}))


# -- parse_pods -----------------------------------------------------------------------------


def test_parse_a_full_pod() -> None:
    [pod] = parse_pods(
        {
            "pods": [
                {
                    "name": "vllm-0.a_b",
                    "url": "http://10.0.0.1:8000",
                    "model": "llama",
                    "engine": "sglang",
                    "events": "tcp://10.0.0.1:5557",
                    "replay": "tcp://10.0.0.1:5558",
                    "topic": "kv",
                    "events_bind": True,
                    "loras": ["sql", "chat"],
                    "lora_ids": {"1": "sql", "2": "chat"},
                }
            ]
        },
        source="test",
    )
    assert pod == Pod(
        name="vllm-0.a_b",
        url="http://10.0.0.1:8000",
        model="llama",
        engine="sglang",
        events="tcp://10.0.0.1:5557",
        replay="tcp://10.0.0.1:5558",
        topic="kv",
        events_bind=True,
        loras=("sql", "chat"),
        lora_ids={1: "sql", 2: "chat"},
    )
    assert pod.serves("llama") and pod.serves("sql") and pod.serves("chat")
    assert not pod.serves("other")


def test_a_trailing_slash_in_the_url_is_dropped() -> None:
    [pod] = parse_pods([entry("p") | {"url": "http://10.0.0.1:8000/"}], source="test")
    assert pod.url == "http://10.0.0.1:8000"


def test_parse_defaults_and_a_bare_list() -> None:
    [pod] = parse_pods([{"name": "p", "url": "https://h:1", "model": "m"}], source="test")
    assert pod == Pod(name="p", url="https://h:1", model="m")
    assert pod.engine == "vllm"
    assert pod.events is None and pod.replay is None
    assert pod.topic == ""
    assert pod.loras == () and dict(pod.lora_ids) == {}
    assert pod.ready is True
    assert parse_pods({"pods": []}, source="test") == []


def test_ipc_event_endpoints_are_accepted() -> None:
    [pod] = parse_pods([entry("p", events="ipc:///tmp/kv.sock")], source="test")
    assert pod.events == "ipc:///tmp/kv.sock"


@pytest.mark.parametrize(
    ("item", "field", "value"),
    [
        ({"url": "http://h:1", "model": "m"}, "name", None),
        ({"name": "-bad", "url": "http://h:1", "model": "m"}, "name", "-bad"),
        ({"name": "a b", "url": "http://h:1", "model": "m"}, "name", "a b"),
        ({"name": "p", "model": "m"}, "url", None),
        ({"name": "p", "url": "h:1", "model": "m"}, "url", "h:1"),
        ({"name": "p", "url": "http://h:1"}, "model", None),
        ({"name": "p", "url": "http://h:1", "model": 3}, "model", 3),
        (entry("p", engine="tgi"), "engine", "tgi"),
        (entry("p", engine="vllmx"), "engine", "vllmx"),
        (entry("p", events="http://h:5557"), "events", "http://h:5557"),
        (entry("p", events="tcp://h"), "events", "tcp://h"),
        (entry("p", replay="tcp://h:5558"), "replay", "tcp://h:5558"),
        (entry("p", loras="sql"), "loras", "sql"),
        (entry("p", loras=["ok", ""]), "loras", ["ok", ""]),
        (entry("p", lora_ids=["sql"]), "lora_ids", ["sql"]),
        (entry("p", lora_ids={"one": "sql"}), "lora_ids", {"one": "sql"}),
        (entry("p", events_bind="yes"), "events_bind", "yes"),
    ],
)
def test_invalid_pods_name_source_position_and_field(item: Any, field: str, value: Any) -> None:
    good = entry("first")
    with pytest.raises(ConfigError) as caught:
        parse_pods({"pods": [good, item]}, source="pods.json")
    assert caught.value.variable == f"pods.json: pods[1].{field}"
    assert caught.value.value == value
    assert caught.value.allowed


def test_duplicate_names_are_rejected() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_pods([entry("p"), entry("q"), entry("p", 9000)], source="f")
    assert caught.value.variable == "f: pods[2].name"
    assert caught.value.value == "p"


@pytest.mark.parametrize("document", [{"pod": []}, "pods", 3, None, {"pods": {"a": 1}}])
def test_a_document_without_a_pod_list_is_rejected(document: Any) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_pods(document, source="f")
    assert caught.value.variable == "f"
    assert "list of pods" in caught.value.allowed


def test_a_pod_that_is_not_an_object_is_rejected() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_pods([entry("p"), "q"], source="f")
    assert caught.value.variable == "f: pods[1]"
    assert caught.value.value == "q"


# -- load_pods_file -------------------------------------------------------------------------


def test_load_json(tmp_path: Path) -> None:
    path = tmp_path / "pods.json"
    write_json(path, [entry("a"), entry("b", 8001, events="tcp://127.0.0.1:5557")])
    pods = load_pods_file(path)
    assert [pod.name for pod in pods] == ["a", "b"]
    assert pods[1].events == "tcp://127.0.0.1:5557"


def test_load_toml(tmp_path: Path) -> None:
    path = tmp_path / "pods.toml"
    path.write_text(
        """
[[pods]]
name = "a"
url = "http://127.0.0.1:8000"
model = "m"
events = "tcp://127.0.0.1:5557"
loras = ["sql"]

[pods.lora_ids]
1 = "sql"

[[pods]]
name = "b"
url = "http://127.0.0.1:8001"
model = "m"
engine = "sglang"
"""
    )
    a, b = load_pods_file(path)
    assert a == Pod(
        name="a",
        url="http://127.0.0.1:8000",
        model="m",
        events="tcp://127.0.0.1:5557",
        loras=("sql",),
        lora_ids={1: "sql"},
    )
    assert b.engine == "sglang"


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("pods.json", "{not json"),
        ("pods.toml", "[[pods]\nname ="),
        ("pods.json", b"\xff\xfe\x00"),
    ],
)
def test_unparsable_files_name_the_file(tmp_path: Path, name: str, content: str | bytes) -> None:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(ConfigError) as caught:
        load_pods_file(path)
    assert caught.value.variable == str(path)
    assert ("TOML" if name.endswith(".toml") else "JSON") in caught.value.allowed


def test_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "absent.json"
    with pytest.raises(ConfigError) as caught:
        load_pods_file(path)
    assert caught.value.variable == str(path)
    assert "readable" in caught.value.allowed


def test_a_toml_file_is_parsed_as_toml_only_by_extension(tmp_path: Path) -> None:
    path = tmp_path / "pods.conf"
    path.write_text('[[pods]]\nname = "a"\nurl = "http://h:1"\nmodel = "m"\n')
    with pytest.raises(ConfigError, match="valid JSON"):
        load_pods_file(path)


# -- sync_pods ------------------------------------------------------------------------------


async def test_sync_pods_reports_only_the_difference() -> None:
    listener = RecordingListener()
    current: dict[str, Pod] = {}
    a, b, c = (Pod(name=n, url="http://h:1", model="m") for n in "abc")
    await sync_pods(listener, current, [a, b])
    assert listener.calls == [("upsert", "a"), ("upsert", "b")]
    assert current == {"a": a, "b": b}

    listener.calls.clear()
    await sync_pods(listener, current, [a, b])
    assert listener.calls == []  # nothing changed, nothing reported

    listener.calls.clear()
    b2 = Pod(name="b", url="http://h:2", model="m")
    await sync_pods(listener, current, [b2, c])
    assert listener.calls == [("remove", "a"), ("upsert", "b"), ("upsert", "c")]
    assert current == {"b": b2, "c": c}
    assert listener.pods == current

    listener.calls.clear()
    await sync_pods(listener, current, [])
    assert sorted(listener.calls) == [("remove", "b"), ("remove", "c")]
    assert current == {} and listener.pods == {}


async def test_sync_pods_notices_a_changed_lora_map() -> None:
    listener = RecordingListener()
    current: dict[str, Pod] = {}
    await sync_pods(listener, current, [Pod(name="a", url="http://h:1", model="m")])
    listener.calls.clear()
    await sync_pods(
        listener, current, [Pod(name="a", url="http://h:1", model="m", lora_ids={1: "x"})]
    )
    assert listener.calls == [("upsert", "a")]


# -- StaticFileDiscovery --------------------------------------------------------------------


class Running:
    """A discovery task with its listener; cancelled at the end of the test."""

    def __init__(self, discovery: StaticFileDiscovery) -> None:
        self.discovery = discovery
        self.listener = RecordingListener()
        listener: PodListener = self.listener  # the real interface, statically checked
        self.ready = asyncio.Event()
        self.task = asyncio.create_task(discovery.run(listener, self.ready))

    def names(self) -> list[str]:
        return sorted(self.listener.pods)

    async def stop(self) -> None:
        if self.task.done():
            return
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


@pytest.fixture
async def run_discovery() -> AsyncIterator[Callable[..., Running]]:
    running: list[Running] = []

    def start(path: Path, **kwargs: Any) -> Running:
        run = Running(StaticFileDiscovery(path, poll_interval_s=0.05, **kwargs))
        running.append(run)
        return run

    yield start
    for run in running:
        await run.stop()


async def test_initial_load_then_ready(
    tmp_path: Path, run_discovery: Callable[..., Running]
) -> None:
    path = tmp_path / "pods.json"
    write_json(path, [entry("a"), entry("b", 8001)])
    run = run_discovery(path)
    await asyncio.wait_for(run.ready.wait(), 10)
    assert run.names() == ["a", "b"]
    assert run.discovery.reloads == 0
    assert not run.task.done()


async def test_a_bad_file_at_start_fails_run(
    tmp_path: Path, run_discovery: Callable[..., Running]
) -> None:
    path = tmp_path / "pods.json"
    path.write_text("[{")
    run = run_discovery(path)
    with pytest.raises(ConfigError):
        await asyncio.wait_for(run.task, 10)
    assert not run.ready.is_set()
    assert run.listener.calls == []


async def test_reload_when_the_file_changes(
    tmp_path: Path, run_discovery: Callable[..., Running]
) -> None:
    path = tmp_path / "pods.json"
    write_json(path, [entry("a"), entry("b", 8001)])
    run = run_discovery(path)
    await asyncio.wait_for(run.ready.wait(), 10)
    run.listener.calls.clear()

    # A pod added, one changed, one removed.
    write_json(path, [entry("a", 9000), entry("c", 8002)])
    await eventually(lambda: run.names() == ["a", "c"], what="reload after a change")
    assert run.listener.pods["a"].url == "http://127.0.0.1:9000"
    assert sorted(run.listener.calls) == [("remove", "b"), ("upsert", "a"), ("upsert", "c")]
    assert run.discovery.reloads == 1


async def test_reload_on_a_new_inode_with_the_same_size(
    tmp_path: Path, run_discovery: Callable[..., Running]
) -> None:
    path = tmp_path / "pods.json"
    write_json(path, [entry("a")])
    run = run_discovery(path)
    await asyncio.wait_for(run.ready.wait(), 10)
    # The atomic-rename way of editing (what ConfigMap updates and editors do): the new
    # file has the same size and may even have the same mtime, but another inode.
    staged = tmp_path / "pods.json.new"
    write_json(staged, [entry("b")])
    assert staged.stat().st_size == path.stat().st_size
    os.utime(staged, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns))
    staged.replace(path)
    await eventually(lambda: run.names() == ["b"], what="reload after a rename")


async def test_an_invalid_file_keeps_the_last_good_list(
    tmp_path: Path, run_discovery: Callable[..., Running]
) -> None:
    path = tmp_path / "pods.json"
    write_json(path, [entry("a")])
    errors: list[ConfigError] = []
    run = run_discovery(path, events=DiscoveryEvents(error=errors.append))
    await asyncio.wait_for(run.ready.wait(), 10)
    run.listener.calls.clear()

    write_json(path, [entry("a"), {"name": "b", "url": "nope", "model": "m"}])
    await eventually(lambda: len(errors) >= 1, what="reload error reported")
    assert errors[0].variable == f"{path}: pods[1].url"
    assert run.listener.calls == []
    assert run.names() == ["a"]
    assert run.discovery.reloads == 0
    assert not run.task.done()

    # Fixing the file is picked up.
    write_json(path, [entry("a"), entry("b", 8001)])
    await eventually(lambda: run.names() == ["a", "b"], what="reload after the fix")
    assert run.discovery.reloads == 1
    assert len(errors) == 1  # a broken file is reported once, not on every poll


async def test_a_deleted_file_keeps_the_last_good_list(
    tmp_path: Path, run_discovery: Callable[..., Running]
) -> None:
    path = tmp_path / "pods.json"
    write_json(path, [entry("a")])
    errors: list[ConfigError] = []
    run = run_discovery(path, events=DiscoveryEvents(error=errors.append))
    await asyncio.wait_for(run.ready.wait(), 10)
    path.unlink()
    await eventually(lambda: len(errors) >= 1, what="reload error reported")
    assert "readable" in errors[0].allowed
    assert run.names() == ["a"]
    write_json(path, [entry("z")])
    await eventually(lambda: run.names() == ["z"], what="reload after re-creation")


async def test_request_reload_rereads_an_unchanged_file(
    tmp_path: Path, run_discovery: Callable[..., Running]
) -> None:
    path = tmp_path / "pods.json"
    write_json(path, [entry("a")])
    run = run_discovery(path)
    await asyncio.wait_for(run.ready.wait(), 10)
    run.listener.calls.clear()
    run.discovery.request_reload()
    await eventually(lambda: run.discovery.reloads == 1, what="forced reload")
    assert run.listener.calls == []  # same pods: nothing to report
    assert run.names() == ["a"]


async def test_the_discovery_leaves_signals_to_its_owner(
    tmp_path: Path, run_discovery: Callable[..., Running]
) -> None:
    # SIGHUP is the gateway process's to handle (it calls request_reload): a discovery
    # that installed handlers itself would clobber, or be clobbered by, any other.
    path = tmp_path / "pods.json"
    write_json(path, [entry("a")])
    before = signal.getsignal(signal.SIGHUP)
    run = run_discovery(path)
    await asyncio.wait_for(run.ready.wait(), 10)
    assert signal.getsignal(signal.SIGHUP) == before
    run.discovery.request_reload()
    await eventually(lambda: run.discovery.reloads == 1, what="reload on request")


def test_unknown_keys_are_named_not_ignored() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_pods(
            [{"name": "a", "url": "http://h:1", "model": "m", "event": "tcp://h:2"}], source="f"
        )
    assert caught.value.variable == "f: pods[0].event"
    assert "events" in caught.value.allowed


def test_ready_false_drains_a_pod() -> None:
    (pod,) = parse_pods(
        [{"name": "a", "url": "http://h:1", "model": "m", "ready": False}], source="f"
    )
    assert pod.ready is False
    with pytest.raises(ConfigError, match="ready"):
        parse_pods([{"name": "a", "url": "http://h:1", "model": "m", "ready": "no"}], source="f")


def test_every_discovery_the_settings_allow_has_a_source() -> None:
    from gateway.control.discovery.sources import SOURCES
    from gateway.settings import DISCOVERIES

    assert set(SOURCES) == set(DISCOVERIES)
