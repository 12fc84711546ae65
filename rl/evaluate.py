r"""Evaluate a saved checkpoint of a run on its held-out tasks.

    python -m rl.evaluate --workdir=runs/q [--step=40] [--num_tasks=200] [--k=8]

Reads the run's ``config.json`` (with ``--num_tasks`` / ``--k`` replacing the
evaluation's own), restores the checkpoint (the newest by default) and prints
greedy pass rate and pass@1 / pass@k, per domain too; the numbers and the
evaluated episodes land in ``<workdir>/evaluations/``. The run itself — its
``config.json``, metrics and checkpoints — is only read.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

USAGE_ERROR = 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl.evaluate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True, type=Path)
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the newest)")
    parser.add_argument("--num_tasks", type=int, default=None, help="override eval.num_tasks")
    parser.add_argument("--k", type=int, default=None, help="override eval.k (samples per task for pass@k)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    config_path = args.workdir / "config.json"
    if not config_path.exists():
        print(f"error: {config_path} not found: is {args.workdir} a run directory?", file=sys.stderr)
        return USAGE_ERROR
    config = json.loads(config_path.read_text())
    for key in ("num_tasks", "k"):
        if getattr(args, key) is not None:
            config["eval"][key] = getattr(args, key)

    from rl.config.settings import ConfigError, load_settings
    from rl.phases.evaluation import Evaluator, held_out_tasks
    from rl.rollout.task_stream import TaskCatalog
    from rl.run.experiment import build

    catalog = TaskCatalog()
    try:
        settings = load_settings(config, catalog)
        exp = build(settings, args.workdir, catalog, record=False)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    out_dir = args.workdir / "evaluations"
    try:
        step = args.step if args.step is not None else exp.checkpointer.latest_step()
        if step is None:
            print(f"error: no checkpoint in {args.workdir}/checkpoints", file=sys.stderr)
            return USAGE_ERROR
        learner = exp.learner(settings.phase_at(max(step, 1)))
        state, _ = exp.checkpointer.restore(step, learner.abstract_state())
        learner.load_state(state)  # the weights go into exp.model, which the rollout samples from
        evaluator = Evaluator(exp.rollout, settings.eval, held_out_tasks(settings.eval, catalog))
        metrics = evaluator.evaluate(step, out_dir)
    finally:
        exp.close()
    result_path = out_dir / f"step_{step:08d}.json"
    result_path.parent.mkdir(parents=True, exist_ok=True)
    result_path.write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    for key in sorted(metrics):
        if key.startswith("eval"):
            print(f"{key:40s} {metrics[key]:.4f}")
    print(f"saved to {result_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
