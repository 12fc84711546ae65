"""The learner and agentic-step benchmarks run end to end in their ``--quick`` mode and print their tables.

A benchmark nobody runs breaks silently when the code under it moves; these run the scripts as a
user would (a subprocess, from the repository), small enough for the suite. The quick agentic step
goes through the real CLI, the engine's fast path (the ``:test`` config's fixed shapes are not
used: the bench resumes the default config), bwrap and the judge.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.sandbox.conftest import backend_or_skip

REPO = Path(__file__).resolve().parent.parent


def _bench(*args: str) -> str:
    done = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout


def test_the_learner_bench_prints_throughput_beside_the_matmul_peak():
    out = _bench("benchmarks/learner_bench.py", "--quick")
    assert "float32 matmul peak" in out
    rows = [line for line in out.splitlines() if line.startswith("| this tree |")]
    assert [row.split("|")[3].strip() for row in rows] == ["sft", "rl"]


@pytest.mark.slow
def test_the_agentic_step_bench_runs_two_rl_steps_through_the_cli(tmp_path):
    backend_or_skip("bwrap")
    out = _bench("benchmarks/agentic_step_bench.py", "--quick", "--cache", str(tmp_path))
    rows = [line for line in out.splitlines() if line.startswith("| this tree |")]
    assert len(rows) == 4, out  # two steps in the time split, two in the engine's counts
    assert "prefill" in out and "decode padded / real" in out
