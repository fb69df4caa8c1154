"""How kvgate's modules import each other, read from their source with `ast`.

- No module imports another module's private name (`from x import _name`, or `x._name`
  on an imported module of ours): what two modules share is public in the module that
  owns it. A package may import its own private submodule (`indexer._native`, the
  compiled extension its `native.py` wraps).
- No import cycle among gateway/'s modules (module-level imports; those under
  `if TYPE_CHECKING:` and inside functions excluded): the layers import downwards.
- predictor/ imports neither gateway nor bench (it is pure: the gateway uses it, never the
  reverse), and of gateway/ only routing, replica sync, snapshots and metrics use it (with
  the lifespan that builds it and the settings that give its parameters).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gateway", "indexer", "predictor", "subscriber", "simulator", "bench", "tokenization")
PREDICTOR_USERS = (
    "gateway.routing",
    "gateway.control.replication",
    "gateway.control.persistence",
    "gateway.observability",
    "gateway.lifespan",
    "gateway.settings",
)


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Every module of `packages` under `root`, by dotted name."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if "results" not in path.relative_to(root).parts:
                found[module_name(path, root)] = path
    return found


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _own_private_submodule(importer: str, package: str, name: str, root: Path) -> bool:
    """`from package import _name` in a module of `package`, `_name` being a file of it (a
    source or compiled module)."""
    if not importer.startswith(package + "."):
        return False
    folder = root.joinpath(*package.split("."))
    return any(folder.glob(f"{name}.*"))


def private_imports(root: Path, packages: tuple[str, ...]) -> list[str]:
    """`path:line: what` for every private name one module takes from another of ours."""
    ours = modules(root, packages)
    found = []
    for name, path in ours.items():
        tree = ast.parse(path.read_text(), str(path))
        imported: dict[str, str] = {}  # local name -> our module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module.split(".")[0] not in packages:
                    continue
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    if full in ours:
                        imported[alias.asname or alias.name] = full
                    if _is_private(alias.name) and not _own_private_submodule(
                        name, node.module, alias.name, root
                    ):
                        found.append(
                            f"{path}:{node.lineno}: from {node.module} import {alias.name}"
                        )
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] in packages and alias.asname:
                        imported[alias.asname] = alias.name
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and _is_private(node.attr)
                and isinstance(node.value, ast.Name)
                and node.value.id in imported
            ):
                found.append(f"{path}:{node.lineno}: {node.value.id}.{node.attr}")
    return found


def _module_level_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    for statement in tree.body:
        if isinstance(statement, ast.If) and "TYPE_CHECKING" in ast.unparse(statement.test):
            continue
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        for node in ast.walk(statement):
            if isinstance(node, ast.Import | ast.ImportFrom):
                yield node


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the modules of `package` it imports at module level. `from p import m`,
    `m` a module, depends on `m` (not on `p`'s `__init__`, which need not have run)."""
    ours = modules(root, (package,))
    graph: dict[str, set[str]] = {}
    for name, path in ours.items():
        deps = set()
        for node in _module_level_imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level or node.module is None:
                    continue
                submodules = {f"{node.module}.{a.name}" for a in node.names} & ours.keys()
                deps |= submodules
                if len(submodules) < len(node.names) and node.module in ours:
                    deps.add(node.module)
            else:
                deps |= {alias.name for alias in node.names} & ours.keys()
        graph[name] = deps - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_a_private_name_of_another() -> None:
    assert private_imports(ROOT, PACKAGES) == []


def test_gateway_has_no_import_cycle() -> None:
    graph = import_graph(ROOT, "gateway")
    assert len(graph) > 50
    assert cycles(graph) == []


def imported_packages(path: Path) -> set[str]:
    """The top-level packages a module imports (anywhere in it)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
    return found


def test_the_predictor_imports_no_gateway_and_only_its_users_import_it() -> None:
    for name, path in modules(ROOT, ("predictor",)).items():
        assert not imported_packages(path) & {"gateway", "bench"}, name
    graph = import_graph(ROOT, "predictor")
    assert len(graph) > 8 and cycles(graph) == []
    users = {
        name
        for name, path in modules(ROOT, ("gateway",)).items()
        if "predictor" in imported_packages(path)
    }
    assert users and all(name.startswith(PREDICTOR_USERS) for name in users), sorted(users)


def test_gateway_top_level_holds_at_most_ten_modules() -> None:
    assert len(list((ROOT / "gateway").glob("*.py"))) <= 10


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from pkg.a import _helper\n", ["from pkg.a import _helper"]),
        ("from pkg import a\na._helper()\n", ["a._helper"]),
        ("import pkg.a as a\na._helper()\n", ["a._helper"]),
        ("from pkg.a import helper\nfrom pkg import _native\n", []),
        ("from os import _exit\n", []),
    ],
)
def test_the_private_name_check_finds_what_it_should(
    tmp_path: Path, source: str, expected: list[str]
) -> None:
    root = _tree(
        tmp_path,
        {"pkg/__init__.py": "", "pkg/a.py": "def _helper(): ...\n", "pkg/_native.c": "",
         "pkg/b.py": source},
    )  # fmt: skip
    found = [line.split(": ", 1)[1] for line in private_imports(root, ("pkg",))]
    assert found == expected


def test_the_cycle_check_finds_a_cycle_and_only_at_module_level(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.a import A\n",
            "pkg/a.py": "from pkg import b\nA = 1\n",
            "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from pkg.c import C\n",
            "pkg/c.py": "from pkg.a import A\ndef late():\n    from pkg import b\n",
            "pkg/d.py": "from pkg.e import E\nD = 1\n",
            "pkg/e.py": "from pkg.d import D\nE = 1\n",
        },
    )
    assert cycles(import_graph(root, "pkg")) == [["pkg.d", "pkg.e"]]


def oversized(root: Path, folders: tuple[str, ...]) -> list[str]:
    """Modules of `folders` over 400 lines and functions there over 60 (their whole
    definition, docstring included)."""
    found = []
    for folder in folders:
        for path in sorted((root / folder).glob("*.py")):
            text = path.read_text()
            if text.count("\n") > 400:
                found.append(f"{path.name}: {text.count(chr(10))} lines")
            for node in ast.walk(ast.parse(text, str(path))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    length = (node.end_lineno or node.lineno) - node.lineno + 1
                    if length > 60:
                        found.append(f"{path.name}:{node.lineno} {node.name}: {length} lines")
    return found


def test_the_routing_core_reads_in_small_pieces() -> None:
    assert oversized(ROOT, ("predictor", "gateway/routing")) == []
