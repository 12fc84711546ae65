r"""Launch an experiment from a config file.

    python -m rl.train --config=configs/quickstart.py --workdir=runs/q [--config.rollout.group_size=8 ...]

Starting the same command again after a crash or a SIGKILL resumes from the
last complete checkpoint in ``--workdir``. The loop itself lives in
:mod:`rl.run.trainer`; this file reads flags, builds the experiment and
reports. A config mistake — a misspelt field, an unknown ``:variant``, a value
out of range — ends the command with one line naming the field and exit status
2, and leaves the workdir as it was.
"""

from __future__ import annotations

import ctypes
import logging
import re
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import ml_collections
from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file (configs/*.py[:variant]).", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory: config, metrics, trajectories, checkpoints.")
flags.mark_flags_as_required(["config", "workdir"])
USAGE_ERROR = 2
RUN_FAILED = 1


def summarize(evals: dict, workdir: str, seconds: float) -> str:
    """The before → after report printed at the end of a run."""
    lines = [f"\nrun finished in {seconds / 60:.1f} min; results in {workdir}"]
    keys = [
        ("eval/greedy_pass_rate", "held-out greedy pass rate"),
        ("eval/pass@1", "held-out pass@1 (sampled)"),
        ("eval_greedy/tool_calls_mean", "tool calls per episode"),
        ("eval_greedy/passing_rechecked", "passing: re-checked an edit"),  # with eval.check_tool set
    ]
    for key, label in keys:
        points = [
            (name, evals[name][key])
            for name in ("init", "after_sft", "after_preference", "last")
            if key in evals.get(name, {})
        ]
        if points:
            lines.append(f"  {label:28s} " + "  →  ".join(f"{name} {value:.3f}" for name, value in points))
    lines.append(
        f"  plot it: WORKDIR={workdir} jupyter nbconvert --to html --execute notebooks/explore_run.ipynb --output-dir {workdir}"
        "  (needs pip install -e '.[notebooks]'; or open it in jupyter lab with WORKDIR set)"
    )
    return "\n".join(lines)


def one_line_error(argv: Sequence[str], exc: Exception) -> str:
    """One line for a flag that failed to parse: the error's own message, or, for an override of
    a field the (locked) config does not have, that field's path. The ``ConfigDict`` names the
    unknown key and its closest field but not where it sits: the override that holds it does."""
    text = str(exc).replace("\\'", "'")
    unknown = re.search(r'instead of "(\w+)"', text) or re.search(r"'(\w+)'", text)
    if isinstance(exc, (AttributeError, KeyError)) and unknown:
        key, close = unknown.group(1), re.search(r'Did you mean "(\w+)"', text)
        for arg in argv:
            override = re.match(r"--config\.([\w.]+)(=|$)", arg)
            keys = override.group(1).split(".") if override else []
            if key in keys:
                path = ".".join(keys[: keys.index(key) + 1])
                return f"config.{path}: no such field" + (f"; did you mean {close.group(1)}?" if close else "")
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()] or [type(exc).__name__]
    if len(lines) == 1:
        return lines[0]
    # config_flags wraps an error of get_config() in its traceback: its last line is the message.
    head, last = lines[0].split(": ")[0].removeprefix("flag "), re.sub(r"^\w+(Error|Exception): ", "", lines[-1])
    return last if last.startswith(head) else f"{head}: {last}"


def parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing, with any error shown as one line and exit status 2 (not a traceback)."""
    try:
        rest = flags.FLAGS(argv)
    except (flags.Error, AttributeError, KeyError, ValueError, TypeError) as exc:
        print(f"error: {one_line_error(argv, exc)}", file=sys.stderr)
        sys.exit(USAGE_ERROR)
    if not isinstance(_CONFIG.value, ml_collections.ConfigDict):  # config_flags defers a missing file's error
        path = flags.FLAGS["config"].serialize().partition("=")[2].partition(":")[0]
        print(f"error: --config: no config file {path!r} (configs/*.py[:variant])", file=sys.stderr)
        sys.exit(USAGE_ERROR)
    return rest


def limit_host_memory(trim_every_s: float = 1.0) -> None:
    """Keeps the trainer's resident memory close to what it actually holds (the quickstart peaked at
    4-6 GB; see ``benchmarks/memory_bench.py``). Two causes live outside the model code:

    - glibc keeps what XLA frees (compiler scratch, the per-run buffers of its programs below
      glibc's 32 MB mmap threshold) in its malloc arenas for reuse, one per thread, so the
      process only grows. ``malloc_trim(0)`` hands the free pages back; a daemon thread calls it
      every ``trim_every_s`` (well under a millisecond per call): -230 MB at the quickstart's peak.
    - tensorboardX (``rl.run.metrics``) imports torch, when it is installed, only to recognise
      ``torch.Tensor`` arguments: +180 MB for nothing. It is imported here with torch hidden.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim
        trim = None
    if trim is not None:

        def trim_forever() -> None:
            while True:
                time.sleep(trim_every_s)
                trim(0)

        threading.Thread(target=trim_forever, name="malloc-trim", daemon=True).start()
    if "torch" not in sys.modules:
        sys.modules["torch"] = None  # type: ignore[assignment]  # makes `import torch` raise ImportError
        try:
            import tensorboardX  # noqa: F401
        except ImportError:
            pass
        finally:
            del sys.modules["torch"]


def main(argv: list[str]) -> int:
    del argv
    limit_host_memory()
    logging.getLogger().setLevel(logging.INFO)
    for noisy in ("absl", "jax._src", "orbax", "sandbox.pool", "math_verify", "tensorboardX"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from rl.run.distributed import ProcessGroup, maybe_initialize_distributed
    from rl.run.job_guard import JobGuard

    maybe_initialize_distributed()
    guard = JobGuard(ProcessGroup.current()).install()
    code = train(guard)
    if code:
        guard.exit_now(code)  # a failed job's processes never wait for each other
    guard.close()
    guard.group.finish()
    return code


def train(guard: Any) -> int:
    """Builds and runs the experiment; the exit status. A failure in any process of a job is
    reported to the others (rl.run.job_guard), and SIGTERM stops the run where it is."""
    from rl.config.settings import ConfigError, load_settings
    from rl.rollout.task_stream import TaskCatalog
    from rl.run.experiment import build
    from rl.run.job_guard import EXIT_TERMINATED, RESUME_HINT
    from rl.run.preflight import PreflightError, RunAborted
    from rl.run.trainer import Trainer

    start = time.perf_counter()
    catalog = TaskCatalog()
    exp = trainer = None
    failed = False
    try:
        exp = build(load_settings(_CONFIG.value, catalog), _WORKDIR.value, catalog)
        guard.on_abort(exp.pool.close)
        trainer = Trainer(exp)
        evals = trainer.run()
    except BaseException as exc:  # noqa: BLE001 - every failure gets its message, status, and the peers told
        failed = True
        message, code = guard.failed(exc)
        known = isinstance(exc, (ConfigError, PreflightError, RunAborted))
        if known and not message.startswith("the job stopped"):  # this process's own: its message whole
            message = str(exc)
        if isinstance(exc, ConfigError):
            code = USAGE_ERROR
        elif code == EXIT_TERMINATED:
            message += f"; {RESUME_HINT}"
        elif not known and guard.group.count == 1:
            raise  # a bug or an interrupt on one process: the traceback, as Python prints it
        elif not known and not message.startswith("the job stopped"):  # this process's own failure
            logging.getLogger(__name__).error("process %d failed", guard.group.index, exc_info=exc)
        print(f"error: {message}", file=sys.stderr, flush=True)
        return code
    finally:
        if exp is not None and failed and guard.group.count > 1:
            exp.close_local()  # never wait for peers that may be gone
        elif exp is not None:
            exp.close()
    elapsed = getattr(trainer, "elapsed", None) or time.perf_counter() - start  # a resumed run counts all its time
    if exp.is_main:
        print(summarize(evals, _WORKDIR.value, elapsed), flush=True)
    return 0


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
