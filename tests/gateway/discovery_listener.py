"""A discovery listener for tests: records what a discovery source reports."""

from __future__ import annotations

from gateway.control.discovery import Pod


class RecordingListener:
    """A PodListener that keeps the pods it was told about and every call, in order."""

    def __init__(self) -> None:
        self.pods: dict[str, Pod] = {}
        self.calls: list[tuple[str, str]] = []

    async def upsert_pod(self, pod: Pod) -> None:
        self.pods[pod.name] = pod
        self.calls.append(("upsert", pod.name))

    async def remove_pod(self, name: str) -> None:
        del self.pods[name]
        self.calls.append(("remove", name))
