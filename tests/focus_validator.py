"""The FinOps Foundation's own FOCUS validator (`focus-validator` on PyPI,
2.2.1: FOCUS 1.2), installed once into a venv of its own: it needs Python
3.12 or later, and the project runs on 3.11. Run offline (its rules ship
with it: --block-download)."""

from __future__ import annotations

import fcntl
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
# Python 3.12 exactly: the validator needs 3.12 or later and pins numpy
# below 2, and numpy 1.26 (the last below 2) has no wheel for 3.13, where pip
# compiles it from source (about 4 minutes). On 3.12 every package below
# comes as a wheel, except the validator itself and pandasql, which are pure
# Python with no wheel published: creating the environment takes about a
# minute. The full set is pinned so that a release of any of them cannot
# turn the install back into a build.
PYTHON = "3.12"
REQUIREMENTS = (
    f"focus-validator=={VERSION}",
    "annotated-types==0.8.0",
    "attrs==26.1.0",
    "certifi==2026.10.19.post1",
    "charset-normalizer==3.5.3",
    "ddt==1.7.2",
    "duckdb==1.5.6",
    "graphviz==0.21",
    "idna==3.20",
    "jsonschema==4.26.0",
    "jsonschema-specifications==2025.9.1",
    "multimethod==2.0.2",
    "mypy-extensions==1.2.0",
    "numpy==1.26.4",
    "packaging==26.4",
    "pandas==2.3.3",
    "pandasql==0.7.3",
    "pandera==0.26.1",
    "polars==1.44.2",
    "polars-runtime-32==1.44.2",
    # The validator does not pin pyarrow, whose releases from 21 on need
    # numpy 2: the newest pyarrow cannot import beside numpy 1.26.
    "pyarrow==20.0.0",
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "python-dateutil==4.0.0",
    "pytz==2025.2",
    "pyyaml==6.0.4",
    "referencing==0.37.0",
    "requests==2.34.2",
    "rpds-py==2026.9.1",
    "sqlalchemy==2.1.9",
    "sqlglot==27.29.0",
    "tabulate==0.10.0",
    "typeguard==4.6.1",
    "typing-inspect==0.9.0",
    "typing-inspection==0.4.5",
    "typing-extensions==4.16.0",
    "tzdata==2026.6",
    "urllib3==2.8.0",
)
# Wheels only, so nothing is ever compiled; the two pure-Python source
# distributions are the exception (building them takes seconds).
SOURCE_ONLY = "focus-validator,pandasql"
VENV = Path(settings.VLLM_VENV).parent / f"venv-focus-validator-{VERSION}-py{PYTHON}"
PASSED = re.compile(r"^\S+ (\S+): PASS ", re.M)
FAILED = re.compile(r"^\S+ (\S+): FAIL ")
SUMMARY = re.compile(r"Total: (?P<total>\d+) \| Pass: (?P<pass>\d+) \| Fail: (?P<fail>\d+)")


def _python() -> str | None:
    """Python 3.12: on PATH, or one pyenv installed."""
    found = shutil.which(f"python{PYTHON}")
    if found and subprocess.run([found, "-c", ""], capture_output=True).returncode == 0:
        return found
    root = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    versions = sorted(glob.glob(f"{root}/versions/{PYTHON}.*/bin/python3"), reverse=True)
    return versions[0] if versions else None


def focus_validator() -> Path | None:
    """The validator's executable, installed if need be; None when this
    machine has no Python 3.12 to run it (or the install failed: why is
    printed)."""
    executable = VENV / "bin" / "focus-validator"
    if executable.exists():
        return executable
    python = _python()
    if python is None:
        return None
    VENV.parent.mkdir(parents=True, exist_ok=True)
    # Parallel test workers may both find it missing: one installs, the
    # other waits for it and finds it there.
    with open(VENV.parent / f"{VENV.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if executable.exists():
            return executable
        pip = [str(VENV / "bin" / "pip"), "install", "-q", "--only-binary=:all:"]
        steps = (
            [python, "-m", "venv", "--clear", str(VENV)],
            [*pip, f"--no-binary={SOURCE_ONLY}", *REQUIREMENTS],
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
