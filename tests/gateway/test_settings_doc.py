"""docs/configuration.md's tables are the settings' declarations, rendered: a setting
added, renamed or given a new default without that page following fails here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gateway.commands.settings import GENERATED, markdown_table
from gateway.settings import setting_groups

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_the_configuration_tables_are_generated_from_the_declarations() -> None:
    text = PAGE.read_text(encoding="utf-8")
    assert set(GENERATED.blocks(text)) == set(setting_groups())
    for group, table in GENERATED.blocks(text).items():
        assert table == markdown_table(group), (
            f"docs/configuration.md's {group} settings table is stale: run "
            "`.venv/bin/kvgate settings --update docs/configuration.md`"
        )
    assert GENERATED.updated(text) == text


def test_every_setting_is_in_a_table_once() -> None:
    text = PAGE.read_text(encoding="utf-8")
    tables = "".join(GENERATED.blocks(text).values())
    for entries in setting_groups().values():
        for declaration, _ in entries:
            assert tables.count(f"| `{declaration.variable}` |") == 1, declaration.variable


def test_kvgate_settings_shows_what_the_environment_sets() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "settings"],
        env={"KVGATE_PORT": "9123", "AIBRIX_TOKENIZER_REQUEST_TIMEOUT": "5s", "PATH": ""},
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    lines = {line.split()[0]: line for line in shown.stdout.splitlines() if line.strip()}
    assert "(set: KVGATE_PORT)" in lines["KVGATE_PORT"]
    assert "(set: AIBRIX_TOKENIZER_REQUEST_TIMEOUT)" in lines["AIBRIX_REMOTE_TOKENIZER_TIMEOUT"]
    assert "(set:" not in lines["KVGATE_HOST"]
    refused = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "settings"],
        env={"KVGATE_PORT": "http", "PATH": ""},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode == 2
    assert "KVGATE_PORT='http'" in refused.stderr


def test_kvgate_settings_update_rewrites_a_stale_table(tmp_path: Path) -> None:
    current = PAGE.read_text(encoding="utf-8")
    stale = tmp_path / "configuration.md"
    stale.write_text(current.replace("| `KVGATE_PORT` | 8080 |", "| `KVGATE_PORT` | 80 |"))
    assert stale.read_text(encoding="utf-8") != current
    subprocess.run(
        [sys.executable, "-m", "gateway.cli", "settings", "--update", str(stale)],
        capture_output=True, timeout=60, check=True,
    )  # fmt: skip
    assert stale.read_text(encoding="utf-8") == current
