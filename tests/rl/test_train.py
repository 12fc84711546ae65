"""The rollout-update loop end to end on CPU with real bwrap sandboxes.

Runs ``configs/quickstart.py:test`` (a few SFT + RL steps) through the real CLI,
checks the workdir, token-exact trajectories, replay, evaluation of a saved
checkpoint (with other ``--num_tasks`` and ``--k`` than the run's), and that a run killed with SIGKILL and started again ends with
exactly the parameters and metrics of one that never stopped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from rl.phases.time_split import SPLIT
from rl.rollout import trajectory
from rl.run.metrics import read_metrics, without_timing
from tests.conftest import import_or_skip
from tests.sandbox.conftest import backend_or_skip

pytestmark = pytest.mark.slow  # every test here needs a training run of its own: minutes, not seconds

REPO = Path(__file__).resolve().parents[2]
CONFIG = "configs/quickstart.py:test"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
    env["JAX_PLATFORMS"] = "cpu"
    return env


def _train_cmd(workdir: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "rl.train", f"--config={CONFIG}", f"--workdir={workdir}", *overrides]


def _cli(module: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """``python -m <module> <args>`` from the repository, on one CPU device."""
    cmd = [sys.executable, "-m", module, *args]
    return subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=timeout)


def _run(workdir: Path, *overrides: str) -> subprocess.CompletedProcess:
    proc = _cli("rl.train", f"--config={CONFIG}", f"--workdir={workdir}", *overrides, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    backend_or_skip("bwrap")
    workdir = tmp_path_factory.mktemp("runs") / "full"
    _run(workdir)
    return workdir


def _latest_checkpoint(workdir: Path) -> int:
    """The newest complete checkpoint's step (orbax renames a step's directory to its number only once
    the save is complete, so a half-written one is never counted)."""
    steps = [int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()]
    assert steps, f"{workdir} holds no complete checkpoint: there is nothing to resume from"
    return max(steps)


def _assert_resumed(proc: subprocess.CompletedProcess, step: int) -> None:
    """A restart that silently began again at step 0 reproduces the same metrics and weights, so a
    resume test must also see the resume itself: the trainer's line naming the checkpoint it loaded."""
    out = proc.stdout + proc.stderr
    assert f"resumed from checkpoint {step} (" in out, f"no resume from checkpoint {step}:\n{out[-3000:]}"


def _final_params(workdir: Path) -> dict[str, np.ndarray]:
    import orbax.checkpoint as ocp

    with ocp.StandardCheckpointer() as ckpt:
        state = ckpt.restore((workdir / "checkpoints" / str(_latest_checkpoint(workdir)) / "state").absolute())
    import jax

    flat = jax.tree_util.tree_flatten_with_path(state["params"])[0]
    return {jax.tree_util.keystr(k): np.asarray(v) for k, v in flat}


def test_workdir_layout_and_metrics(run_dir):
    assert json.loads((run_dir / "config.json").read_text())["rollout"]["group_size"] == 4
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == list(range(0, 8))  # init eval + 4 SFT + 3 RL steps
    sft, rl = records[1:5], records[5:]
    assert all(r["phase"] == "sft" and np.isfinite(r["sft/loss"]) for r in sft)
    for r in rl:
        assert r["phase"] == "rl"
        for key in (
            "rollout/reward_mean",
            "rollout/pass_rate",
            "rollout/anomaly_rate",
            "time/generate_s",
            "time/env_s",
            "time/learn_s",
            "rollout/arithmetic/reward_mean",
        ):
            assert key in r, key
    assert "eval/greedy_pass_rate" in records[-1] and "eval/pass@1" in records[-1]
    assert any("train/loss" in r for r in rl)
    for r in rl:  # the wall-time split adds up to the step (an evaluation in the step is outside it)
        parts = [r[k] for k in SPLIT]
        assert all(p >= 0.0 for p in parts), r
        assert r["time/tools_s"] > 0.0 and r["time/verify_s"] > 0.0, r  # every episode resets and is judged
        assert sum(parts) + r.get("time/eval_s", 0.0) == pytest.approx(r["time/step_s"], rel=0.05, abs=0.5), r
    assert list((run_dir / "tb").iterdir()), "TensorBoard events missing"
    assert sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())[-1] == 7


def test_trajectories_are_token_exact(run_dir):
    from rl.generation.tokenizer import ByteTokenizer

    tok = ByteTokenizer()
    files = trajectory.step_files(run_dir)
    assert [s for s, _ in files] == [5, 6, 7]
    episodes = trajectory.read_step(files[0][1])
    assert len(episodes) == 2 * 4
    for e in episodes:
        ids, mask = e["token_ids"], e["loss_mask"]
        assert len(ids) == len(mask) == len(e["logprobs"])
        # the prompt is exactly the rendered conversation start, never trained on
        prompt = tok.encode_messages(e["messages"][:1], add_generation_prompt=True)
        assert ids[: e["prompt_len"]] == prompt and not any(mask[: e["prompt_len"]])
        # the sampled segments decode to the recorded completions, in order
        segments, cur = [], []
        for t, m in zip(ids, mask, strict=True):
            if m:
                cur.append(t)
            elif cur:
                segments.append(cur)
                cur = []
        if cur:
            segments.append(cur)
        assert len(segments) == len(e["turns"])
        for seg, turn in zip(segments, e["turns"], strict=True):
            body = seg[:-1] if seg[-1] in tok.stop_token_ids else seg
            assert tok.decode(body) == turn["completion"]
        # observation tokens carry no log-prob; sampled ones do
        assert all(lp == 0.0 for lp, m in zip(e["logprobs"], mask, strict=True) if not m)
        assert e["verification"] is not None and "reward" in e["verification"]


