"""Several runs side by side: overlaid curves, a summary table, and what their configs change."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from rl.config.config_file import flatten
from rl.results.loader import Run, load_run


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
