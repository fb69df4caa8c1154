"""Audit the installed dependencies for known vulnerabilities with pip-audit (scripts/test.sh).

Fails (exit 1) only on a known vulnerability. When no vulnerability database answers
(machines without internet), or it knows none of the installed versions, it says so
and passes: an unreachable database must not make CI flaky, and it must not pass for a
clean audit either — the message says exactly what was and was not checked.

Usage: python scripts/audit_deps.py [--service pypi|osv] [--timeout SECONDS]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--service", default="pypi", choices=("pypi", "osv"))
    parser.add_argument("--timeout", type=int, default=10, help="per-request timeout (s)")
    args = parser.parse_args()
    pip_audit = shutil.which("pip-audit") or str(Path(sys.executable).with_name("pip-audit"))
    if not Path(pip_audit).exists():
        print("dependency audit: skipped: pip-audit is not installed (pip install -e '.[dev]')")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "audit.json"
        command = [
            pip_audit, "--local", "--skip-editable", "--progress-spinner", "off",
            "--vulnerability-service", args.service, "--timeout", str(args.timeout),
            "--format", "json", "--output", str(report),
        ]  # fmt: skip
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            print("dependency audit: skipped: no vulnerability database reachable (timed out)")
            return 0
        if result.returncode == 2 and "usage:" in result.stderr:  # our own mistake: say so
            print(f"dependency audit: pip-audit refused its arguments: {result.stderr.strip()}")
            return 1
        if not report.exists() or not report.read_text().strip():
            last = (result.stderr.strip().splitlines() or ["no output"])[-1]
            print(f"dependency audit: skipped: no vulnerability database reachable ({last})")
            return 0
        dependencies = json.loads(report.read_text())["dependencies"]
    vulnerable = [d for d in dependencies if d.get("vulns")]
    audited = [d for d in dependencies if "skip_reason" not in d]
    for dependency in vulnerable:
        ids = ", ".join(v["id"] for v in dependency["vulns"])
        print(f"dependency audit: {dependency['name']} {dependency['version']}: {ids}")
    if vulnerable:
        print(f"dependency audit: FAILED: {len(vulnerable)} vulnerable packages")
        return 1
    if not audited:
        print(
            "dependency audit: skipped: no vulnerability database reachable "
            f"(the {args.service} service here knows none of the {len(dependencies)} installed "
            "versions)"
        )
        return 0
    print(
        f"dependency audit: no known vulnerabilities in {len(audited)} packages "
        f"({args.service}); {len(dependencies) - len(audited)} not known to the database here, "
        "not audited"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