def test_replay_reproduces_recorded_episodes(run_dir):
    files = trajectory.step_files(run_dir)
    proc = _cli("rl.replay", str(files[-1][1]), "--row", "0", "--row", "1", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"episodes": 2, "repeats": 1, "diverged": 0}


def test_replay_reports_divergence(run_dir, tmp_path):
    files = trajectory.step_files(run_dir)
    src = files[-1][1]
    for suffix in (".jsonl", ".npz", ".tasks"):
        (tmp_path / src.with_suffix(suffix).name).write_bytes(src.with_suffix(suffix).read_bytes())
    path = tmp_path / src.name
    records = [json.loads(line) for line in path.read_text().splitlines()]
    target = next(r for r in records if r["tool_calls"]) if any(r["tool_calls"] for r in records) else records[0]
    if target["tool_calls"]:
        target["tool_calls"][0]["output"] = "tampered output"
    else:
        target["verification"]["reward"] = 123.0
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    proc = _cli("rl.replay", str(path), "--row", str(target["row"]), timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "differs" in out or "recorded 123.0" in out, out


def test_evaluate_cli_with_other_num_tasks_and_k(run_dir):
    """Evaluating a saved checkpoint may ask for other tasks and k than the run used; the run is only read."""
    config_before = (run_dir / "config.json").read_text()
    proc = _cli("rl.evaluate", f"--workdir={run_dir}", "--step=5", "--num_tasks=2", "--k=3", timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((run_dir / "evaluations" / "step_00000005.json").read_text())
    assert {"eval/greedy_pass_rate", "eval/pass@1", "eval/pass@3"} <= set(result)
    [(step, path)] = trajectory.step_files(run_dir / "evaluations", kind="eval")
    episodes = trajectory.read_step(path, arrays=False)
    assert step == 5 and len({e["task_id"] for e in episodes}) == 2 and len(episodes) == 2 * (1 + 3)
    assert [e["decoding"] for e in episodes] == ["greedy"] * 2 + ["sampled"] * 6
    assert (run_dir / "config.json").read_text() == config_before


def test_sigkill_and_resume_matches_an_uninterrupted_run(run_dir, tmp_path):
    workdir = tmp_path / "killed"
    proc = subprocess.Popen(
        _train_cmd(workdir), cwd=REPO, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 600
    # Kill it once a few steps are done, wherever it is (often mid-step or mid-save).
    while time.monotonic() < deadline and proc.poll() is None:
        if len(read_metrics(workdir)) >= 4:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    resume_from = _latest_checkpoint(workdir)  # before the restart writes newer ones
    _assert_resumed(_run(workdir), resume_from)
    assert without_timing(read_metrics(workdir)) == without_timing(read_metrics(run_dir))
    a, b = _final_params(run_dir), _final_params(workdir)
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    for (s1, f1), (s2, f2) in zip(trajectory.step_files(run_dir), trajectory.step_files(workdir), strict=True):
        assert s1 == s2
        r1, r2 = trajectory.read_step(f1), trajectory.read_step(f2)
        assert [x["token_ids"] for x in r1] == [x["token_ids"] for x in r2]


def test_a_different_experiment_in_the_same_workdir_is_refused(run_dir):
    proc = _cli("rl.train", f"--config={CONFIG}", f"--workdir={run_dir}", "--config.rollout.group_size=3")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "holds a different experiment (config.json differs in rollout.group_size: 4 -> 3)" in proc.stderr


def test_the_lock_step_rollout_reference_still_trains(run_dir, tmp_path):
    """``rollout.engine=False``: the lock-step reference the engine is measured against runs a step end to
    end, and its SFT phase is the engine run's, bit for bit (the rollout is the only difference)."""
    workdir = tmp_path / "lockstep"
    _run(workdir, "--config.rollout.engine=False", "--config.loop.steps=1", "--config.eval.every=0")
    records = read_metrics(workdir)
    rl = [r for r in records if r.get("phase") == "rl"]
    assert len(rl) == 1 and rl[0]["rollout/sampled_tokens"] > 0 and "rollout/prefill_tokens" not in rl[0]
    engine_sft = [r["sft/loss"] for r in read_metrics(run_dir) if r.get("phase") == "sft"]
    assert [r["sft/loss"] for r in records if r.get("phase") == "sft"] == engine_sft
    episodes = trajectory.read_step(trajectory.step_files(workdir)[0][1])
    assert all(len(e["token_ids"]) == len(e["loss_mask"]) == len(e["logprobs"]) for e in episodes)


def test_a_run_on_a_ray_fleet_matches_the_local_pool(run_dir, tmp_path):
    """``--config.sandbox.fleet=ray`` on a two-node Ray cluster: the episodes' sandboxes come from the
    nodes' agents, and every metric but timing and the sandbox gauges is the local run's, for the seed."""
    Cluster = import_or_skip("ray.cluster_utils").Cluster  # CI installs Ray (the test extra)
    node = {"num_cpus": 1, "object_store_memory": 80 << 20}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    try:
        cluster.add_node(**node)
        workdir = tmp_path / "ray"
        _run(workdir, "--config.sandbox.fleet=ray", f"--config.sandbox.address={cluster.address}")
    finally:
        cluster.shutdown()
    records = read_metrics(workdir)
    assert without_timing(records) == without_timing(read_metrics(run_dir))
    # Both nodes were in the rotation, and the episodes' sandboxes came from their agents.
    leases = {k: v for k, v in records[-1].items() if k.startswith("sandbox/node/") and k.endswith("/leases")}
    assert records[-1]["sandbox/hosts"] == 2 and len(leases) == 2 and sum(leases.values()) > 0, leases
