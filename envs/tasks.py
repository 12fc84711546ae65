"""Tasks as records, task sets as indexable sources, and the registry of task specs (``LOADER:ARG``).

A :class:`Task` is everything needed to run and grade one episode: the prompt,
the files the sandbox starts with, what stays hidden until the agent has
finished (tests, state checks, expected rows), a known-correct solution, and
bookkeeping (difficulty, split). Task sets are JSONL, one task per line;
``builtin:NAME`` names a set shipped in ``envs/data/NAME.jsonl``.

Other specs are resolved by loaders that domains register with
:func:`register_loader` (``gsm8k:PATH`` by the math domain, ``humaneval`` by
function completion, ...); :func:`read_records`, :func:`split_from_name` and
:func:`field` are what loaders of public formats share.

:class:`TaskSource` implements grain's ``RandomAccessDataSource`` protocol
(``__len__``, ``__getitem__``), so a training loop can build ``grain`` datasets
over task pools; ``envs`` itself never imports grain (it imports JAX), so it
stays usable without JAX.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import posixpath
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parent / "data"
SPLITS = ("train", "eval", "test")
DIFFICULTIES = ("easy", "medium", "hard")
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,199}")


class TaskError(ValueError):
    """A task record or task set is malformed; the message names the task and the field."""


def _require(cond: bool, task_id: str, field: str, expected: str, value: Any) -> None:
    if not cond:
        raise TaskError(f"Task[{task_id!r}].{field}: expected {expected}, got {value!r:.120}")


def check_relative_path(path: Any) -> bool:
    """A workspace-relative, normalised path that cannot escape the workspace."""
    return (
        isinstance(path, str)
        and bool(path)
        and not path.startswith("/")
        and "\0" not in path
        and posixpath.normpath(path) == path
        and not path.startswith("..")
    )


@dataclasses.dataclass(frozen=True)
class Task:
    """One task. Hashable by id; JSON round-trips through :meth:`to_dict` / :meth:`from_dict`.

    Attributes:
      id: unique id within its set, e.g. ``"repair/stack-pop-empty"``.
      domain: which environment runs it (``"math"``, ``"repair"``, ``"shell"``, ...).
      prompt: the user message the agent starts from.
      files: workspace-relative path -> text, written into the sandbox at reset.
      hidden: what the agent never sees: hidden tests + their manifest, state
        checks, expected outputs. Copied into the sandbox only after the episode.
      gold: a known-correct solution, by kind: ``answer`` (math), ``patch``
        (unified diff), ``script`` (bash), ``files`` (path -> text), ``completion``.
      difficulty: ``easy``, ``medium`` or ``hard``.
      split: ``train``, ``eval`` or ``test``.
      metadata: domain settings (``test_command``, ``entry_point``, ``source``, ...).
    """

    id: str
    domain: str
    prompt: str
    files: Mapping[str, str] = dataclasses.field(default_factory=dict)
    hidden: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    gold: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    difficulty: str = "medium"
    split: str = "train"
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        tid = self.id if isinstance(self.id, str) else "?"
        _require(
            isinstance(self.id, str) and bool(_ID.fullmatch(self.id)), tid, "id", "an id of [A-Za-z0-9_.:/-]", self.id
        )
        _require(isinstance(self.domain, str) and bool(self.domain), tid, "domain", "a non-empty str", self.domain)
        _require(
            isinstance(self.prompt, str) and bool(self.prompt.strip()), tid, "prompt", "a non-empty str", self.prompt
        )
        for name in ("files", "hidden", "gold", "metadata"):
            _require(isinstance(getattr(self, name), Mapping), tid, name, "a mapping", getattr(self, name))
        for path, content in self.files.items():
            _require(check_relative_path(path), tid, f"files[{path!r}]", "a normalised relative path", path)
            _require(isinstance(content, str), tid, f"files[{path!r}]", "text content (str)", type(content).__name__)
        _require(self.difficulty in DIFFICULTIES, tid, "difficulty", f"one of {DIFFICULTIES}", self.difficulty)
        _require(self.split in SPLITS, tid, "split", f"one of {SPLITS}", self.split)
        for name in ("files", "hidden", "gold", "metadata"):
            object.__setattr__(self, name, dict(getattr(self, name)))

    def __hash__(self) -> int:
        return hash(("Task", self.id))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> Task:
        if not isinstance(record, Mapping):
            raise TaskError(f"Task.from_dict: expected a mapping, got {type(record).__name__}")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(record) - fields)
        if unknown:
            raise TaskError(f"Task[{record.get('id')!r}]: unknown field(s) {unknown}; known: {sorted(fields)}")
        missing = [f for f in ("id", "domain", "prompt") if f not in record]
        if missing:
            raise TaskError(f"Task[{record.get('id')!r}]: missing required field(s) {missing}")
        return cls(**record)


def write_jsonl(tasks: Iterable[Task], path: str | Path) -> int:
    """Writes tasks one per line (sorted keys, so files diff cleanly); returns the count."""
    count = 0
    with open(path, "w", encoding="utf-8") as f:
        for task in tasks:
            f.write(json.dumps(task.to_dict(), sort_keys=True, ensure_ascii=False) + "\n")
            count += 1
    return count


def read_jsonl(path: str | Path) -> list[Task]:
    """Reads a task set; errors name the file and line."""
    tasks = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                tasks.append(Task.from_dict(json.loads(line)))
            except (json.JSONDecodeError, TaskError, TypeError) as exc:
                raise TaskError(f"{path}:{lineno}: {exc}") from exc
    return tasks


class TaskSource:
    """An immutable, indexable task set: a grain ``RandomAccessDataSource``.

    Ids must be unique; :meth:`filter` returns a new source (e.g. one split).
    """

    def __init__(self, tasks: Sequence[Task], name: str = "tasks"):
        tasks = list(tasks)
        for i, task in enumerate(tasks):
            if not isinstance(task, Task):
                raise TaskError(f"TaskSource({name!r})[{i}]: expected a Task, got {type(task).__name__}")
        seen: dict[str, int] = {}
        for i, task in enumerate(tasks):
            if task.id in seen:
                raise TaskError(f"TaskSource({name!r}): duplicate task id {task.id!r} at {seen[task.id]} and {i}")
            seen[task.id] = i
        self._tasks = tuple(tasks)
        self._index = seen
        self.name = name

    def __len__(self) -> int:
        return len(self._tasks)

    def __getitem__(self, index: int) -> Task:
        return self._tasks[index]

    def __iter__(self) -> Iterator[Task]:
        return iter(self._tasks)

    def __repr__(self) -> str:
        return f"TaskSource({self.name!r}, {len(self)} tasks)"

    @property
    def ids(self) -> list[str]:
        return [t.id for t in self._tasks]

    def get(self, task_id: str) -> Task:
        if task_id not in self._index:
            raise KeyError(f"TaskSource({self.name!r}): no task with id {task_id!r}")
        return self._tasks[self._index[task_id]]

    def filter(
        self, *, split: str | None = None, domain: str | None = None, difficulty: str | None = None
    ) -> TaskSource:
        if split is not None and split not in SPLITS:
            raise TaskError(f"TaskSource.filter(split=): expected one of {SPLITS}, got {split!r}")
        kept = [
            t
            for t in self._tasks
            if (split is None or t.split == split)
            and (domain is None or t.domain == domain)
            and (difficulty is None or t.difficulty == difficulty)
        ]
        suffix = ",".join(
            f"{k}={v}" for k, v in (("split", split), ("domain", domain), ("difficulty", difficulty)) if v
        )
        return TaskSource(kept, f"{self.name}[{suffix}]" if suffix else self.name)


LOADERS: dict[str, Callable[[str], list[Task]]] = {}


def register_loader(prefix: str) -> Callable[[Callable[[str], list[Task]]], Callable[[str], list[Task]]]:
    """Registers a loader for specs ``"prefix:ARG"`` (e.g. ``gsm8k:/data/test.jsonl``)."""

    def wrap(fn: Callable[[str], list[Task]]) -> Callable[[str], list[Task]]:
        if prefix in LOADERS:
            raise ValueError(f"register_loader: {prefix!r} is already registered")
        LOADERS[prefix] = fn
        return fn

    return wrap


EXCLUSIONS: dict[str, Callable[[str], dict[str, str]]] = {}


def register_exclusions(prefix: str) -> Callable[[Callable[[str], dict[str, str]]], Callable[[str], dict[str, str]]]:
    """Registers ``fn(ARG) -> {task id: why}``: the tasks the loader of ``prefix`` leaves out of ``prefix:ARG``."""

    def wrap(fn: Callable[[str], dict[str, str]]) -> Callable[[str], dict[str, str]]:
        if prefix in EXCLUSIONS:
            raise ValueError(f"register_exclusions: {prefix!r} is already registered")
        EXCLUSIONS[prefix] = fn
        return fn

    return wrap


def excluded_tasks(spec: str) -> dict[str, str]:
    """Task id -> why, for the tasks the loader of ``spec`` leaves out ({} when it leaves out nothing)."""
    prefix, _, arg = str(spec).partition(":")
    return EXCLUSIONS[prefix](arg) if prefix in EXCLUSIONS and not Path(str(spec)).exists() else {}


def builtin_sets() -> list[str]:
    return sorted(p.stem for p in DATA_DIR.glob("*.jsonl"))


@register_loader("builtin")
def _load_builtin(name: str) -> list[Task]:
    path = DATA_DIR / f"{name}.jsonl"
    if not path.exists():
        raise TaskError(f"builtin task set {name!r} does not exist; shipped sets: {builtin_sets()}")
    return read_jsonl(path)


def load_tasks(spec: str | Path | Sequence[Task] | TaskSource, *, split: str | None = None) -> TaskSource:
    """Resolves a task spec: a ``TaskSource``, a list of tasks, a JSONL path, ``builtin:NAME``, or ``LOADER:ARG``."""
    if isinstance(spec, TaskSource):
        source = spec
    elif isinstance(spec, (str, Path)):
        text = str(spec)
        prefix, _, arg = text.partition(":")
        if prefix in LOADERS and not Path(text).exists():
            source = TaskSource(LOADERS[prefix](arg), text)
        elif Path(text).exists():
            source = TaskSource(read_jsonl(text), Path(text).stem)
        else:
            raise TaskError(f"tasks: {text!r} is neither a file nor a LOADER:ARG spec (loaders: {sorted(LOADERS)})")
    elif isinstance(spec, Sequence):
        source = TaskSource(spec, "tasks")
    else:
        raise TaskError(f"tasks: expected a path, spec string, TaskSource or list of Task, got {type(spec).__name__}")
    return source.filter(split=split) if split else source


def read_records(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, record)`` of a JSONL or JSONL.gz file of a public format; errors name the file and line."""
    path = Path(path)
    if not path.exists():
        raise TaskError(f"loader: {path} does not exist")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield lineno, json.loads(line)
                except json.JSONDecodeError as exc:
                    raise TaskError(f"{path}:{lineno}: not JSON ({exc.msg})") from exc


def split_from_name(path: str | Path) -> str:
    """The split a public set's file name implies (``test``; ``eval``/``val``/``dev``; else ``train``)."""
    name = Path(path).name.lower()
    if "test" in name:
        return "test"
    if any(k in name for k in ("eval", "val", "dev")):
        return "eval"
    return "train"


def field(record: Mapping[str, Any], name: str, path: str | Path, lineno: int) -> Any:
    """``record[name]``, or a :class:`TaskError` naming the file, the line and the missing field."""
    if name not in record:
        raise TaskError(f"{path}:{lineno}: missing field {name!r} (has {sorted(record)})")
    return record[name]
