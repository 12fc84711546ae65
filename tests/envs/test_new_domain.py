"""Adding a domain the way the README says, as a user would: the README's own code, in
``envs/domains/<name>/``, imported by a fresh interpreter with nothing preloaded.

The earlier test of the example put the package outside the tree and imported it after ``envs``
had loaded, so it never saw the circular import a user hit (``envs/__init__`` discovered the
domains before binding the names a domain imports from it).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def readme_example() -> str:
    """The Python block of the README's "Adding a domain" section, exactly as printed."""
    section = README.read_text().split("## Adding a domain", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README: the 'Adding a domain' section has no python block"
    return match.group(1)


@pytest.fixture
def user_package():
    """A package written where the README says domains live; removed afterwards (it is in the source tree)."""
    name = f"user_{uuid.uuid4().hex[:8]}"
    path = ROOT / "envs" / "domains" / name
    path.mkdir()
    try:
        yield name, path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"},
    )  # fmt: skip


def test_readme_example_imports_from_envs_domains_in_a_fresh_process(user_package):
    name, path = user_package
    (path / "__init__.py").write_text(readme_example())
    # The user's own module first, with nothing preloaded: this is what failed with the circular import.
    direct = fresh(f"import envs.domains.{name} as m; print(m.SqlEnv.domain)")
    assert direct.returncode == 0, direct.stderr
    assert direct.stdout.split() == ["sql"]
    # And found by discovery when the user only imports envs (gymnasium id and verifier registered).
    found = fresh(
        "import envs, gymnasium as gym; print('agentrl/Sql-v0' in gym.registry, 'sql_rows' in envs.VERIFIERS)"
    )
    assert found.returncode == 0, found.stderr
    assert found.stdout.split() == ["True", "True"]


def test_control_a_package_that_fails_to_import_is_reported(user_package):
    """Control: the probe sees an import failure when there is one (so a pass above means the import worked)."""
    name, path = user_package
    (path / "__init__.py").write_text("from envs import NoSuchName\n")
    run = fresh(f"import envs.domains.{name}")
    assert run.returncode != 0 and "NoSuchName" in run.stderr


def test_readme_is_a_guide_whose_links_into_docs_resolve():
    """At most 350 lines (the rest lives in docs/), and every docs/ file it names exists."""
    text = README.read_text()
    assert len(text.splitlines()) <= 350
    linked = set(re.findall(r"\]\((docs/[^)#]+)", text))
    assert linked and all((ROOT / path).is_file() for path in linked), linked


def readme_config() -> str:
    """The Python block of step 5 ("Train on it") of the README's "Adding a domain" section."""
    section = README.read_text().split("**5. Train on it.**", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def sql_tasks() -> list:
    """Three tasks in the README's format (two train, one eval), the schema in metadata."""
    from envs import Task

    schema = (
        "CREATE TABLE orders(name TEXT, amount INT); INSERT INTO orders VALUES ('ada', 10), ('bob', 25), ('ada', 20);"
    )
    queries = {
        "top": ("Which customer spent the most? Return name and total.", [{"name": "ada", "total": 30}],
                "SELECT name, SUM(amount) AS total FROM orders GROUP BY name ORDER BY total DESC LIMIT 1"),
        "count": ("How many orders are there? Return n.", [{"n": 3}], "SELECT COUNT(*) AS n FROM orders"),
        "bob": ("How much did bob spend? Return total.", [{"total": 25}],
                "SELECT SUM(amount) AS total FROM orders WHERE name = 'bob'"),
    }  # fmt: skip
    return [
        Task(id=f"sql/{key}", domain="sql", prompt=prompt, hidden={"rows": rows}, gold={"query": query},
             metadata={"schema": schema}, split="eval" if key == "bob" else "train")
        for key, (prompt, rows, query) in queries.items()
    ]  # fmt: skip


@pytest.fixture
def user_domain(user_package):
    """The README's domain, its tasks and its config, each written where the README says; removed afterwards."""
    from envs import write_jsonl

    name, path = user_package
    data, config = ROOT / "envs" / "data" / "sql.jsonl", ROOT / "configs" / f"{name}.py"
    assert not data.exists(), "envs/data/sql.jsonl exists already: this test writes its own"
    (path / "__init__.py").write_text(readme_example())
    write_jsonl(sql_tasks(), data)
    config.write_text(readme_config())
    try:
        yield f"configs/{name}.py"
    finally:
        data.unlink(missing_ok=True)
        config.unlink(missing_ok=True)


def train(config: str, workdir: Path, log: Path, *overrides: str) -> int:
    """``python -m rl.train`` as a user runs it, output to a file (not a tty); the exit status."""
    cmd = [sys.executable, "-m", "rl.train", f"--config={config}", f"--workdir={workdir}", *overrides]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "JAX_PLATFORMS": "cpu", "HOME": "/root"}
    with log.open("w") as out:
        return subprocess.run(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=900).returncode


def test_the_readme_domain_trains_two_steps_with_more_episodes_than_sandboxes(user_domain, tmp_path):
    """The README's domain holds a sandbox per episode; 2 tasks x 2 samples over a pool of 2 sandboxes:
    the surplus episodes wait their turn (rl.rollout.admission), and the run finishes with no anomaly.
    Its log, written to a file, has each line once."""
    from rl.run.metrics import read_metrics
    from tests.sandbox.conftest import backend_or_skip

    backend_or_skip("bwrap")
    workdir, log = tmp_path / "run", tmp_path / "run.log"
    code = train(user_domain + ":test", workdir, log, "--config.sandbox.capacity=2")
    text = log.read_text()
    assert code == 0, text[-5000:]
    rl_steps = [m for m in read_metrics(workdir) if m.get("phase") == "rl"]
    assert [m["step"] for m in rl_steps] == [1, 2]
    assert all(m["rollout/anomaly_rate"] == 0.0 for m in rl_steps), rl_steps
    lines = [line.split("] ", 1)[-1] for line in text.splitlines() if "pre-flight: sql ok" in line]
    assert len(lines) == 1, text  # logged once, not also above the progress bar


def test_a_lock_step_rollout_that_cannot_progress_is_refused_naming_the_capacity(user_domain, tmp_path):
    """Control for the test above (the pool really is smaller than a step's episodes): the lock-step
    rollout, which resets every episode before any steps, is refused before anything starts."""
    from tests.sandbox.conftest import backend_or_skip

    backend_or_skip("bwrap")
    log = tmp_path / "run.log"
    code = train(
        user_domain + ":test", tmp_path / "run", log, "--config.sandbox.capacity=2", "--config.rollout.engine=False"
    )
    errors = [line for line in log.read_text().splitlines() if line.startswith("error:")]
    assert code != 0 and len(errors) == 1, log.read_text()[-3000:]
    assert "config.sandbox.capacity=2" in errors[0] and "4 episodes" in errors[0] and "sql" in errors[0]
