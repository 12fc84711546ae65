"""A job of two processes (jax.distributed on CPU, a localhost coordinator, one device each).

``configs/quickstart.py:test`` with an entropy bonus and a KL penalty (so RL steps change the
parameters even when every reward is 0) must end with the metrics and parameters of one process
on a 2-device mesh: the learner's mesh spans both processes, each samples its share of every
rollout on its own device, and the episodes meet before the update. Only process 0 writes run
files. Killing one process stops the job with a clear error, and the same command resumes from
the last complete checkpoint; SIGTERM to one process stops both.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from rl.run.metrics import read_metrics, without_timing
from tests.sandbox.conftest import backend_or_skip

pytestmark = pytest.mark.slow  # every test here needs a training run of its own: minutes, not seconds

REPO = Path(__file__).resolve().parents[2]
CONFIG = "configs/quickstart.py:test"
# RL updates even with all-zero rewards (the :test policy never passes): the update path is exercised.
OVERRIDES = (
    "--config.algorithm.loss.entropy_coef=0.01",
    "--config.algorithm.loss.kl_coef=0.01",
    "--config.eval.every=0",  # held-out evaluations before step 1, after SFT and at the end only
)
RUN_TIMEOUT_S = 600


def _env(devices: int, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["JAX_PLATFORMS"] = "cpu"
    env.update(extra)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cmd(workdir: Path) -> list[str]:
    return [sys.executable, "-m", "rl.train", f"--config={CONFIG}", f"--workdir={workdir}", *OVERRIDES]


def _start_job(workdir: Path) -> list[subprocess.Popen]:
    """Two processes of one job, as a cluster launcher would start them (same command and workdir)."""
    port = _free_port()
    run = len(list(workdir.parent.glob(f"{workdir.name}.*.p0.log")))  # each start keeps its own logs
    procs = []
    for index in range(2):
        env = _env(
            1,
            JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
            JAX_NUM_PROCESSES="2",
            JAX_PROCESS_ID=str(index),
            AGENTRL_HEARTBEAT_TIMEOUT_S="10",
        )
        log = open(workdir.parent / f"{workdir.name}.{run}.p{index}.log", "w")  # noqa: SIM115 - closed by _wait
        procs.append(subprocess.Popen(_cmd(workdir), cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT))
        procs[-1].log = log
    return procs


def _wait(procs: list[subprocess.Popen], timeout: float) -> list[tuple[int, str]]:
    """Each process's exit status and output; a process still running after ``timeout`` fails the test."""
    deadline = time.monotonic() + timeout
    out = []
    try:
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            p.log.close()
            out.append((p.returncode, Path(p.log.name).read_text()))
    return out


def _wait_for_checkpoint(
    workdir: Path, step: int, procs: list[subprocess.Popen], timeout: float = RUN_TIMEOUT_S
) -> None:
    deadline = time.monotonic() + timeout
    while not (workdir / "checkpoints" / str(step)).is_dir():
        assert all(p.poll() is None for p in procs), "a process ended before the checkpoint was written"
        assert time.monotonic() < deadline, f"no checkpoint {step} after {timeout} s"
        time.sleep(0.2)


def _run_job(workdir: Path) -> list[tuple[int, str]]:
    results = _wait(_start_job(workdir), RUN_TIMEOUT_S)
    for index, (code, out) in enumerate(results):
        assert code == 0, f"process {index} exited {code}:\n{out[-4000:]}"
    return results


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """One process, a 2-device mesh: what the two-process job must reproduce."""
    backend_or_skip("bwrap")
    workdir = tmp_path_factory.mktemp("mp") / "one_process"
    proc = subprocess.run(_cmd(workdir), cwd=REPO, env=_env(2), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return workdir


def _final_params(workdir: Path) -> dict[str, np.ndarray]:
    """The last checkpoint's parameters on one device, whatever mesh saved them."""
    import jax
    import orbax.checkpoint as ocp

    step = max(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    path = (workdir / "checkpoints" / str(step) / "state").absolute()
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    with ocp.StandardCheckpointer() as ckpt:
        target = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one), dict(ckpt.metadata(path).item_metadata)
        )
        state = ckpt.restore(path, target)
    flat = jax.tree_util.tree_flatten_with_path(state["params"])[0]
    return {jax.tree_util.keystr(k): np.asarray(v) for k, v in flat}


def _assert_same_run(workdir: Path, reference: Path) -> None:
    got, want = without_timing(read_metrics(workdir)), without_timing(read_metrics(reference))
    assert [r["step"] for r in got] == [r["step"] for r in want] == list(range(8))
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys(), g["step"]
        for key, value in w.items():
            if isinstance(value, float):
                assert g[key] == pytest.approx(value, rel=1e-5, abs=1e-6), (g["step"], key)
            else:
                assert g[key] == value, (g["step"], key)
    assert any(r.get("train/grad_norm", 0.0) > 0 for r in got), "the RL steps must have updated the parameters"
    params, want_params = _final_params(workdir), _final_params(reference)
    assert params.keys() == want_params.keys()
    for name, value in want_params.items():
        np.testing.assert_allclose(params[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_two_processes_end_like_one_with_two_devices(reference, tmp_path):
    workdir = tmp_path / "two_processes"
    (_, out0), (_, out1) = _run_job(workdir)
    _assert_same_run(workdir, reference)
    # One writer: process 0 announces checkpoints and prints the summary; process 1 neither.
    assert "saved checkpoint" in out0 and "run finished" in out0
    assert "saved checkpoint" not in out1 and "run finished" not in out1
    assert not [p for p in (workdir / "trajectories").rglob("*") if ".tmp." in p.name]
    assert sorted(p.name for p in (workdir / "trajectories" / "eval").glob("*.jsonl")) == [
        f"step_{s:08d}.jsonl" for s in (0, 4, 7)
    ]


def test_killing_one_process_stops_the_job_and_the_same_command_resumes(reference, tmp_path):
    workdir = tmp_path / "killed"
    procs = _start_job(workdir)
    _wait_for_checkpoint(workdir, 5, procs)  # the first RL step's
    procs[1].send_signal(signal.SIGKILL)
    t0 = time.monotonic()
    (code0, out0), (code1, _) = _wait(procs, 60)
    assert time.monotonic() - t0 < 45, "the surviving process must not hang"
    assert code1 == -signal.SIGKILL
    assert code0 != 0
    last = [line for line in out0.splitlines() if line.startswith("error:")]
    assert code0 == 1 and last and "process 1" in last[-1], out0[-3000:]
    results = _run_job(workdir)  # the same command, both processes
    assert all("resumed from checkpoint" in out for _, out in results)
    _assert_same_run(workdir, reference)


def test_sigterm_to_one_process_stops_every_process(tmp_path):
    backend_or_skip("bwrap")
    workdir = tmp_path / "terminated"
    procs = _start_job(workdir)
    _wait_for_checkpoint(workdir, 2, procs)
    procs[1].send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    results = _wait(procs, 60)
    assert time.monotonic() - t0 < 45
    for index, (code, out) in enumerate(results):
        assert code == 128 + signal.SIGTERM, (index, out[-3000:])
        assert "process 1 received SIGTERM" in out and "run the same command to resume" in out, out[-3000:]
    assert (workdir / "checkpoints" / "2").is_dir()
