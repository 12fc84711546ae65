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
