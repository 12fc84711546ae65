r"""Export a run's policy as a Hugging Face directory that ``transformers`` and vLLM load.

    python -m rl.export --workdir=runs/smollm2 --out=exports/smollm2 [--step=40] [--dtype=bfloat16]

Reads the run's ``config.json``, restores the checkpoint (the newest by default), folds LoRA
adapters into the weights if the run trained any, and writes ``config.json`` + safetensors
(``rl.models.hf.save_hf_model``) and, for a model with its own tokenizer, ``tokenizer.json`` +
``tokenizer_config.json`` with its chat template. The run itself is only read.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

USAGE_ERROR = 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path, help="the Hugging Face directory to write")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the newest)")
    parser.add_argument("--dtype", default=None, help="saved dtype (default: the parameters')")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    config_path = args.workdir / "config.json"
    if not config_path.exists():
        print(f"error: {config_path} not found: is {args.workdir} a run directory?", file=sys.stderr)
        return USAGE_ERROR

    from rl.config.settings import ConfigError, load_settings
    from rl.generation.tokenizer import HFTokenizer
    from rl.models.hf import save_merged_hf_model
    from rl.rollout.task_stream import TaskCatalog
    from rl.run.experiment import build

    catalog = TaskCatalog()
    try:
        settings = load_settings(json.loads(config_path.read_text()), catalog)
        exp = build(settings, args.workdir, catalog, record=False)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    try:
        step = args.step if args.step is not None else exp.checkpointer.latest_step()
        if step is None:
            print(f"error: no checkpoint in {args.workdir}/checkpoints", file=sys.stderr)
            return USAGE_ERROR
        learner = exp.learner(settings.phase_at(max(step, 1)))
        state, _ = exp.checkpointer.restore(step, learner.abstract_state())
        learner.load_state(state)  # the weights go into exp.model
        save_merged_hf_model(exp.model, args.out, dtype=args.dtype)
        if isinstance(exp.tokenizer, HFTokenizer):
            exp.tokenizer.save(args.out)
    finally:
        exp.close()
    print(f"exported step {step} of {args.workdir} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
