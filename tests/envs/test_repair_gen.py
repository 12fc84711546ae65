"""The generated repair domain (``repair_gen``): deterministic, disjoint splits, sound tasks, real episodes.

Sound means what ``python -m envs.quality.validate`` checks, through the real ``hidden_tests``
judge on bwrap: the gold edit passes, the unfixed repository fails, every other plausible fix
(the authored near misses) fails. The demonstrations are checked against the environment itself:
their tool messages are what the tools print, and they score 1 exactly when their blind fix is the
right one.
"""

from __future__ import annotations

import itertools
import random
import sys

import pytest

from envs.demonstrations import demonstrations
from envs.domains.repair_gen import demos, families
from envs.domains.repair_gen.tasks import SPLIT_SEEDS, SPLIT_SIZE, generate, generate_split, load
from envs.parsing import format_tool_call, parse_tool_calls
from envs.quality import validate
from envs.quality.leaks import find_split_leaks
from envs.tasks import TaskError, load_tasks
from tests.envs.conftest import make_env
from tests.sandbox.conftest import backend_or_skip

ENV_ID = "agentrl/RepairGen-v0"
SAMPLE = 30  # tasks per split validated through the judge


def test_generation_is_deterministic_per_seed_and_varies_with_it():
    first = [t.to_dict() for t in generate_split("train", 40)]
    assert first == [t.to_dict() for t in generate_split("train", 40)]
    assert generate(7, "train").to_dict() == first[7]
    # names, values, sites and families vary with the seed
    for key in ("files", "gold"):
        assert len({repr(t[key]) for t in first}) == len(first), key
    assert {t["metadata"]["family"] for t in first} == set(families.FAMILIES)
    assert load("eval:5") == generate_split("eval", 5) and len(load_tasks("repair_gen:train:3")) == 3


def test_train_and_held_out_seeds_are_disjoint_and_do_not_leak():
    starts = sorted(SPLIT_SEEDS.values())
    assert all(b - a >= SPLIT_SIZE for a, b in itertools.pairwise(starts))
    train, held_out = generate_split("train", 600), generate_split("eval", 100)
    assert {t.metadata["seed"] for t in train}.isdisjoint(t.metadata["seed"] for t in held_out)
    assert {t.split for t in train} == {"train"} and {t.split for t in held_out} == {"eval"}
    assert find_split_leaks(train + held_out) == []
    seen = {t.files[t.gold["edit"]["path"]] for t in train}
    assert not [t.id for t in held_out if t.files[t.gold["edit"]["path"]] in seen]  # no module is in both
    with pytest.raises(TaskError, match="outside the split"):
        generate_split("eval", 2, start=SPLIT_SIZE - 1)
    with pytest.raises(TaskError, match="unknown split 'test'"):
        generate_split("test", 1)


def test_every_task_has_one_bad_line_and_its_plausible_fixes_are_the_near_misses():
    assert not [m for m in families.MODULE_NAMES if m in sys.stdlib_module_names]  # a shadowed import would judge wrong
    for task in generate_split("train", 200) + generate_split("eval", 50):
        edit, fixes = task.gold["edit"], task.metadata["fixes"]
        assert len(fixes) == 3 == len(set(fixes)) and edit["new"] in fixes
        assert task.files[edit["path"]].count(edit["old"] + "\n") == 1
        assert sorted(m["edit"]["new"] for m in task.gold["near_misses"]) == sorted(set(fixes) - {edit["new"]})
        assert set(task.hidden["fail_to_pass"]) <= set(task.hidden["manifest"]) and task.hidden["fail_to_pass"]
        assert "def " not in task.prompt and edit["old"].strip() not in task.prompt  # the prompt hides the bug


def test_the_correct_fix_is_no_likelier_in_any_place_of_the_plausible_ones():
    # Were it, a policy that never runs the check could learn the favourite place per family.
    counts: dict[str, list[int]] = {}
    for task in generate_split("train", 1200):
        place = task.metadata["fixes"].index(task.gold["edit"]["new"])
        counts.setdefault(task.metadata["family"], [0, 0, 0])[place] += 1
    for family, places in counts.items():
        assert max(places) <= 0.45 * sum(places), (family, places)  # uniform is 1/3; 200 tasks each


@pytest.mark.slow
def test_sampled_tasks_of_both_splits_are_sound_through_the_judge():
    backend_or_skip("bwrap")
    tasks = generate_split("train", SAMPLE) + generate_split("eval", SAMPLE)
    reports, leaks = validate.validate(tasks, backend="bwrap", repeats=1, log=lambda line: None)
    assert [(r.task_id, r.problems) for r in reports if not r.ok] == []
    assert len(reports) == len(tasks) and leaks == []
    assert all(r.mutants_total >= 2 and r.mutants_killed == r.mutants_total for r in reports)


def _play(env, task, replies):
    env.reset(options={"task": task})
    outputs, info = [], {}
    for reply in replies:
        _, _, terminated, truncated, info = env.step(reply)
        outputs += [call["output"] for call in info.get("tool_calls", [])][-1:]
        if terminated or truncated:
            break
    outputs.append(info["messages"])  # last: the whole conversation as the environment recorded it
    return outputs, info["verification"]


