"""Two ways a task set can leak its answers: across splits, and inside the sandbox.

**Split leaks.** An eval task whose prompt or hidden tests (near-)duplicate a
train task measures memorisation, not skill. A task whose content lives in its files
(:attr:`Task.files`) often has a short prompt made from one template: two such prompts are
alike while the tasks are not, so a prompt duplicate between tasks with files counts only
when their files are alike too, and each leak says why it was flagged (:attr:`Leak.why`). :func:`find_split_leaks` compares
every eval/test task with every train task on normalised text (lowercase,
punctuation dropped, whitespace collapsed): exact duplicates by hash, near
duplicates by character 5-gram Jaccard similarity, with MinHash + LSH banding
to find candidate pairs in large sets and the exact Jaccard to confirm them.

**Oracle reachability.** :func:`static_leaks` checks that the task's declared
files and prompt do not give the secrets away in the first place. In the
sandbox, nothing a process of the agent can read may reveal the gold solution
or hidden material (tests, state checks, datasets, expected outputs): not
before the agent acts (:func:`probe_oracle`: files, git objects, process
environments), not while it acts or while its work is verified, through a
process it left running (:func:`watch_oracle`), and not after (the same probe
at the end of :func:`play_watched`). Those probes live in
:mod:`envs.quality.leak_probes` and are re-exported here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from envs.quality.leak_probes import OracleWatch, play_watched, probe_oracle, secret_lines, watch_oracle
from envs.tasks import Task

__all__ = [
    "Leak",
    "OracleWatch",
    "files_text",
    "find_split_leaks",
    "jaccard",
    "minhash",
    "normalise",
    "play_watched",
    "probe_oracle",
    "secret_lines",
    "shingles",
    "static_leaks",
    "summarise_leaks",
    "task_texts",
    "watch_oracle",
]

NGRAM = 5
NUM_PERM = 64
BANDS = 16
_MASK = (1 << 61) - 1


def normalise(text: str) -> str:
    """Lowercase, non-alphanumerics to spaces, whitespace collapsed: formatting changes do not hide a copy."""
    return " ".join(re.sub(r"[^0-9a-z]+", " ", text.lower()).split())


def shingles(text: str, n: int = NGRAM) -> set[str]:
    text = normalise(text)
    if len(text) <= n:
        return {text} if text else set()
    return {text[i : i + n] for i in range(len(text) - n + 1)}


def jaccard(a: set[str], b: set[str]) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def _hash64(s: str) -> int:
    return int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(), "little")


_PERMS = [((2 * i + 1) * 0x9E3779B97F4A7C15 & _MASK, (i * 0xBF58476D1CE4E5B9 + 7) & _MASK) for i in range(NUM_PERM)]


def minhash(shingle_set: set[str]) -> tuple[int, ...]:
    """A MinHash signature: the fraction of equal slots estimates the Jaccard similarity."""
    if not shingle_set:
        return tuple([_MASK] * NUM_PERM)
    hashes = [_hash64(s) for s in shingle_set]
    return tuple(min((a * h + b) & _MASK for h in hashes) for a, b in _PERMS)


def task_texts(task: Task) -> dict[str, str]:
    """The fields compared across splits: what the model reads, and what grades it."""
    hidden = {k: v for k, v in task.hidden.items() if k not in ("manifest", "fail_to_pass", "goal_checks")}
    return {"prompt": task.prompt, "hidden": json.dumps(hidden, sort_keys=True) if hidden else ""}


def files_text(task: Task) -> str:
    """The task's files as one text (path, then content, in path order): what the agent finds in its workspace."""
    return "\n".join(f"{path}\n{task.files[path]}" for path in sorted(task.files))


