"""``rl.results``: tables from synthetic trajectories written with ``rl.rollout.trajectory.write_step``.

Every number asserted here is known from how the episodes were built; nothing is timed
(the speed goal lives in ``benchmarks/results_bench.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from envs import Task
from rl import results
from rl.results import compare, format_episode, load_run, side_by_side, step_files
from rl.rollout import trajectory
from rl.rollout.trajectory import EpisodeRecord

REPO = Path(__file__).resolve().parents[2]
# A verifier's free-form details can hold the very key the fast decoder cuts at, in a string and as a key.
TRICKY_DETAILS = {"note": 'the model wrote "tool_calls": [] in its answer', "tool_calls": {"count": 7}}


def _call(name: str, duration: float, exit_code: int | None, *, malformed: bool = False, timed_out: bool = False):
    return {
        "turn": 1,
        "index": 0,
        "name": name,
        "arguments": {"command": "ls"} if not malformed else {},
        "output": f"output of {name}\n[exit code: {exit_code}]",
        "exit_code": exit_code,
        "timed_out": timed_out,
        "duration_s": duration,
        "error": "the tool call is not valid JSON" if malformed else None,
        "malformed": malformed,
        "sandbox": {"backend": "bwrap", "image": "agentrl-sandbox:test"},
    }


def _episode(step, task_id, group, index, reward, passed, *, domain="math", anomaly=None, calls=(), split="train",
             components=None, details=None, answer="42", sampled=3):  # fmt: skip
    e = EpisodeRecord(step, task_id, domain, group, index, seed=1000 * step + 10 * group + index, split=split)
    e.messages = [{"role": "user", "content": f"solve {task_id}"}]
    e.append([1, 2, 3, 4, 5], sampled=False)
    e.prompt_len = 5
    e.append([100 + i for i in range(sampled)], sampled=True, logprobs=[-0.25 * (i + 1) for i in range(sampled)])
    e.messages.append({"role": "assistant", "content": answer})
    e.turns.append({"completion": answer, "finish_reason": "stop", "tokens": sampled, "env_s": 0.01, "tool_calls": []})
    e.turns[0]["tool_calls"] = list(calls)
    e.tool_calls = list(calls)
    e.verification = {
        "reward": reward,
        "passed": passed,
        "components": {"outcome": reward} if components is None and anomaly is None else (components or {}),
        "details": details or {},
        "anomaly": anomaly,
        "verifier": "weighted",
        "duration_s": 0.002,
    }
    e.end_reason = "final_answer"
    return e


def _task(task_id: str, domain: str = "math", split: str = "train") -> Task:
    return Task(id=task_id, domain=domain, prompt=f"solve {task_id}", hidden={"answer": "42"}, split=split)


def _write_run(workdir: Path, seed: int = 0) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.json").write_text(json.dumps({"seed": seed, "rollout": {"group_size": 2}, "model": {}}))
    metrics = [
        {"step": 0, "phase": "init", "eval/greedy_pass_rate": 0.0, "eval/pass@1": 0.25, "eval/pass@2": 0.5},
        {"step": 1, "phase": "sft", "sft/loss": 2.0, "time/learn_s": 0.5, "time/step_s": 1.0},
        {"step": 2, "phase": "sft", "sft/loss": 1.5, "time/learn_s": 0.5, "time/step_s": 1.0},
        {"step": 3, "phase": "rl", "rollout/reward_mean": 0.1},  # superseded by the next line (a resumed run)
        {"step": 3, "phase": "rl", "rollout/reward_mean": 0.5, "rollout/anomaly_rate": 0.25, "rollout/episodes": 4.0,
         "rollout/sampled_tokens": 12.0, "time/generate_s": 2.0, "time/env_s": 1.0, "time/learn_s": 1.0,
         "time/step_s": 4.0},
        {"step": 4, "phase": "rl", "rollout/reward_mean": 0.5 + seed, "rollout/anomaly_rate": 0.0,
         "rollout/episodes": 4.0, "rollout/sampled_tokens": 12.0, "time/generate_s": 1.0, "time/env_s": 1.0,
         "time/learn_s": 1.0, "time/step_s": 4.0, "eval/greedy_pass_rate": 0.5, "eval/pass@1": 0.5,
         "eval/pass@2": 0.75},
    ]  # fmt: skip
    lines = [json.dumps(m) for m in metrics] + ['{"step": 5, "phase": "rl", "rollout/rew']  # a torn last line
    (workdir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    step3 = [
        _episode(3, "A", 0, 0, 1.0, True, calls=[_call("bash", 0.5, 0)]),
        _episode(3, "A", 0, 1, 0.0, False, calls=[_call("", 0.0, None, malformed=True)]),
        _episode(3, "B", 1, 0, 0.0, False, domain="code", anomaly="sandbox_vanished: container gone"),
        _episode(3, "B", 1, 1, 0.5, False, domain="code", components={"outcome": 0.5, "efficiency": 1.0},
                 calls=[_call("bash", 0.25, 1), _call("python", 2.0, None, timed_out=True)], details=TRICKY_DETAILS),
    ]  # fmt: skip
    step4 = [
        _episode(4, "A", 0, 0, 1.0, True, sampled=4),
        _episode(4, "A", 0, 1, 1.0, True),
        _episode(4, "C", 1, 0, 0.0, False, domain="code"),
        _episode(4, "C", 1, 1, 0.0, False, domain="code"),
    ]
    trajectory.write_step(workdir, 3, step3, tasks=[_task("A"), _task("B", "code")])
    trajectory.write_step(workdir, 4, step4, tasks=[_task("A"), _task("C", "code")])
    for step, answers in ((0, ("1", "2")), (4, ("1", "3"))):
        greedy = [_episode(step, f"E{g}", g, 0, float(g == 0), g == 0, split="eval", answer=answers[g]) for g in (0, 1)]
        sampled = [_episode(step, f"E{g}", g, i, 0.0, False, split="eval", answer="x") for g in (0, 1) for i in (0, 1)]
        for e in greedy:
            e.decoding = "greedy"
        path = trajectory.write_step(workdir, step, greedy + sampled, kind="eval", tasks=[_task("E0"), _task("E1")])
        if step == 0:  # written before the field was called "decoding"
            path.write_text(path.read_text().replace('"decoding": ', '"mode": '))
    return workdir


@pytest.fixture
def run_dir(tmp_path) -> Path:
    return _write_run(tmp_path / "run")


def test_import_leaves_jax_and_environments_out():
    code = (
        "import sys, rl.results\n"
        "heavy = [m for m in ('jax', 'flax', 'optax', 'orbax', 'envs', 'gymnasium', 'sandbox') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_metrics_phases_and_config(run_dir):
    run = load_run(run_dir)
    assert run.config["seed"] == 0
    assert run.metrics.index.tolist() == [0, 1, 2, 3, 4]  # duplicate step: last line wins; torn line skipped
    assert run.metrics.loc[3, "rollout/reward_mean"] == 0.5 and run.metrics.loc[2, "phase"] == "sft"
    assert (run.sft_end, run.rl_start, run.eval_steps) == (2, 3, [0, 4])
    assert "2 train + 2 eval trajectory steps" in repr(run)


def test_episode_table_is_one_flat_row_per_episode(run_dir):
    ep = load_run(run_dir).episodes
    assert len(ep) == 8 and ep["step"].tolist() == [3] * 4 + [4] * 4 and ep["row"].tolist() == [0, 1, 2, 3] * 2
    assert set(results.EPISODE_COLUMNS) < set(ep.columns)
    assert ep["phase"].unique().tolist() == ["rl"]
    assert ep["reward"].tolist() == [1.0, 0.0, 0.0, 0.5, 1.0, 1.0, 0.0, 0.0]
    assert ep["passed"].tolist() == [True, False, False, False, True, True, False, False]
    assert ep["valid"].tolist() == [True, True, False, True, True, True, True, True]
    assert ep.loc[2, "anomaly_cause"] == "sandbox_vanished" and ep["anomaly_cause"].isna().sum() == 7
    assert ep["tool_calls"].tolist() == [1, 1, 0, 2, 0, 0, 0, 0]
    assert ep.loc[3, "tool_time_s"] == pytest.approx(2.25) and ep.loc[0, "tool_time_s"] == pytest.approx(0.5)
    assert ep["tool_errors"].tolist() == [0, 1, 0, 2, 0, 0, 0, 0]  # malformed; exit 1 + timed out
    assert ep["malformed_calls"].tolist() == [0, 1, 0, 0, 0, 0, 0, 0]
    assert ep["num_tokens"].tolist() == [8, 8, 8, 8, 9, 8, 8, 8] and ep.loc[4, "sampled_tokens"] == 4
    assert ep.loc[3, "component/efficiency"] == 1.0 and ep["component/efficiency"].isna().sum() == 7
    assert ep["component/outcome"].iloc[[0, 1, 3]].tolist() == [1.0, 0.0, 0.5] and np.isnan(
        ep.loc[2, "component/outcome"]
    )
    assert ep.loc[0, "domain"] == "math" and ep.loc[3, "domain"] == "code" and ep.loc[0, "verifier"] == "weighted"


def test_fast_decoding_equals_decoding_whole_lines(run_dir, tmp_path):
    path = trajectory.step_files(run_dir)[0][1]
    for line in path.read_text().splitlines():
        whole, fast = json.loads(line), step_files.decode_summary(line)
        assert {k: fast[k] for k in step_files.NEEDED_KEYS} == {k: whole[k] for k in step_files.NEEDED_KEYS}
    # The same run with keys in another order (no fast cut possible) gives the same tables.
    other = tmp_path / "sorted"
    shutil.copytree(run_dir, other)
    for _, p in trajectory.step_files(other) + trajectory.step_files(other, "eval"):
        p.write_text("".join(json.dumps(json.loads(x), sort_keys=True) + "\n" for x in p.read_text().splitlines()))
    a, b = load_run(run_dir), load_run(other)
    pd.testing.assert_frame_equal(a.episodes, b.episodes)
    pd.testing.assert_frame_equal(a.eval_episodes, b.eval_episodes)
    pd.testing.assert_frame_equal(a.sandbox_latencies(), b.sandbox_latencies())


def test_task_table_hardest_first_and_anomalies_never_count_as_failures(run_dir):
    tasks = load_run(run_dir).task_table()
    assert tasks.index.tolist() == ["C", "B", "A"]
    assert tasks.loc["A", ["attempts", "anomalies"]].tolist() == [4, 0]
    assert tasks.loc["A", "mean_reward"] == pytest.approx(0.75) and tasks.loc["A", "pass_rate"] == pytest.approx(0.75)
    assert tasks.loc["B", ["attempts", "anomalies"]].tolist() == [2, 1]
    assert tasks.loc["B", "mean_reward"] == pytest.approx(0.5)  # over its one valid episode, not (0 + 0.5) / 2
    assert tasks.loc["C", ["domain", "first_step", "last_step"]].tolist() == ["code", 4, 4]
    evals = load_run(run_dir).task_table("eval")
    assert evals.loc["E0", "attempts"] == 6 and evals.loc["E0", "pass_rate"] == pytest.approx(2 / 6)
    with pytest.raises(ValueError, match="kind"):
        load_run(run_dir).task_table("test")


def test_sandbox_latencies_list_every_call_that_ran(run_dir):
    run = load_run(run_dir)
    lat = run.sandbox_latencies()
    assert lat["name"].tolist() == ["bash", "bash", "python"] and lat["kind"].unique().tolist() == ["train"]
    assert lat["duration_s"].tolist() == [0.5, 0.25, 2.0]
    assert lat["exit_code"].tolist()[:2] == [0, 1] and lat["timed_out"].tolist() == [False, False, True]
    assert lat[["step", "row", "task_id", "backend"]].iloc[1].tolist() == [3, 3, "B", "bwrap"]
    assert len(run.sandbox_latencies(include_malformed=True)) == 4 and run.sandbox_latencies("eval").empty
    with pytest.raises(ValueError, match="kind"):
        run.sandbox_latencies("both")


def test_one_full_episode_with_tokens_and_task(run_dir):
    run = load_run(run_dir)
    record = run.episode(4, 0)
    np.testing.assert_array_equal(record["token_ids"], [1, 2, 3, 4, 5, 100, 101, 102, 103])
    np.testing.assert_array_equal(record["loss_mask"], [0] * 5 + [1] * 4)
    np.testing.assert_allclose(record["logprobs"][5:], [-0.25, -0.5, -0.75, -1.0])
    assert record["messages"][-1] == {"role": "assistant", "content": "42"} and record["task"]["id"] == "A"
    assert run.episode(0, 4, kind="eval")["task_id"] == "E1"
    with pytest.raises(KeyError, match=r"step=9.*steps on disk: \[3, 4\]"):
        run.episode(9, 0)
    with pytest.raises(IndexError, match="row=8"):
        run.episode(3, 8)


def test_eval_episodes_are_split_into_greedy_and_sampled_and_diffed(run_dir):
    run = load_run(run_dir)
    ev = run.eval_episodes
    assert ev["decoding"].tolist() == (["greedy"] * 2 + ["sampled"] * 4) * 2
    assert ev["phase"].tolist() == ["init"] * 6 + ["rl"] * 6
    diff = run.eval_diff(0, 4)
    assert diff.index.tolist() == ["E0", "E1"] and diff["changed"].tolist() == [False, True]
    assert diff.loc["E1", ["answer_a", "answer_b", "row_a", "row_b"]].tolist() == ["2", "3", 1, 1]
    assert run.eval_diff(0, 4, decoding="sampled")["answer_b"].tolist() == ["x", "x"]


def test_eval_decoding_is_inferred_from_the_order_when_files_do_not_name_it(run_dir):
    path = trajectory.step_files(run_dir, "eval")[0][1]
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for record in lines:
        record.pop("mode")
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    rows, _ = step_files.parse_step(path, "eval")
    assert [r["decoding"] for r in rows] == ["greedy"] * 2 + ["sampled"] * 4


def test_refresh_reads_new_steps_and_ignores_unfinished_ones(run_dir):
    run = load_run(run_dir)
    assert len(run.episodes) == 8
    trajectory.write_step(run_dir, 5, [_episode(5, "D", 0, 0, 1.0, True)])
    (run_dir / "trajectories" / "step_00000006.tmp.jsonl").write_text("{torn")  # a step still being written
    assert len(run.episodes) == 8  # cached until refresh
    assert run.refresh().episodes["step"].tolist()[-1] == 5 and len(run.episodes) == 9


def test_runs_without_episodes_and_bad_workdirs(tmp_path):
    (tmp_path / "fresh").mkdir()
    (tmp_path / "fresh" / "config.json").write_text("{}")
    run = load_run(tmp_path / "fresh")
    assert run.episodes.empty and list(run.episodes.columns)[:3] == ["step", "row", "phase"]
    assert run.task_table().empty and run.sandbox_latencies().empty and run.metrics.empty
    assert run.sft_end is None and run.rl_start is None
    with pytest.raises(FileNotFoundError, match="no-such-run"):
        load_run(tmp_path / "no-such-run")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"holds no config\.json"):
        load_run(tmp_path / "empty")


def test_format_episode_renders_turns_tool_calls_and_the_verdict(run_dir):
    run = load_run(run_dir)
    text = format_episode(run.episode(3, 3))
    for needle in (
        "B (code) · train step 3 row 3",
        "[user]\nsolve B",
        "── turn 1 · assistant (3 tokens, finish stop)",
        '→ tool call bash({"command": "ls"})  [exit 1, 250.0 ms]',
        "[exit —, 2000.0 ms, timed_out]",
        "output of python",
        "outcome          0.500",
        "efficiency       1.000",
        '"count": 7',
    ):
        assert needle in text, needle
    assert "error: the tool call is not valid JSON" in format_episode(run.episode(3, 1))
    record = run.episode(3, 0)
    record["turns"][0]["completion"] = "\x1b[31mred" + "y" * 5000
    text = format_episode(record, max_chars=100)
    assert "\\x1b[31mred" in text and "\x1b" not in text and "characters cut" in text
    with pytest.raises(TypeError, match="record"):
        format_episode(run.episodes.iloc[0])


def test_compare_summary_curves_and_config_diff(tmp_path):
    a, b = _write_run(tmp_path / "a"), _write_run(tmp_path / "b", seed=1)
    comparison = compare({"a": load_run(a), "b": b})
    summary = comparison.summary()
    assert summary.loc["a", "final eval/greedy_pass_rate"] == 0.5 and summary.loc["a", "final eval/pass@2"] == 0.75
    assert summary.loc["a", ["steps", "sft_steps", "rl_steps"]].tolist() == [4, 2, 2]
    assert summary.loc["a", "wall_s"] == pytest.approx(10.0)
    assert summary.loc["a", "generate_tokens_per_s"] == pytest.approx(24 / 3)
    assert summary.loc["a", "rl_tokens_per_wall_s"] == pytest.approx(24 / 8)
    assert summary.loc["a", "anomaly_rate"] == pytest.approx(1 / 8)  # weighted by episodes
    assert summary.loc["b", "final rollout/reward_mean"] == pytest.approx(1.5)
    assert comparison.config_diff().to_dict("index") == {"seed": {"a": 0, "b": 1}}
    curves = comparison.curves("rollout/reward_mean")
    assert curves.columns.tolist() == ["a", "b"] and curves.index.tolist() == [3, 4]
    assert compare([a, b]).runs.keys() == {"a", "b"}
    with pytest.raises(KeyError, match="no run logged"):
        comparison.curves("train/nope")
    with pytest.raises(TypeError, match="several runs"):
        compare(str(a))


def test_side_by_side_pads_the_shorter_text():
    text = side_by_side("one\ntwo\nthree", "uno", width=10, titles=("left", "right"))
    lines = text.splitlines()
    assert len(lines) == 5 and lines[0].startswith("left") and lines[2] == "one        │ uno"
    assert lines[4] == "three      │ "