def test_gold_episode_with_a_retry_scores_one_through_the_public_api(pool):
    env = make_env(ENV_ID, pool)  # both backends: bwrap and Docker
    task = generate_split("eval", 1)[0]
    edit, path = task.gold["edit"], task.gold["edit"]["path"]
    wrong = next(m["edit"]["new"] for m in task.gold["near_misses"])
    replies = [
        format_tool_call("run_tests"),
        format_tool_call("read_file", {"path": path}),
        format_tool_call("replace", {"path": path, "old": edit["old"], "new": wrong}),
        format_tool_call("run_tests"),
        format_tool_call("replace", {"path": path, "old": wrong, "new": edit["new"]}),
        format_tool_call("run_tests"),
        format_tool_call("submit"),
    ]
    outputs, verification = _play(env, task, replies)
    env.close()
    assert outputs[0].startswith("FAIL ") and outputs[0].endswith("[exit code: 1]")
    assert outputs[1] == task.files[path]
    assert "FAIL " in outputs[3] and outputs[5].endswith("0 failed\n[exit code: 0]")
    assert verification["reward"] == 1.0 and verification["passed"] and not verification["anomaly"]


def test_demonstrations_show_what_the_tools_print_and_score_as_designed(bwrap_pool):
    env = make_env(ENV_ID, bwrap_pool)
    rng, results = random.Random(3), []
    for i, task in enumerate(generate_split("train", 10)):
        conversation, right = demos.demonstration(task, rng, retry=i >= 8)  # the last two check and retry
        replies = [m["content"] for m in conversation if m["role"] == "assistant"]
        shown = [m["content"] for m in conversation if m["role"] == "tool"]
        names = [parse_tool_calls(r).calls[0].name for r in replies]
        outputs, verification = _play(env, task, replies)
        assert outputs[: len(shown)] == shown  # the warm start sees what rollouts will show
        assert outputs[-1][:-1] == conversation  # all of it, from the first message (the submit reply follows)
        assert verification["reward"] == float(right) and not verification["anomaly"]
        if i < 8:
            assert names == ["run_tests", "read_file", "replace", "submit"]  # blind: never checks after the edit
            results.append(right)
        else:
            assert right and names[-2:] == ["run_tests", "submit"] and shown[-1].endswith("[exit code: 0]")
    env.close()
    assert True in results and False in results  # the control: both outcomes occur, so the check can see each


def _smallest_gold_call(task):
    edit = task.gold["edit"]
    old, new = demos.minimal_edit(task.files[edit["path"]], edit["old"], edit["new"])
    return format_tool_call("replace", {"path": edit["path"], "old": old, "new": new})


def test_the_demonstrations_are_right_about_a_third_of_the_time():
    conversations = demonstrations("repair_gen", {"num_tasks": 600, "seed": 0})
    tasks = generate_split("train", 600)
    assert len(conversations) == 600 and all(len(c) == 8 for c in conversations)
    gold = [_smallest_gold_call(t) for t in tasks]
    share = sum(c[5]["content"] == g for c, g in zip(conversations, gold, strict=True)) / len(tasks)
    assert 0.25 <= share <= 0.42, share  # three plausible fixes each: the SFT ceiling is designed at ~1/3
    with pytest.raises(ValueError, match="unknown option"):
        demonstrations("repair_gen", {"tool_fraction": 0.5})


def test_replace_refuses_what_would_not_be_a_one_place_edit(bwrap_pool):
    env = make_env(ENV_ID, bwrap_pool)
    task = generate_split("train", 1)[0]
    path = task.gold["edit"]["path"]
    replies = [
        format_tool_call("replace", {"path": path, "old": "no such text", "new": "x"}),
        format_tool_call("replace", {"path": path, "old": "\n", "new": ""}),
        format_tool_call("replace", {"path": path, "old": "", "new": "x"}),
        format_tool_call("replace", {"path": "missing.py", "old": "a", "new": "b"}),
        format_tool_call("replace", {"path": path, "old": task.gold["edit"]["old"]}),
        format_tool_call("read_file", {"path": path}),
        format_tool_call("submit"),
    ]
    outputs, verification = _play(env, task, replies)
    env.close()
    assert outputs[0] == f"Error: replace: `old` does not occur in {path}"
    assert outputs[1].startswith("Error: replace: `old` occurs ") and "(it must be unique)" in outputs[1]
    assert outputs[2] == "Error: replace: `old` is empty; give the exact text to replace"
    assert outputs[3].startswith("Error: replace:") and "missing.py" in outputs[3]
    assert outputs[4].startswith("Error: replace:") and "new" in outputs[4]  # the schema names the missing argument
    assert outputs[5] == task.files[path]  # nothing was changed by any refused edit
    assert verification["reward"] == 0.0


def test_a_demonstrations_edit_is_the_smallest_unique_one_and_makes_the_fixed_line():
    source = "def f(a, b):\n    return a * 3 + b + 4\n"
    line = "    return a * 3 + b + 4"
    # `+` occurs twice: the edit widens to the left until it is unique; indentation is never copied
    assert demos.minimal_edit(source, line, "    return a * 3 + b - 4") == ("b +", "b -")
    assert demos.minimal_edit(source, line, "    return a * 3 + b + 5") == ("4", "5")
    cmp = "def f(v, t):\n    if v < t:\n        return 1\n"
    assert demos.minimal_edit(cmp, "    if v < t:", "    if v <= t:") == ("<", "<=")  # an insertion
    with pytest.raises(ValueError, match="must occur once"):
        demos.minimal_edit(source + line + "\n", line, "x")
    for task in generate_split("train", 300):  # every plausible fix, from the bug and from each other fix
        edit = task.gold["edit"]
        for a in [edit["old"], *task.metadata["fixes"]]:
            text = task.files[edit["path"]].replace(edit["old"], a, 1)
            for b in task.metadata["fixes"]:
                if b != a:
                    old, new = demos.minimal_edit(text, a, b)
                    assert text.count(old) == 1 and len(old) < len(a.strip()) + 1
                    assert text.replace(old, new, 1) == text.replace(a, b, 1)
