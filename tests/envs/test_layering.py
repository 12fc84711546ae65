"""envs must stay usable without JAX: importing it pulls in no jax, flax, optax, grain, rl or configs."""

from __future__ import annotations

import subprocess
import sys


def test_import_envs_does_not_import_jax_or_upper_layers():
    code = (
        "import sys, envs, envs.validate, envs.selfcheck, envs.difficulty, envs.leaks, envs.authoring\n"
        "bad = sorted({m.split('.')[0] for m in sys.modules} & {'jax', 'flax', 'optax', 'orbax', 'grain', 'rl', 'configs'})\n"
        "print(','.join(bad))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == ""
