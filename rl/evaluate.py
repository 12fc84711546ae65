r"""Evaluate a saved checkpoint of a run on its held-out tasks.

    python -m rl.evaluate --workdir=runs/q [--step=40] [--num_tasks=200] [--k=8]

Reads the run's ``config.json``, restores the checkpoint (the newest by default)
and prints greedy pass rate and pass@1 / pass@k, per domain too; the numbers
and the evaluated episodes land in ``<workdir>/evaluations/``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import ml_collections as mlc


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
        return 2
    config = mlc.ConfigDict(json.loads(config_path.read_text()))
    if args.num_tasks is not None:
        config.eval.num_tasks = args.num_tasks
    if args.k is not None:
        config.eval.k = args.k

    from rl.experiment import build
    from rl.loop import Trainer

    out_dir = args.workdir / "evaluations"
    exp = build(config, args.workdir)
    try:
        step = args.step if args.step is not None else exp.checkpointer.latest_step()
        if step is None:
            print(f"error: no checkpoint in {args.workdir}/checkpoints", file=sys.stderr)
            return 2
        trainer = Trainer(exp)
        trainer._use_phase(max(step, 1))
        state, _ = exp.checkpointer.restore(step, trainer.learner.abstract_state())
        trainer.learner.load_state(state)
        metrics = trainer.evaluate(step, workdir=out_dir)
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
