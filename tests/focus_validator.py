"""The FinOps Foundation's own FOCUS validator (`focus-validator` on PyPI,
2.2.1: FOCUS 1.2), installed once into a venv of its own: it needs Python
3.12 or later, and the project runs on 3.11. Run offline (its rules ship
with it: --block-download)."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

VERSION = "2.2.1"
VENV = Path(settings.VLLM_VENV).parent / f"venv-focus-validator-{VERSION}"
PASSED = re.compile(r"^\S+ (\S+): PASS ", re.M)
FAILED = re.compile(r"^\S+ (\S+): FAIL ")
SUMMARY = re.compile(r"Total: (?P<total>\d+) \| Pass: (?P<pass>\d+) \| Fail: (?P<fail>\d+)")


def _python_312() -> str | None:
    """A Python 3.12 or later: on PATH, or one pyenv installed."""
    for name in ("python3.13", "python3.12"):
        found = shutil.which(name)
        if found and subprocess.run([found, "-c", ""], capture_output=True).returncode == 0:
            return found
    root = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    versions = sorted(glob.glob(f"{root}/versions/3.1[2-9]*/bin/python3"), reverse=True)
    return versions[0] if versions else None


def focus_validator() -> Path | None:
    """The validator's executable, installed if need be; None when this
    machine has no Python 3.12 to run it (or the install failed: why is
    printed)."""
    executable = VENV / "bin" / "focus-validator"
    if executable.exists():
        return executable
    python = _python_312()
    if python is None:
        return None
    VENV.parent.mkdir(parents=True, exist_ok=True)
    steps = (
        [python, "-m", "venv", str(VENV)],
        # It pins numpy below 2 but not pyarrow, whose releases from 21 on
        # need numpy 2: the pair pip would pick cannot import.
        [str(VENV / "bin" / "pip"), "install", "-q", f"focus-validator=={VERSION}", "pyarrow<21"],
    )
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            print(f"installing focus-validator failed: {done.stderr[-2000:]}")
            return None
    return executable


@dataclass(frozen=True)
class Validation:
    passed: int
    failed: list[str]  # the failing rules' lines of the report
    report: str


def focus_validate(executable: Path, data: Path, *, data_format: str) -> Validation:
    """Validate `data` against FOCUS 1.2. The validator exits 0 whatever it
    finds: the counts are read from its report's summary line."""
    done = subprocess.run(
        [
            str(executable),
            "--data-file",
            str(data),
            "--data-format",
            data_format,
            "--validate-version",
            "1.2",
            "--block-download",
            "--show-violations",
        ],
        # It reads its currency codes from "focus_validator/rules/..."
        # relative to the working directory.
        cwd=_site_packages(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = done.stdout + done.stderr
    summary = SUMMARY.search(report)
    assert summary is not None, f"focus-validator printed no summary: {report[-3000:]}"
    failed = [line for line in report.splitlines() if ": FAIL " in line]
    assert len(failed) == int(summary["fail"]), report[-3000:]
    # An either-or rule (InvoiceId: null for every row, or for none) lists
    # the alternative not taken as failed even when the rule itself passed.
    passed = set(PASSED.findall(report))
    alternatives = _alternatives()
    failed = [line for line in failed if alternatives.get(FAILED.search(line)[1], "") not in passed]
    return Validation(passed=int(summary["pass"]), failed=failed, report=report)


def _alternatives() -> dict[str, str]:
    """Each rule that is one alternative of an OR rule: that rule's id."""
    (rules_file,) = glob.glob(
        str(_site_packages() / "focus_validator" / "rules" / "model-1.2*.json")
    )
    rules = json.loads(Path(rules_file).read_text())["ModelRules"]
    out = {}
    for rule_id, rule in rules.items():
        requirement = rule.get("ValidationCriteria", {}).get("Requirement", {})
        if requirement.get("CheckFunction") == "OR":
            for item in requirement.get("Items", []):
                if item.get("CheckFunction") == "CheckModelRule":
                    out[item["ModelRuleId"]] = rule_id
    return out


def _site_packages() -> Path:
    return Path(glob.glob(str(VENV / "lib" / "python3.*" / "site-packages"))[0])
