"""The learner and agentic-step benchmarks run end to end in their ``--quick`` mode and print their tables.

A benchmark nobody runs breaks silently when the code under it moves; these run the scripts as a
user would (a subprocess, from the repository), small enough for the suite. The quick agentic step
goes through the real CLI, the engine's fast path (the ``:test`` config's fixed shapes are not
used: the bench resumes the default config), bwrap and the judge.
"""

from __future__ import annotations

import json
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


def test_the_run_report_splits_a_run_into_its_phases_and_keeps_evaluations_out_of_rl_steps(tmp_path):
    rows = [{"phase": "init", "step": 0, "eval/greedy_pass_rate": 0.0, "time/elapsed_s": 30.0}]
    rows += [{"phase": "sft", "step": s, "sft/loss": 1.0 / s, "time/learn_s": 3.0, "time/elapsed_s": 30.0 + 3 * s}
             for s in range(1, 5)]  # fmt: skip
    rows[-1].update({"sft/check_pass_rate": 0.25, "time/check_s": 12.0})
    split = {"time/prefill_s": 1.0, "time/decode_s": 2.0, "time/learn_s": 4.0, "rollout/prefill_tokens": 100.0}
    rows.append({"phase": "rl", "step": 5, "time/step_s": 10.0, **split, "rollout/prefill_tokens_padded": 150.0})
    rows.append({"phase": "rl", "step": 6, "time/step_s": 30.0, "time/eval_s": 20.0, "eval/greedy_pass_rate": 0.5,
                 **split, "time/elapsed_s": 120.0})  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = _bench("benchmarks/run_report.py", str(tmp_path), "--every", "2")
    phases = dict(line.split(" | ")[:2] for line in out.splitlines() if line.startswith("| ") and " min | " in line)
    assert phases["| SFT steps"] == "0.2 min" and phases["| SFT checks"] == "0.2 min"
    assert phases["| held-out evaluations"] == "0.3 min"
    assert phases["| RL steps"] == "0.3 min"  # 10 s + (30 - 20) s: the step's evaluation is counted once
    assert "| 4 | 0.292 | 0.250 |" in out  # the mean SFT loss of steps 3-4 (1/3, 1/4) and the check at 4
    assert "| RL step 6 | 0.500 |" in out
    assert [line.split(" | ")[1] for line in out.splitlines() if line.startswith(("| 5 |", "| 6 |"))] == ["10.0"] * 2
    assert "| 1.50x |" in out  # prefill padded / real
