"""What a repair_gen policy has learned to copy: teacher-forced loss on the tokens only copying can predict.

A repair_gen episode needs the model to copy: the module's name from the prompt into ``read_file``
and ``replace``, and the faulty line's identifiers and constants from the file into ``old`` and
``new``. Everything else in a demonstration (the call syntax, the line's template, the fix) is
predictable from the domain alone, so a model that cannot copy still reaches a low average loss.
This probe separates the two: on held-out demonstrations (blind, seed 777, never trained on) it
reports the mean negative log-likelihood of the whole assistant turns and of the *copy tokens*
alone: the first letter of each ``path`` and every single-letter identifier or digit inside
``old``. Uniform guessing among the 13 identifier letters is 2.56 nats; a model that copies is
near 0.

    python benchmarks/repair_copy_probe.py --workdir runs/repair [--step N] [--demos 24]

Each checkpoint of the workdir (or ``--step``) gets one line: step, all-turns NLL, copy-token NLL,
and the share of copy tokens the model ranks first.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def copy_positions(text: str, offsets: list[int]) -> list[int]:
    """Token indices of the copy tokens in a rendered conversation (byte-level: one token per byte)."""
    out = []
    for m in re.finditer(r'"old": "([^"]*)"', text):
        a, b = m.span(1)
        for i, o in enumerate(offsets):
            if a <= o < b and text[o].isalnum() and not text[o - 1].isalpha() and not text[o + 1].isalpha():
                out.append(i)
    for m in re.finditer(r'"path": "(\w)', text):
        out += [i for i, o in enumerate(offsets) if o == m.start(1)]
    return sorted(set(out))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--step", type=int, default=None)
    parser.add_argument("--demos", type=int, default=24)
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp
    import ml_collections as mlc
    import numpy as np
    from flax import nnx

    import envs  # noqa: F401 - registers the domains and their demonstrations
    from envs.demonstrations import demonstrations
    from rl.config.config_file import read_config
    from rl.config.settings import load_settings
    from rl.generation.tokenizer import load_tokenizer
    from rl.learning.learner import Learner
    from rl.learning.sft import SFTData
    from rl.models import Transformer, sharding
    from rl.run.checkpoint import Checkpointer

    settings = load_settings(mlc.ConfigDict(read_config(args.workdir)))
    tok = load_tokenizer(settings.model.tokenizer_spec)
    mesh = sharding.make_mesh({"data": 1})
    model = sharding.create_sharded_model(
        lambda: Transformer(settings.model.config, rngs=nnx.Rngs(0)), mesh, sharding.DEFAULT_RULES
    )
    phase = next(iter(settings.learners))
    learner = Learner(model, mesh, settings.learners[phase])
    checkpoints = Checkpointer(args.workdir, announce=False)
    steps = [args.step] if args.step is not None else checkpoints.all_steps()
    convs = demonstrations("repair_gen", {"num_tasks": args.demos, "seed": 777, "retry_fraction": 0.0})
    probe = SFTData(tok, convs, max_len=4096).sequences
    graphdef = nnx.graphdef(model)
    log_softmax = jax.jit(lambda state, ids: jax.nn.log_softmax(nnx.merge(graphdef, state)(ids)[0]))
    print("| step | NLL, assistant turns | NLL, copy tokens | copy tokens ranked first |")
    print("|---|---|---|---|")
    for step in steps:
        state, _ = checkpoints.restore(step, learner.abstract_state())
        learner.load_state(state)
        turns, copies, first = [], [], []
        for ids, mask in probe:
            ids = np.asarray(ids)
            lp = np.asarray(log_softmax(nnx.state(model), jnp.asarray(ids[None])))[0]
            nll = -lp[np.arange(len(ids) - 1), ids[1:]]
            offsets = np.cumsum([0] + [len(tok.decode([int(t)])) for t in ids])[:-1].tolist()
            positions = [p - 1 for p in copy_positions(tok.decode(ids.tolist()), offsets) if p > 0]
            turns += list(nll[np.asarray(mask[1:], bool)])
            copies += list(nll[positions])
            first += [int(np.argmax(lp[p]) == ids[p + 1]) for p in positions]
        print(f"| {step} | {np.mean(turns):.3f} | {np.mean(copies):.3f} | {np.mean(first):.2f} |", flush=True)
    checkpoints.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
