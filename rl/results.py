"""A run's workdir as pandas tables, without JAX: ``run = load_run("runs/quickstart")``.

Notebooks and scripts that read results must not need JAX, Flax, a sandbox or
an accelerator, so this module imports only numpy, pandas, json and the
numpy-only :mod:`rl.trajectory` / :mod:`rl.metrics`, which own the on-disk format.

Why loading is fast: a step file holds one JSON line per episode, and most of
each line is the conversation (``messages``, ``turns``) that the tables never
use. Each line is cut at its top-level keys: only the scalar head (everything
before ``"messages"``) and the tail from the top-level ``"tool_calls"`` on
(tool calls, verification, counts) are decoded. The cut is safe: inside a JSON
string every quote is escaped, so ``"tool_calls": `` can only match a key, and
a cut at a nested key leaves brackets unbalanced, which fails to decode; such a
line is decoded whole. Conversations and token arrays are read only when asked
for, one episode at a time (:meth:`Run.episode`). Parsed step files are cached
by size and mtime, so :meth:`Run.refresh` on a live run reads only new steps.
"""

from __future__ import annotations

import functools
import json
import os
import re
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rl import trajectory
from rl.metrics import read_metrics

KINDS = ("train", "eval")
EPISODE_COLUMNS = (
    *("step", "row", "phase", "task_id", "domain", "group", "index", "seed", "split", "reward", "passed"),
    *("valid", "anomaly", "anomaly_cause", "end_reason", "num_turns", "num_tokens", "sampled_tokens", "prompt_len"),
    *("tool_calls", "tool_time_s", "tool_errors", "malformed_calls", "advantage", "trained", "verifier", "verify_s"),
)
TOOL_COLUMNS = (
    *("kind", "step", "row", "task_id", "domain", "turn", "index", "name", "duration_s", "exit_code"),
    *("timed_out", "malformed", "error", "backend"),
)
_HEAD_CUT, _TAIL_CUT = ', "messages": ', '"tool_calls": '
_SUMMARY_KEYS = (
    *("step", "row", "task_id", "domain", "group", "index", "seed", "split", "reward", "passed", "anomaly"),
    *("end_reason", "num_turns", "num_tokens", "sampled_tokens", "prompt_len", "advantage", "trained"),
)
_NEEDED = frozenset((*_SUMMARY_KEYS, "verification", "tool_calls"))
_CALL_KEYS = ("turn", "index", "name", "duration_s", "exit_code", "timed_out", "malformed", "error")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def _decode_summary(line: str) -> dict[str, Any]:
    """The fields of one episode line the tables use (see the module docstring for the cut)."""
    head_end, tail_start = line.find(_HEAD_CUT), line.rfind(_TAIL_CUT)
    if 0 < head_end < tail_start:
        try:
            record = json.loads(line[:head_end] + "}")
            record.update(json.loads("{" + line[tail_start:]))
            if _NEEDED.issubset(record):  # any other key order is decoded whole
                return record
        except json.JSONDecodeError:
            pass
    return json.loads(line)


