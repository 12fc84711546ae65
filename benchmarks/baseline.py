"""Run a benchmark's measurement against another revision of agentrl, in the same run as the current tree.

A speed-up is only a figure beside its reference measured on the same machine at the same time.
When the reference is the code as it was (``--baseline REV``), the benchmark runs its own worker
twice: once here, once in an export of ``REV`` (``git archive``, kept under the system's temp
directory and reused by later runs), with the *current* benchmark script copied into it so that the
worker's code is the same and only the library under it differs. The worker must therefore use
only what both revisions have; each benchmark says which calls it relies on.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def checkout(rev: str) -> Path:
    """A work tree of ``rev`` (a commit, tag or branch of this repository), made once and reused."""
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", f"{rev}^{{commit}}"], capture_output=True, text=True
    )
    if commit.returncode != 0:
        raise SystemExit(f"--baseline {rev}: not a commit of {REPO} ({commit.stderr.strip()})")
    sha = commit.stdout.strip()
    tree = Path(tempfile.gettempdir()) / f"agentrl-baseline-{sha[:12]}"
    if not (tree / "rl").is_dir():
        shutil.rmtree(tree, ignore_errors=True)
        tree.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", sha], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree


def run_worker(tree: Path, script: str, args: list[str], *, timeout_s: float = 3600) -> Any:
    """Runs ``script`` (this tree's benchmark, copied into ``tree``) with ``--worker`` and ``args`` there;
    returns the JSON its last stdout line holds. Its stderr (progress) passes through."""
    target = tree / "benchmarks" / Path(script).name
    target.parent.mkdir(exist_ok=True)
    for helper in (Path(script), Path(__file__), Path(__file__).with_name("machine.py")):
        shutil.copyfile(helper, target.parent / helper.name)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, str(target), "--worker", *args],
        cwd=tree,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        timeout=timeout_s,
    )
    if done.returncode != 0:
        raise SystemExit(f"the worker in {tree} failed (exit {done.returncode})")
    return json.loads(done.stdout.strip().splitlines()[-1])
