"""Tables a documentation page holds, generated from the code: each sits between a
`<!-- PREFIX:NAME -->` line and its `<!-- /PREFIX:NAME -->`, and a command's `--update PAGE`
rewrites them (a test compares the page with what the code generates)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path


class GeneratedBlocks:
    """A page's generated blocks of one kind (`prefix`), each rendered by `render(NAME)`."""

    def __init__(self, prefix: str, render: Callable[[str], str]) -> None:
        self._block = re.compile(
            rf"(<!-- {prefix}:(\w+) -->\n)(.*?)(<!-- /{prefix}:\2 -->)", re.DOTALL
        )
        self._render = render

    def blocks(self, text: str) -> dict[str, str]:
        """The generated blocks a page holds, by name."""
        return {match.group(2): match.group(3) for match in self._block.finditer(text)}

    def updated(self, text: str) -> str:
        """`text` with every generated block replaced by the code's current one."""

        def block(match: re.Match[str]) -> str:
            return match.group(1) + self._render(match.group(2)) + match.group(4)

        return self._block.sub(block, text)

    def rewrite(self, path: Path) -> None:
        path.write_text(self.updated(path.read_text(encoding="utf-8")), encoding="utf-8")
