"""Episodes as the learner and the notebooks see them, and their on-disk format.

An :class:`EpisodeRecord` is token-exact: ``token_ids`` is the prompt, then per
turn the sampled ids (``loss_mask`` 1, sampler log-probs kept) and the
observation ids (mask 0), exactly as the sampler and the tokenizer produced
them; nothing is ever re-tokenized. It also keeps the conversation, every tool
call with its output, exit code and timing, the verifier's breakdown, seeds
and the sandbox image, so ``python -m rl.replay`` can re-run it.

On disk, step ``s`` of a run is two files under ``<workdir>/trajectories/``:
``step_00000s.jsonl`` (one JSON object per episode, arrays left out, so a
notebook loads 10k episodes in seconds) and ``step_00000s.npz`` (all token
arrays concatenated, with offsets). Both are written to a temporary name and
renamed, so a killed run never leaves a torn step.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

_STEP_FILE = re.compile(r"step_(\d{8})\.jsonl$")
#: Trajectory kinds: training rollouts go to ``trajectories/``, evaluation ones to ``trajectories/eval/``.
KINDS = ("train", "eval")
#: How an episode's completions were chosen: sampled (training, pass@k) or greedy (argmax).
DECODINGS = ("sampled", "greedy")


@dataclasses.dataclass
class EpisodeRecord:
    """One episode of one group. Mutable while the rollout builds it."""

    step: int
    task_id: str
    domain: str
    group: int
    index: int
    seed: int
    split: str = "train"
    decoding: str = "sampled"  # how its completions were chosen: "sampled" or "greedy" (see DECODINGS)
    policy_version: int = -1  # the learner step whose parameters sampled it (step - 1: on-policy)
    token_ids: list[int] = dataclasses.field(default_factory=list)
    loss_mask: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    prompt_len: int = 0
    messages: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    turns: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    tool_calls: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    verification: dict[str, Any] | None = None
    end_reason: str = ""
    sandbox: dict[str, Any] = dataclasses.field(default_factory=dict)
    advantage: float = 0.0
    trained: bool = False
    timing: dict[str, float] = dataclasses.field(default_factory=dict)

    def append(self, ids: list[int], *, sampled: bool, logprobs: list[float] | None = None) -> None:
        self.token_ids.extend(ids)
        self.loss_mask.extend([1 if sampled else 0] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))

    @property
    def reward(self) -> float:
        return float(self.verification["reward"]) if self.verification else 0.0

    @property
    def passed(self) -> bool:
        return bool(self.verification and self.verification.get("passed"))

    @property
    def anomaly(self) -> str | None:
        return self.verification.get("anomaly") if self.verification else "no_verification"

    @property
    def sampled_tokens(self) -> int:
        return int(sum(self.loss_mask))

    def summary(self) -> dict[str, Any]:
        """The JSON part (everything but the token arrays)."""
        out = dataclasses.asdict(self)
        for key in ("token_ids", "loss_mask", "logprobs"):
            out.pop(key)
        out.update(
            reward=self.reward,
            passed=self.passed,
            anomaly=self.anomaly,
            num_tokens=len(self.token_ids),
            sampled_tokens=self.sampled_tokens,
            num_turns=len(self.turns),
        )
        return out


def trajectory_dir(workdir: str | os.PathLike, kind: str = "train") -> Path:
    """``trajectories/`` for training episodes, ``trajectories/eval/`` for evaluation ones."""
    if kind not in KINDS:
        raise ValueError(f"kind: expected one of {KINDS}, got {kind!r}")
    root = Path(workdir) / "trajectories"
    return root if kind == "train" else root / "eval"


def write_step(
    workdir: str | os.PathLike,
    step: int,
    episodes: list[EpisodeRecord],
    kind: str = "train",
    tasks: list[Any] | None = None,
) -> Path:
    """Writes one step's episodes (and the tasks they ran, for replay) atomically; returns the JSONL path."""
    directory = trajectory_dir(workdir, kind)
    directory.mkdir(parents=True, exist_ok=True)
    stem = directory / f"step_{step:08d}"
    lengths = np.array([len(e.token_ids) for e in episodes], np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    arrays = {
        "offsets": offsets,
        "token_ids": np.array([t for e in episodes for t in e.token_ids], np.int32),
        "loss_mask": np.array([m for e in episodes for m in e.loss_mask], np.int8),
        "logprobs": np.array([p for e in episodes for p in e.logprobs], np.float32),
    }
    tmp_npz = stem.with_name(stem.name + ".tmp.npz")
    np.savez(tmp_npz, **arrays)
    tmp_jsonl = stem.with_name(stem.name + ".tmp.jsonl")
    with open(tmp_jsonl, "w") as f:
        for i, episode in enumerate(episodes):
            f.write(json.dumps({"row": i, **episode.summary()}, default=str) + "\n")
    if tasks is not None:
        tmp_tasks = stem.with_name(stem.name + ".tmp.tasks")
        unique = {t.id: t for t in tasks}
        tmp_tasks.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in unique.values()))
        os.replace(tmp_tasks, stem.with_suffix(".tasks"))
    os.replace(tmp_npz, stem.with_suffix(".npz"))
    os.replace(tmp_jsonl, stem.with_suffix(".jsonl"))  # the JSONL last: its presence means "step complete"
    return stem.with_suffix(".jsonl")


def truncate_after(workdir: str | os.PathLike, step: int) -> int:
    """Removes steps after ``step`` (and temporaries) of both kinds before a resumed run rewrites them."""
    removed = 0
    for kind in KINDS:
        directory = trajectory_dir(workdir, kind)
        if directory.exists():
            removed += _truncate_dir(directory, step)
    return removed


def _truncate_dir(directory: Path, step: int) -> int:
    removed = 0
    for path in directory.iterdir():
        if path.is_dir():
            continue
        match = re.match(r"step_(\d{8})", path.name)
        if ".tmp." in path.name or (match and int(match.group(1)) > step):
            path.unlink()
            removed += 1
    return removed


def step_files(workdir: str | os.PathLike, kind: str = "train") -> list[tuple[int, Path]]:
    """Complete steps on disk, in order."""
    directory = trajectory_dir(workdir, kind)
    if not directory.exists():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _STEP_FILE.search(p.name))]
    return sorted(found)


def read_step(path: str | os.PathLike, *, arrays: bool = True) -> list[dict[str, Any]]:
    """All episodes of one step file; with ``arrays`` their token arrays too."""
    path = Path(path)
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if arrays:
        data = np.load(path.with_suffix(".npz"))
        offsets = data["offsets"]
        for r in records:
            lo, hi = offsets[r["row"]], offsets[r["row"] + 1]
            r["token_ids"] = data["token_ids"][lo:hi].tolist()
            r["loss_mask"] = data["loss_mask"][lo:hi].tolist()
            r["logprobs"] = data["logprobs"][lo:hi].tolist()
    return records


def read_tasks(path: str | os.PathLike) -> dict[str, Any]:
    """The tasks of one step file, by id (what :mod:`rl.replay` re-runs)."""
    from envs import Task  # deferred: notebooks reading trajectories need no environments

    tasks_path = Path(path).with_suffix(".tasks")
    if not tasks_path.exists():
        return {}
    tasks = [Task.from_dict(json.loads(line)) for line in tasks_path.read_text().splitlines() if line.strip()]
    return {t.id: t for t in tasks}
