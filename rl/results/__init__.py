"""Reading a run back as tables and text, without JAX: what notebooks and scripts use.

    from rl.results import compare, format_episode, load_run

    run = load_run("runs/quickstart")
    run.metrics[["eval/greedy_pass_rate", "eval/pass@1"]].dropna()   # indexed by step
    print(format_episode(run.episode(step=60, row=0)))               # one episode, turn by turn
    compare(["runs/a", "runs/b"]).summary()

Only numpy, pandas and the numpy-only :mod:`rl.rollout.trajectory` / :mod:`rl.run.metrics`
(which own the on-disk format) are imported: no JAX, Flax, sandbox or accelerator.

  - :mod:`rl.results.loader`: :class:`Run` and :func:`load_run` (config, metrics, episode tables).
  - :mod:`rl.results.step_files`: one step file into table rows, fast.
  - :mod:`rl.results.episode_text`: :func:`format_episode`, :func:`side_by_side`, :func:`final_answer`.
  - :mod:`rl.results.comparison`: :class:`Comparison` and :func:`compare`.
"""

from rl.config.config_file import flatten
from rl.results.comparison import Comparison, compare
from rl.results.episode_text import final_answer, format_episode, side_by_side
from rl.results.loader import EPISODE_COLUMNS, KINDS, TOOL_COLUMNS, Run, load_run

__all__ = [
    "EPISODE_COLUMNS",
    "KINDS",
    "TOOL_COLUMNS",
    "Comparison",
    "Run",
    "compare",
    "final_answer",
    "flatten",
    "format_episode",
    "load_run",
    "side_by_side",
]
