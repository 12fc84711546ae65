"""Task records, JSONL task sets, task sources (grain-compatible), the shipped sets and their compilers."""

from __future__ import annotations

import json

import grain
import pytest
import yaml

from envs.domains.repair.authoring import near_misses, unified_patch
from envs.quality.authoring import SOURCES
from envs.quality.hooks import COMPILERS
from envs.tasks import Task, TaskError, TaskSource, builtin_sets, load_tasks, read_jsonl, write_jsonl


def test_task_validation_names_the_field():
    ok = {"id": "x/1", "domain": "d", "prompt": "p"}
    for change, field in (
        ({"id": "bad id!"}, "id"),
        ({"prompt": "  "}, "prompt"),
        ({"files": {"../etc/passwd": "x"}}, r"files\['../etc/passwd'\]"),
        ({"files": {"/abs": "x"}}, r"files\['/abs'\]"),
        ({"files": {"a.bin": b"x"}}, r"files\['a.bin'\]"),
        ({"difficulty": "brutal"}, "difficulty"),
        ({"split": "dev"}, "split"),
        ({"hidden": []}, "hidden"),
    ):
        with pytest.raises(TaskError, match=rf"Task\['.*'\]\.{field}"):
            Task(**{**ok, **change})
    with pytest.raises(TaskError, match=r"unknown field\(s\) \['answer'\]"):
        Task.from_dict({**ok, "answer": 4})
    with pytest.raises(TaskError, match=r"missing required field\(s\) \['prompt'\]"):
        Task.from_dict({"id": "x", "domain": "d"})


def test_jsonl_round_trip_and_line_numbers_in_errors(tmp_path):
    tasks = [
        Task(id=f"t/{i}", domain="d", prompt=f"p{i}", files={"a.txt": "ü"}, hidden={"answer": "1"}) for i in range(3)
    ]
    path = tmp_path / "set.jsonl"
    assert write_jsonl(tasks, path) == 3
    assert read_jsonl(path) == tasks and hash(tasks[0]) == hash(read_jsonl(path)[0])
    path.write_text(path.read_text() + '{"id": "t/9", "domain": "d"}\n')
    with pytest.raises(TaskError, match=r"set.jsonl:4: .*missing required field"):
        read_jsonl(path)


def test_task_source_is_a_grain_data_source():
    source = load_tasks("builtin:math")
    assert len(source) >= 24 and isinstance(source[0], Task)
    dataset = grain.MapDataset.source(source).shuffle(seed=1)
    assert sorted(t.id for t in dataset) == sorted(source.ids)
    train, held_out = source.filter(split="train"), source.filter(split="eval")
    assert len(train) + len(held_out) == len(source) and len(held_out) > 0
    assert source.get(source.ids[3]) is source[3]
    with pytest.raises(TaskError, match="duplicate task id"):
        TaskSource([source[0], source[0]])
    with pytest.raises(TaskError, match="is neither a file nor a LOADER:ARG spec"):
        load_tasks("nowhere.jsonl")
    with pytest.raises(TaskError, match="builtin task set 'nope' does not exist"):
        load_tasks("builtin:nope")


def test_shipped_sets_have_the_promised_size_and_spread():
    sizes = {name: len(load_tasks(f"builtin:{name}")) for name in builtin_sets()}
    assert sizes["math"] >= 24 and sizes["repair"] >= 20 and sizes["shell"] >= 15 and sizes["pipeline"] >= 15
    for name in ("repair", "shell", "pipeline"):
        source = load_tasks(f"builtin:{name}")
        assert {t.difficulty for t in source} == {"easy", "medium", "hard"}
        assert {t.split for t in source} == {"train", "eval"}
        assert all(t.domain == name and t.gold for t in source)
    for task in load_tasks("builtin:repair"):
        assert task.hidden["manifest"] and set(task.hidden["fail_to_pass"]) <= set(task.hidden["manifest"])
        assert task.gold["patch"].startswith("--- a/")
    for task in load_tasks("builtin:shell"):
        assert task.hidden["goal_checks"] and task.gold["script"]


def test_sources_and_shipped_jsonl_agree():
    """The JSONL is compiled from envs/data/src; a hand edit to one without the other fails here."""
    assert sorted(COMPILERS) == builtin_sets() == sorted(p.stem for p in SOURCES.glob("*.yaml"))
    shipped = {t.id: t for name in ("math", "pipeline", "repair", "shell") for t in load_tasks(f"builtin:{name}")}
    load = lambda name: yaml.safe_load((SOURCES / f"{name}.yaml").read_text())  # noqa: E731
    for task in COMPILERS["math"](load("math")) + COMPILERS["pipeline"](load("pipeline")):
        assert task == shipped[task.id], task.id
    for record in load("repair"):
        task = shipped[record["id"]]
        assert (task.prompt, task.files, task.hidden["tests"]) == (
            record["prompt"],
            record["files"],
            record["hidden_tests"],
        )
        assert task.gold["patch"] == unified_patch(record["files"], record["fix"])
        assert task.gold.get("near_misses") == (near_misses(record) if record.get("near_misses") else None)
    for record in load("shell"):
        task = shipped[record["id"]]
        assert (task.prompt, task.files, task.hidden["checks"], task.gold["script"]) == (
            record["prompt"], record.get("files", {}), record["checks"], record["gold"])  # fmt: skip
    assert len(shipped) == sum(len(load(n)) for n in ("math", "pipeline", "repair", "shell"))
    json.dumps([t.to_dict() for t in shipped.values()])


def test_repair_near_misses_compile_to_patches_and_refuse_non_misses():
    record = {"id": "repair/x", "files": {"m.py": "x = 1\n"}, "fix": {"m.py": "x = 2\n"}}
    miss = {"name": "off-by-one", "why": "3 is not 2", "fix": {"m.py": "x = 3\n"}}
    (compiled,) = near_misses({**record, "near_misses": [miss]})
    assert compiled == {"name": "off-by-one", "why": "3 is not 2", "patch": unified_patch(record["files"], miss["fix"])}
    for fix, reason in (({"m.py": "x = 2\n"}, "is the gold fix"), ({"m.py": "x = 1\n"}, "changes nothing")):
        with pytest.raises(TaskError, match=f"'repair/x' near miss 'off-by-one': its fix {reason}"):
            near_misses({**record, "near_misses": [{**miss, "fix": fix}]})
