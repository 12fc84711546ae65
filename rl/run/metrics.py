"""One metrics writer per run: ``metrics.jsonl`` + TensorBoard, on process 0 only.

Keys are namespaced (``train/loss``, ``rollout/reward_mean``,
``sandbox/exec_p99_s``). A NaN or Inf fails fast with the metric's name. On
resume, lines past the restored step are dropped, so a resumed run's file ends
up identical to an uninterrupted one's (timing keys aside).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

# Keys that measure wall time: they differ run to run and are excluded from
# exact-reproducibility comparisons.
TIMING_PREFIXES = ("time/", "perf/", "sandbox/")
# How the engine batched a step's work, and what it decoded while the step's rollout ran (engine-wide:
# overlapping asynchronous steps each count it): these follow the tools' latencies, so they vary
# between two runs whose episodes are identical (the episodes' own token counts do not).
SCHEDULE_KEYS = (
    "rollout/active_slots_mean",
    "rollout/prefill_tokens_padded",
    "rollout/decode_tokens",
    "rollout/decode_tokens_padded",
)


class NonFiniteMetricError(FloatingPointError):
    """A metric came out NaN or Inf; the message names it."""


def _to_python(value: Any) -> Any:
    if isinstance(value, (np.generic, np.ndarray)) or hasattr(value, "__array__"):
        arr = np.asarray(value)
        return arr.item() if arr.ndim == 0 else arr.tolist()
    return value


def check_finite(metrics: Mapping[str, Any], step: int) -> dict[str, Any]:
    """Converts to plain Python numbers; raises :class:`NonFiniteMetricError` naming a bad key."""
    out = {}
    for key, value in metrics.items():
        value = _to_python(value)
        if isinstance(value, float) and not math.isfinite(value):
            raise NonFiniteMetricError(f"metric {key!r} is {value} at step {step}")
        out[key] = value
    return out


class MetricsWriter:
    """Appends one JSON line per step; mirrors scalars to TensorBoard.

    Args:
      workdir: run directory (``metrics.jsonl`` and ``tb/`` live there).
      enabled: False on processes other than 0 (every call becomes a no-op).
      tensorboard: also write TensorBoard event files.
    """

    def __init__(self, workdir: str | os.PathLike, *, enabled: bool = True, tensorboard: bool = True):
        self.path = Path(workdir) / "metrics.jsonl"
        self.enabled = enabled
        self._tb = None
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if tensorboard:
                from tensorboardX import SummaryWriter

                self._tb = SummaryWriter(str(Path(workdir) / "tb"), flush_secs=30)

    def truncate_after(self, step: int) -> None:
        """Drops lines with ``step > step`` (and a torn last line) before a resumed run appends."""
        if not self.enabled or not self.path.exists():
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # torn write from a killed process
            if record.get("step", -1) <= step:
                kept.append(line)
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(k + "\n" for k in kept))
        os.replace(tmp, self.path)

    def write(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """Validates, then appends ``{"step": step, **metrics}``; returns the plain dict."""
        clean = check_finite(metrics, step)
        if not self.enabled:
            return clean
        line = json.dumps({"step": step, **clean}, sort_keys=True) + "\n"
        with open(self.path, "a") as f:  # one write per line: a kill leaves at most one torn line
            f.write(line)
            f.flush()
        if self._tb is not None:
            for key, value in clean.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tb.add_scalar(key.replace("@", "_at_"), value, step)
        return clean

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def read_metrics(workdir: str | os.PathLike) -> list[dict[str, Any]]:
    """All complete metric lines of a run, in order."""
    path = Path(workdir) / "metrics.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def without_timing(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The deterministic part of metric records (for resume == uninterrupted checks): no timings, no
    :data:`SCHEDULE_KEYS`."""
    return [
        {k: v for k, v in r.items() if not k.startswith(TIMING_PREFIXES) and k not in SCHEDULE_KEYS} for r in records
    ]