def _parse_step(path: Path, kind: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One step file -> (episode rows, tool-call rows)."""
    episodes, tools, seen, mode = [], [], set(), "greedy"
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            r = _decode_summary(line)
            v, calls = r.get("verification") or {}, r.get("tool_calls") or []
            row = {k: r.get(k) for k in _SUMMARY_KEYS}
            row.update(
                tool_calls=len(calls),
                tool_time_s=float(sum(c.get("duration_s") or 0.0 for c in calls)),
                tool_errors=sum(bool(c.get("error") or c.get("timed_out") or c.get("exit_code")) for c in calls),
                malformed_calls=sum(bool(c.get("malformed")) for c in calls),
                verifier=v.get("verifier"),
                verify_s=v.get("duration_s"),
            )
            if kind == "eval":
                # The evaluator writes the greedy episodes (one per task) first, then the k sampled
                # ones, each numbered from group 0: the first repeated (group, index) starts them.
                key = (row["group"], row["index"])
                mode = "sampled" if mode == "sampled" or key in seen else "greedy"
                seen.add(key)
                row["mode"] = mode
            for name, value in (v.get("components") or {}).items():
                row[f"component/{name}"] = value
            episodes.append(row)
            for c in calls:
                call = {k: c.get(k) for k in _CALL_KEYS}
                call.update(kind=kind, backend=(c.get("sandbox") or {}).get("backend"))
                tools.append({**{k: row[k] for k in ("step", "row", "task_id", "domain")}, **call})
    return episodes, tools


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
        config_path = self.workdir / "config.json"
        self.config: dict[str, Any] = json.loads(config_path.read_text()) if config_path.exists() else {}
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
                cached = self._files[path] = (key, *_parse_step(path, kind))
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
        columns = [*EPISODE_COLUMNS, *(["mode"] if kind == "eval" else []), *components]
        return frame.reindex(columns=columns)

    @functools.cached_property
    def episodes(self) -> pd.DataFrame:
        """One row per training episode (columns: :data:`EPISODE_COLUMNS` + ``component/<name>``)."""
        return self._episode_table("train")

    @functools.cached_property
    def eval_episodes(self) -> pd.DataFrame:
        """One row per evaluation episode, as :attr:`episodes` plus ``mode`` (``greedy`` / ``sampled``)."""
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

    def eval_diff(self, step_a: int, step_b: int, mode: str = "greedy") -> pd.DataFrame:
        """Per held-out task, the final answers and rewards at two eval steps (e.g. two checkpoints)."""
        if mode not in ("greedy", "sampled"):
            raise ValueError(f"eval_diff(mode=): expected 'greedy' or 'sampled', got {mode!r}")
        sides = []
        for label, step in (("a", step_a), ("b", step_b)):
            modes = self.eval_episodes.loc[self.eval_episodes["step"] == step, "mode"].tolist()
            chosen = {}
            for record, m in zip(self.records(step, "eval"), modes, strict=True):
                if m == mode and record["task_id"] not in chosen:
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
    if not any((path / name).exists() for name in ("metrics.jsonl", "trajectories", "config.json")):
        raise ValueError(f"load_run(workdir=): {str(path)!r} holds no config.json, metrics.jsonl or trajectories/")
    return Run(path)


# -- rendering ----------------------------------------------------------------------------------
def _clean(text: Any, max_chars: int) -> str:
    """Control characters escaped (a sampled byte can be a terminal escape) and long text cut in the middle."""
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))
    if len(text) > max_chars:
        cut = len(text) - max_chars
        text = f"{text[: max_chars // 2]}\n[... {cut} characters cut ...]\n{text[-max_chars // 2 :]}"
    return text


def final_answer(record: Mapping[str, Any]) -> str:
    """The last assistant message of an episode ('' if it never answered)."""
    replies = [m.get("content", "") for m in record.get("messages", []) if m.get("role") == "assistant"]
    return replies[-1] if replies else ""


def _tool_call_lines(call: Mapping[str, Any], max_chars: int) -> list[str]:
    exit_code = "—" if call.get("exit_code") is None else call.get("exit_code")
    flags = [f"exit {exit_code}", f"{float(call.get('duration_s') or 0.0) * 1000:.1f} ms"]
    flags += [flag for flag in ("timed_out", "malformed") if call.get(flag)]
    name = call.get("name") or "<unparsed>"
    lines = [f"  → tool call {name}({_clean(json.dumps(call.get('arguments', {})), max_chars)})  [{', '.join(flags)}]"]
    output = str(call.get("output", ""))
    if call.get("error") and str(call["error"]) not in output:
        output = f"error: {call['error']}\n{output}"
    return lines + ["    " + line for line in _clean(output, max_chars).splitlines()]


def format_episode(record: Mapping[str, Any], *, max_chars: int = 2000) -> str:
    """One episode turn by turn: prompt, each reply, its tool calls with outputs and exit codes, the verdict.

    ``record`` is a full record (:meth:`Run.episode` or :meth:`Run.records`); text longer
    than ``max_chars`` is cut in the middle.
    """
    if not isinstance(record, Mapping) or "task_id" not in record:
        raise TypeError(
            f"format_episode(record=): expected an episode record (Run.episode), got {type(record).__name__}"
        )
    v = record.get("verification") or {}
    where = f"{record.get('kind', 'train')} step {record.get('step')} row {record.get('row')}"
    out = [
        f"══ {record['task_id']} ({record.get('domain')}) · {where} · group {record.get('group')} #{record.get('index')}",
        f"reward {float(record.get('reward', 0.0)):.3f} · passed {record.get('passed')} · anomaly {record.get('anomaly')}"
        f" · end {record.get('end_reason')} · {record.get('num_turns')} turns · {record.get('num_tokens')} tokens"
        f" ({record.get('sampled_tokens')} sampled)",
    ]
    messages = list(record.get("messages", []))
    first_reply = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))
    for m in messages[:first_reply]:
        out += ["", f"[{m.get('role')}]", _clean(m.get("content", ""), max_chars)]
    turns = record.get("turns") or []
    for i, turn in enumerate(turns, 1):
        out += ["", f"── turn {i} · assistant ({turn.get('tokens')} tokens, finish {turn.get('finish_reason')})"]
        out.append(_clean(turn.get("completion", ""), max_chars))
        for call in turn.get("tool_calls", []):
            out += _tool_call_lines(call, max_chars)
        for m in turn.get("observation", []):
            if m.get("role") != "tool":
                out += [f"  [{m.get('role')}] " + _clean(m.get("content", ""), max_chars)]
    if not turns:  # e.g. an episode whose reset failed: show whatever conversation there is
        out += [f"\n[{m.get('role')}]\n{_clean(m.get('content', ''), max_chars)}" for m in messages[first_reply:]]
    out += ["", f"══ verification by {v.get('verifier') or '?'}: reward {float(v.get('reward', 0.0)):.3f}, "]
    out[-1] += f"passed {v.get('passed')}, anomaly {v.get('anomaly')}"
    for name, value in (v.get("components") or {}).items():
        out.append(f"  {name:<16s} {value:.3f}")
    for key, detail in (v.get("details") or {}).items():
        if isinstance(detail, Mapping) and "verifier" in detail:  # a part of a weighted verifier
            head = f"{detail['verifier']}: reward {detail.get('reward')}, passed {detail.get('passed')}"
            key, detail = f"{key} <- {head}", detail.get("details", {})
        out.append(f"  {key}: " + _clean(json.dumps(detail, default=str), max_chars))
    return "\n".join(out)


def side_by_side(left: str, right: str, *, width: int = 60, titles: tuple[str, str] = ("A", "B")) -> str:
    """Two texts in two columns (each line wrapped at ``width``), for diffing answers by eye."""

    def wrap(text: str) -> list[str]:
        return [w for line in text.splitlines() for w in (textwrap.wrap(line, width) or [""])]

    a, b = wrap(left), wrap(right)
    rows = [f"{titles[0]:<{width}} │ {titles[1]}", f"{'─' * width}─┼─{'─' * width}"]
    rows += [
        f"{x:<{width}} │ {y}" for x, y in zip(a + [""] * (len(b) - len(a)), b + [""] * (len(a) - len(b)), strict=True)
    ]
    return "\n".join(rows)


# -- comparing runs -------------------------------------------------------------------------------
def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists are kept whole, as JSON text)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = json.dumps(value) if isinstance(value, (list, dict)) else value
    return out


class Comparison:
    """Several runs side by side: overlaid curves, a summary table, and what their configs change."""

    def __init__(self, runs: Mapping[str, Run]):
        if not runs:
            raise ValueError("compare(runs=): expected at least one run")
        self.runs = dict(runs)

    def curves(self, key: str) -> pd.DataFrame:
        """Metric ``key`` per step, one column per run (NaN where a run did not log it)."""
        columns = {name: run.metrics[key] for name, run in self.runs.items() if key in run.metrics}
        if not columns:
            raise KeyError(f"curves(key=): no run logged {key!r}")
        return pd.DataFrame(columns).dropna(how="all")

    def summary(self) -> pd.DataFrame:
        """Per run: steps, wall time, final and best eval metrics, throughput, episode-weighted anomaly rate."""
        return pd.DataFrame.from_dict({name: _run_summary(run) for name, run in self.runs.items()}, orient="index")

    def config_diff(self) -> pd.DataFrame:
        """The config fields whose values differ between runs (rows), one column per run."""
        flat = pd.DataFrame({name: pd.Series(flatten(run.config), dtype=object) for name, run in self.runs.items()})
        differs = flat.astype(str).nunique(axis=1, dropna=False) > 1
        return flat[differs].sort_index()


def _run_summary(run: Run) -> dict[str, Any]:
    m, nan = run.metrics, float("nan")

    def total(frame: pd.DataFrame, key: str) -> float:
        return float(frame[key].sum()) if key in frame and len(frame) else nan

    def last(frame: pd.DataFrame, key: str) -> float:
        values = frame[key].dropna() if key in frame else ()
        return float(values.iloc[-1]) if len(values) else nan

    out: dict[str, Any] = {"steps": int(m.index.max()) if len(m) else 0, "sft_steps": len(run._steps_of("sft"))}
    out.update(rl_steps=len(run._steps_of("rl")), wall_s=total(m, "time/step_s"))
    for key in sorted(k for k in m.columns if re.fullmatch(r"eval/(greedy_pass_rate|pass@\d+)", k)):
        out[f"final {key}"] = last(m, key)
    out["best eval/greedy_pass_rate"] = float(m["eval/greedy_pass_rate"].max()) if "eval/greedy_pass_rate" in m else nan
    rl = m[m["phase"] == "rl"] if "phase" in m else m.iloc[:0]
    out["final rollout/reward_mean"] = last(rl, "rollout/reward_mean")
    out["sampled_tokens"] = sampled = total(rl, "rollout/sampled_tokens")
    out["generate_tokens_per_s"] = sampled / total(rl, "time/generate_s")
    out["rl_tokens_per_wall_s"] = sampled / total(rl, "time/step_s")
    weighted = total(rl.assign(bad=rl.get("rollout/anomaly_rate", nan) * rl.get("rollout/episodes", nan)), "bad")
    out["anomaly_rate"] = weighted / total(rl, "rollout/episodes")
    return out


def compare(runs: Mapping[str, Run | str | os.PathLike] | Sequence[str | os.PathLike]) -> Comparison:
    """A :class:`Comparison` of named runs (``{"name": run_or_workdir}``) or of workdirs (named by folder)."""
    if isinstance(runs, (str, os.PathLike)):
        raise TypeError("compare(runs=): expected several runs (a dict or a list of workdirs), got one path")
    if not isinstance(runs, Mapping):
        named: dict[str, Any] = {}
        for workdir in runs:
            name = Path(workdir).name or str(workdir)
            named[name if name not in named else f"{name}#{len(named)}"] = workdir
        runs = named
    return Comparison({name: r if isinstance(r, Run) else load_run(r) for name, r in runs.items()})
