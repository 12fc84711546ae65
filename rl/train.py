r"""Launch an experiment from a config file.

    python -m rl.train --config=configs/quickstart.py --workdir=runs/q [--config.rollout.group_size=8 ...]

Starting the same command again after a crash or a SIGKILL resumes from the
last complete checkpoint in ``--workdir``. The loop itself lives in
:mod:`rl.loop`; this file only reads flags, builds the experiment and reports.
"""

from __future__ import annotations

import logging
import sys
import time

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (configs/*.py[:arg]).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory: config, metrics, trajectories, checkpoints.")
flags.mark_flags_as_required(["config", "workdir"])


def summarize(evals: dict, workdir: str, seconds: float) -> str:
    """The before → after report printed at the end of a run."""
    lines = [f"\nrun finished in {seconds / 60:.1f} min; results in {workdir}"]
    keys = [("eval/greedy_pass_rate", "held-out greedy pass rate"), ("eval/pass@1", "held-out pass@1 (sampled)")]
    for key, label in keys:
        points = [(name, evals[name][key]) for name in ("init", "after_sft", "last") if key in evals.get(name, {})]
        if points:
            lines.append(f"  {label:28s} " + "  →  ".join(f"{name} {value:.3f}" for name, value in points))
    lines.append(
        f"  plot it: WORKDIR={workdir} jupyter nbconvert --to html --execute notebooks/explore_run.ipynb --output-dir {workdir}"
        "  (needs pip install -e '.[notebooks]'; or open it in jupyter lab with WORKDIR set)"
    )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    del argv
    logging.getLogger().setLevel(logging.INFO)
    for noisy in ("absl", "jax._src", "orbax", "sandbox.pool", "math_verify", "tensorboardX"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from rl.distributed import maybe_initialize_distributed

    maybe_initialize_distributed()
    from rl.experiment import build
    from rl.loop import Trainer

    start = time.perf_counter()
    exp = build(_CONFIG.value, _WORKDIR.value)
    try:
        evals = Trainer(exp).run()
    finally:
        exp.close()
    print(summarize(evals, _WORKDIR.value, time.perf_counter() - start), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(app.run(main))
