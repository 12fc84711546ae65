"""The three notebooks run headless, top to bottom, on tiny runs this module makes itself.

Two quickstart test runs (seeds 0 and 1, a few SFT + RL steps each, started side
by side) feed ``explore_run`` (through ``WORKDIR``) and ``compare_runs`` (through
``WORKDIRS``); ``new_domain`` builds its own domain, sandboxes and tiny policy.
Any cell error fails the test with the cell and its traceback. The notebooks in
the repository must have their outputs cleared.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.sandbox.conftest import backend_or_skip

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
NAMES = ("explore_run", "compare_runs", "new_domain")
# One CPU device: tests/conftest.py asks for 8 fake ones, which this process's kernels would inherit.
KERNEL_ENV = {"MPLBACKEND": "Agg", "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}


@pytest.fixture(scope="module")
def workdirs(tmp_path_factory) -> list[Path]:
    """Two finished quickstart test runs with different seeds, trained at the same time."""
    backend_or_skip("bwrap")
    root = tmp_path_factory.mktemp("notebook-runs")
    env = {**os.environ, **KERNEL_ENV, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    workdirs = [root / f"seed{seed}" for seed in (0, 1)]
    logs = [open(root / f"seed{seed}.log", "w") for seed in (0, 1)]  # noqa: SIM115 - closed below
    cmd = [sys.executable, "-m", "rl.train", "--config=configs/quickstart.py:test"]
    procs = [
        subprocess.Popen([*cmd, f"--workdir={w}", f"--config.seed={seed}"], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        for seed, (w, log) in enumerate(zip(workdirs, logs, strict=True))
    ]  # fmt: skip
    try:
        codes = [proc.wait(timeout=900) for proc in procs]
    finally:
        for proc, log in zip(procs, logs, strict=True):
            if proc.poll() is None:  # a timeout: stop the runs this fixture started
                proc.kill()
            log.close()
    for code, log in zip(codes, logs, strict=True):
        assert code == 0, Path(log.name).read_text()[-4000:]
    return workdirs


def execute(name: str, monkeypatch: pytest.MonkeyPatch, **env: str) -> str:
    """Runs notebooks/<name>.ipynb in a fresh python3 kernel (cwd notebooks/); returns all text it printed."""
    for key, value in {**KERNEL_ENV, **env}.items():
        monkeypatch.setenv(key, value)  # the kernel inherits this process's environment
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    NotebookClient(nb, kernel_name="python3", timeout=600, resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    texts = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            texts.append(output.get("text", "") + output.get("data", {}).get("text/plain", ""))
    return "\n".join(texts)


@pytest.mark.parametrize("name", NAMES)
def test_notebooks_are_committed_valid_and_cleared(name):
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.outputs == [] and c.execution_count is None for c in code)


@pytest.mark.slow
@pytest.mark.bwrap
def test_explore_run(workdirs, monkeypatch):
    text = execute("explore_run", monkeypatch, WORKDIR=str(workdirs[0]))
    assert "SFT ends at step 4, RL starts at step 5; eval steps [0, 4, 6, 7]" in text
    assert "distinct training tasks" in text and "══ verification by weighted" in text  # tables, trajectory viewer
    assert "greedy answers at step 0 vs step 7" in text  # the two-checkpoint diff


@pytest.mark.slow
@pytest.mark.bwrap
def test_compare_runs(workdirs, monkeypatch):
    text = execute("compare_runs", monkeypatch, WORKDIRS=",".join(map(str, workdirs)))
    assert "seed0" in text and "seed1" in text and "final eval/greedy_pass_rate" in text
    assert "seed" in text.split("final eval/greedy_pass_rate")[-1]  # the config diff names the changed field


@pytest.mark.slow
@pytest.mark.bwrap
def test_new_domain(monkeypatch):
    backend_or_skip("bwrap")
    text = execute("new_domain", monkeypatch)
    assert "exact_count       11/11  correct (100.0%), stable, 2 reward hacks" in text
    assert "no leaks between train and held-out splits" in text
    assert "config OK: tasks of domain ['letters'] run in agentrl/LetterCount-v0" in text
