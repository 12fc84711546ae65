"""A user adds the template domain's twin (a new name, new tasks) by following only the README's
"copy the template" steps, run as the README prints them, and trains it for 2 steps."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.sandbox.conftest import backend_or_skip

ROOT = Path(__file__).resolve().parents[2]
# The user's shell: `python` is the interpreter running the tests (the one with the package installed).
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}


def readme_bash_blocks() -> list[str]:
    """The bash blocks of the README's "copy the template" paragraph: the copy, then the build and train."""
    section = (ROOT / "README.md").read_text().split("**The quickest way: copy the template.**", 1)[1]
    section = section.split("**1. The package.**", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    assert len(blocks) == 2, "README: the template paragraph should have a copy block and a build/train block"
    return blocks


def bash(script: str, log: Path) -> subprocess.CompletedProcess:
    with log.open("a") as out:
        return subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script], cwd=ROOT, env=ENV, stdout=out, stderr=subprocess.STDOUT,
            timeout=900,
        )  # fmt: skip


@pytest.fixture
def twin():
    """A fresh domain name; everything the README's steps create for it is removed afterwards."""
    name = f"twin{uuid.uuid4().hex[:6]}"
    made = [ROOT / "envs" / "domains" / name, ROOT / "configs" / f"{name}.py"]
    try:
        yield name
    finally:
        for path in made:
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        shutil.rmtree(Path("/tmp") / name, ignore_errors=True)


@pytest.mark.slow
def test_a_user_copies_the_template_to_a_twin_with_new_tasks_and_trains_it(twin, tmp_path):
    backend_or_skip("bwrap")
    copy, build = readme_bash_blocks()
    log = tmp_path / "twin.log"
    assert bash(copy.replace("N=wordcount", f"N={twin}"), log).returncode == 0, log.read_text()
    # "Make the tasks yours": other levels, so other files, prompts and counts than the template's.
    tasks = ROOT / "envs" / "domains" / twin / "tasks.py"
    tasks.write_text(tasks.read_text().replace('LEVELS = ("INFO", "WARN", "ERROR")', 'LEVELS = ("DEBUG", "NOTICE")'))
    done = bash(f"N={twin}\n{build}", log)
    text = log.read_text()
    assert done.returncode == 0, text[-5000:]
    assert f"24 tasks from {twin}:0" in text and "0 leaks" in text and "run finished" in text
    episodes = "".join(p.read_text() for p in (Path("/tmp") / twin / "trajectories").glob("step_*.jsonl"))
    assert f"{twin}/0-" in episodes and "NOTICE" in episodes and "ERROR" not in episodes  # the twin's own tasks
    metrics = [line for line in (Path("/tmp") / twin / "metrics.jsonl").read_text().splitlines() if '"rl"' in line]
    assert len(metrics) == 2 and all('"rollout/anomaly_rate": 0.0' in line for line in metrics), metrics
