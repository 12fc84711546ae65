"""A run's workdir as pandas tables, without JAX: ``run = load_run("runs/quickstart")``.

:class:`Run` reads ``config.json``, ``metrics.jsonl`` and the trajectory step
files (:mod:`rl.rollout.trajectory` owns their format). Tables are built on first
use from the fast row decoder of :mod:`rl.results.step_files`; conversations and
token arrays are read only when asked for, one episode at a time
(:meth:`Run.episode`). Parsed step files are cached by size and mtime, so
:meth:`Run.refresh` on a live run reads only new steps.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rl.config.config_file import CONFIG_FILE, read_config
from rl.results.episode_text import final_answer
from rl.results.step_files import parse_step
from rl.rollout import trajectory
from rl.rollout.trajectory import DECODINGS, KINDS
from rl.run.metrics import read_metrics

EPISODE_COLUMNS = (
    *("step", "row", "phase", "task_id", "domain", "group", "index", "seed", "split", "reward", "passed"),
    *("valid", "anomaly", "anomaly_cause", "end_reason", "num_turns", "num_tokens", "sampled_tokens", "prompt_len"),
    *("tool_calls", "tool_time_s", "tool_errors", "malformed_calls", "advantage", "trained", "verifier", "verify_s"),
)
TOOL_COLUMNS = (
    *("kind", "step", "row", "task_id", "domain", "turn", "index", "name", "duration_s", "exit_code"),
    *("timed_out", "malformed", "error", "backend"),
)


class Run:
    """One workdir: ``config``, ``metrics`` (indexed by step), episode tables, single episodes.

    Build it with :func:`load_run`. Tables are built on first use and cached;
    :meth:`refresh` re-reads a run that is still being written.
    """

    def __init__(self, workdir: str | os.PathLike):
        self.workdir = Path(workdir)
        self._files: dict[Path, tuple[tuple[int, int], list, list]] = {}
        self.refresh()

    def refresh(self) -> Run:
        """Re-reads config and metrics and drops cached tables (step files already parsed are kept)."""
        self.config: dict[str, Any] = read_config(self.workdir)
        records = read_metrics(self.workdir)
        frame = pd.DataFrame.from_records(records) if records else pd.DataFrame({"step": [], "phase": []})
        frame["step"] = frame["step"].astype("int64")
        self.metrics: pd.DataFrame = frame.drop_duplicates("step", keep="last").set_index("step").sort_index()
        for name in ("episodes", "eval_episodes", "_tool_table"):
            self.__dict__.pop(name, None)
        return self

    def __repr__(self) -> str:
        phases = self.metrics["phase"].value_counts().to_dict() if "phase" in self.metrics else {}
        train, evals = trajectory.step_files(self.workdir, "train"), trajectory.step_files(self.workdir, "eval")
        return (
            f"Run({str(self.workdir)!r}: {len(self.metrics)} metric steps {phases}, "
            f"{len(train)} train + {len(evals)} eval trajectory steps)"
        )

    # -- phases --------------------------------------------------------------------------
    def _steps_of(self, phase: str) -> list[int]:
        return self.metrics.index[self.metrics["phase"] == phase].tolist() if "phase" in self.metrics else []

    @property
    def sft_end(self) -> int | None:
        """The last SFT step (the SFT→RL boundary is drawn after it); None for a run without SFT."""
        return max(self._steps_of("sft"), default=None)

    @property
    def rl_start(self) -> int | None:
        """The first RL step; None until RL has started."""
        return min(self._steps_of("rl"), default=None)

    @property
    def eval_steps(self) -> list[int]:
        """Steps with evaluation episodes on disk."""
        return [step for step, _ in trajectory.step_files(self.workdir, "eval")]

    # -- tables ----------------------------------------------------------------------------
    def _parsed(self, kind: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        episodes, tools = [], []
        for _, path in trajectory.step_files(self.workdir, kind):
            stat = path.stat()
            key = (stat.st_mtime_ns, stat.st_size)
            cached = self._files.get(path)
            if cached is None or cached[0] != key:
                cached = self._files[path] = (key, *parse_step(path, kind))
            episodes += cached[1]
            tools += cached[2]
        return episodes, tools

    def _episode_table(self, kind: str) -> pd.DataFrame:
        rows, _ = self._parsed(kind)
        frame = pd.DataFrame.from_records(rows) if rows else pd.DataFrame(columns=["step", "anomaly"])
        frame["phase"] = frame["step"].map(self.metrics["phase"]) if "phase" in self.metrics else None
        frame["valid"] = frame["anomaly"].isna()
        frame["anomaly_cause"] = frame["anomaly"].where(frame["valid"].eq(False)).str.split(":").str[0]
        components = sorted(c for c in frame.columns if c.startswith("component/"))
        columns = [*EPISODE_COLUMNS, *(["decoding"] if kind == "eval" else []), *components]
        return frame.reindex(columns=columns)

    @functools.cached_property
    def episodes(self) -> pd.DataFrame:
        """One row per training episode (columns: :data:`EPISODE_COLUMNS` + ``component/<name>``)."""
        return self._episode_table("train")

    @functools.cached_property
    def eval_episodes(self) -> pd.DataFrame:
        """One row per evaluation episode, as :attr:`episodes` plus ``decoding`` (``greedy`` / ``sampled``)."""
        return self._episode_table("eval")

    @functools.cached_property
    def _tool_table(self) -> pd.DataFrame:
        rows = self._parsed("train")[1] + self._parsed("eval")[1]
        return pd.DataFrame.from_records(rows, columns=list(TOOL_COLUMNS))

    def sandbox_latencies(self, kind: str = "all", *, include_malformed: bool = False) -> pd.DataFrame:
        """Every tool call (one row each, ``duration_s`` its latency); malformed calls never ran, so are left out."""
        if kind not in (*KINDS, "all"):
            raise ValueError(f"sandbox_latencies(kind=): expected 'train', 'eval' or 'all', got {kind!r}")
        table = self._tool_table
        keep = pd.Series(True, index=table.index) if kind == "all" else table["kind"] == kind
        if not include_malformed:
            keep &= ~table["malformed"].fillna(False).astype(bool)
        return table[keep].reset_index(drop=True)

    def task_table(self, kind: str = "train") -> pd.DataFrame:
        """Per task: attempts, anomalies, mean reward and pass rate over valid episodes; hardest first.

        Anomalous episodes count as attempts but never as failures (the harness failed, not the policy).
        """
        frame = self._frame(kind)
        frame = frame.assign(
            anomalous=~frame["valid"].astype(bool),
            valid_reward=frame["reward"].where(frame["valid"]),
            valid_passed=frame["passed"].astype(float).where(frame["valid"]),
        )
        table = frame.groupby("task_id").agg(
            domain=("domain", "first"),
            attempts=("step", "size"),
            anomalies=("anomalous", "sum"),
            mean_reward=("valid_reward", "mean"),
            pass_rate=("valid_passed", "mean"),
            first_step=("step", "min"),
            last_step=("step", "max"),
        )
        return table.sort_values(["pass_rate", "mean_reward", "attempts"], ascending=[True, True, False])

    def _frame(self, kind: str) -> pd.DataFrame:
        if kind not in KINDS:
            raise ValueError(f"kind: expected 'train' or 'eval', got {kind!r}")
        return self.episodes if kind == "train" else self.eval_episodes

    # -- single episodes --------------------------------------------------------------------
    def _step_path(self, step: int, kind: str) -> Path:
        path = trajectory.trajectory_dir(self.workdir, kind) / f"step_{int(step):08d}.jsonl"
        if not path.exists():
            steps = [s for s, _ in trajectory.step_files(self.workdir, kind)]
            raise KeyError(f"step={step}: no {kind} trajectories at that step; {kind} steps on disk: {steps}")
        return path

    def records(self, step: int, kind: str = "train") -> list[dict[str, Any]]:
        """Every episode of one step as written (conversations, tool calls, verification), no token arrays."""
        return trajectory.read_step(self._step_path(step, kind), arrays=False)

    def episode(self, step: int, row: int, kind: str = "train") -> dict[str, Any]:
        """One full episode: the written record, its token arrays (numpy) and its task (a dict), if saved."""
        path = self._step_path(step, kind)
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        if not 0 <= row < len(lines):
            raise IndexError(f"row={row}: {kind} step {step} has {len(lines)} episodes")
        record = json.loads(lines[row])
        with np.load(path.with_suffix(".npz")) as data:
            lo, hi = data["offsets"][record["row"]], data["offsets"][record["row"] + 1]
            for key in ("token_ids", "loss_mask", "logprobs"):
                record[key] = data[key][lo:hi]
        record["kind"] = kind
        tasks_path = path.with_suffix(".tasks")
        if tasks_path.exists():
            tasks = (json.loads(line) for line in tasks_path.read_text().splitlines() if line.strip())
            record["task"] = next((t for t in tasks if t.get("id") == record["task_id"]), None)
        return record

    def eval_diff(self, step_a: int, step_b: int, decoding: str = "greedy") -> pd.DataFrame:
        """Per held-out task, the final answers and rewards at two eval steps (e.g. two checkpoints)."""
        if decoding not in DECODINGS:
            raise ValueError(f"eval_diff(decoding=): expected one of {DECODINGS}, got {decoding!r}")
        sides = []
        for label, step in (("a", step_a), ("b", step_b)):
            decodings = self.eval_episodes.loc[self.eval_episodes["step"] == step, "decoding"].tolist()
            chosen = {}
            for record, d in zip(self.records(step, "eval"), decodings, strict=True):
                if d == decoding and record["task_id"] not in chosen:
                    chosen[record["task_id"]] = {
                        f"reward_{label}": record.get("reward"),
                        f"passed_{label}": record.get("passed"),
                        f"answer_{label}": final_answer(record),
                        f"row_{label}": record["row"],
                    }
            sides.append(pd.DataFrame.from_dict(chosen, orient="index"))
        table = sides[0].join(sides[1], how="inner")
        table.index.name = "task_id"
        table["changed"] = table["answer_a"] != table["answer_b"]
        return table


def load_run(workdir: str | os.PathLike) -> Run:
    """Opens a run directory (``config.json``, ``metrics.jsonl``, ``trajectories/``)."""
    path = Path(workdir)
    if not path.is_dir():
        raise FileNotFoundError(f"load_run(workdir=): {str(path)!r} is not a directory")
    if not any((path / name).exists() for name in ("metrics.jsonl", "trajectories", CONFIG_FILE)):
        raise ValueError(f"load_run(workdir=): {str(path)!r} holds no config.json, metrics.jsonl or trajectories/")
    return Run(path)