@dataclasses.dataclass(frozen=True)
class Leak:
    """An eval/test task that (near-)duplicates a train task in ``field``; ``why`` says what overlapped."""

    eval_id: str
    train_id: str
    field: str
    similarity: float
    exact: bool
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def find_split_leaks(tasks: Iterable[Task], *, threshold: float = 0.8, min_chars: int = 40) -> list[Leak]:
    """Pairs (eval or test task, train task) whose prompt or hidden material is a (near-)duplicate.

    Prompts shorter than ``min_chars`` after normalisation are compared for
    exact equality only (short prompts share many 5-grams by chance); hidden
    material that short (a final answer such as "24") is not compared at all,
    since two problems may rightly share an answer.
    """
    tasks = list(tasks)
    train = [t for t in tasks if t.split == "train"]
    held_out = [t for t in tasks if t.split != "train"]
    leaks: list[Leak] = []
    for field in ("prompt", "hidden"):
        exact: dict[str, list[str]] = defaultdict(list)
        sets: dict[str, set[str]] = {}
        buckets: dict[tuple[int, bytes], list[str]] = defaultdict(list)
        rows = max(NUM_PERM // BANDS, 1)
        for t in train:
            text = normalise(task_texts(t)[field])
            if not text or (field == "hidden" and len(text) < min_chars):
                continue
            exact[hashlib.sha256(text.encode()).hexdigest()].append(t.id)
            if len(text) >= min_chars:
                sets[t.id] = shingles(text)
                signature = minhash(sets[t.id])
                for band in range(BANDS):
                    key = repr(signature[band * rows : (band + 1) * rows]).encode()
                    buckets[(band, hashlib.sha1(key).digest())].append(t.id)
        for t in held_out:
            text = normalise(task_texts(t)[field])
            if not text or (field == "hidden" and len(text) < min_chars):
                continue
            found: dict[str, Leak] = {}
            for train_id in exact.get(hashlib.sha256(text.encode()).hexdigest(), []):
                found[train_id] = Leak(t.id, train_id, field, 1.0, True)
            if len(text) >= min_chars:
                mine = shingles(text)
                signature = minhash(mine)
                candidates = set()
                for band in range(BANDS):
                    key = repr(signature[band * rows : (band + 1) * rows]).encode()
                    candidates.update(buckets.get((band, hashlib.sha1(key).digest()), []))
                for train_id in candidates - set(found):
                    similarity = jaccard(mine, sets[train_id])
                    if similarity >= threshold:
                        found[train_id] = Leak(t.id, train_id, field, round(similarity, 4), False)
            leaks.extend(found.values())
    by_id = {t.id: t for t in tasks}
    kept = [_explained(leak, by_id, threshold) for leak in leaks]
    return sorted((k for k in kept if k is not None), key=lambda leak: (leak.eval_id, leak.train_id, leak.field))


def _explained(leak: Leak, by_id: dict[str, Task], threshold: float) -> Leak | None:
    """``leak`` with its reason; None for a prompt duplicate between tasks whose files differ (not a leak)."""
    overlap = "identical after normalisation" if leak.exact else f"5-gram Jaccard {leak.similarity:.2f}"
    why = f"{leak.field} {overlap}"
    if leak.field == "prompt":
        held_out, train = by_id[leak.eval_id], by_id[leak.train_id]
        if held_out.files or train.files:
            a, b = normalise(files_text(held_out)), normalise(files_text(train))
            similarity = 1.0 if a == b else jaccard(shingles(a), shingles(b))
            if similarity < threshold:
                return None
            why += f"; files ({', '.join(sorted(held_out.files)) or 'none'}) 5-gram Jaccard {similarity:.2f}"
    return dataclasses.replace(leak, why=why)


def _long_lines(text: str, min_len: int = 16) -> set[str]:
    return {line.strip() for line in text.splitlines() if len(line.strip()) >= min_len}


def static_leaks(task: Task, *, threshold: float = 0.6) -> list[str]:
    """Findings (empty when clean): the task's own prompt and files give away its hidden tests or its fix.

    Hidden tests may share a few lines with the visible ones (a visible test is
    often a subset), so hidden material counts as leaked only when at least
    ``threshold`` of its distinctive lines are visible. A gold line that is new
    to the file it changes must not appear in any other visible file at all.
    """
    findings = []
    hidden: set[str] = set()
    for content in task.hidden.get("tests", {}).values():
        hidden |= _long_lines(content)
    hidden |= _long_lines(task.hidden.get("test", ""))
    for dataset in task.hidden.get("datasets", []):
        if dataset.get("name") != "visible":
            for content in dataset.get("files", {}).values():
                hidden |= _long_lines(content)
            hidden |= _long_lines(dataset.get("expected", ""))
    visible = _long_lines(task.prompt).union(*(_long_lines(c) for c in task.files.values()))
    if len(hidden) >= 2 and len(hidden & visible) / len(hidden) >= threshold:
        findings.append(f"{len(hidden & visible)} of {len(hidden)} distinctive hidden lines are in the prompt or files")
    new_lines: dict[str, set[str]] = {}
    patch_path = None
    for line in task.gold.get("patch", "").splitlines():
        if line.startswith("+++ "):
            patch_path = line[4:].split("\t")[0].strip().removeprefix("b/")
        elif line.startswith("+") and len(line[1:].strip()) >= 16 and patch_path:
            new_lines.setdefault(patch_path, set()).add(line[1:].strip())
    for path, content in task.gold.get("files", {}).items():
        new_lines.setdefault(path, set()).update(_long_lines(content))
    for path, lines in new_lines.items():
        lines = lines - _long_lines(task.files.get(path, ""))
        elsewhere = _long_lines(task.prompt).union(*(_long_lines(c) for p, c in task.files.items() if p != path))
        if lines & elsewhere:
            findings.append(f"the fix to {path} is visible elsewhere: {sorted(lines & elsewhere)[0]!r}")
    return findings


def summarise_leaks(leaks: Sequence[Leak]) -> str:
    if not leaks:
        return "no leaks between train and held-out splits"
    return "\n".join(
        f"{leak.eval_id} ~ {leak.train_id} [{leak.field}] similarity {leak.similarity:.2f}"
        f"{' (exact)' if leak.exact else ''}: {leak.why}"
        for leak in leaks
    )
