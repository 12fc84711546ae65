"""An experiment's settings: the config read once and checked before anything starts.

  - :mod:`rl.config.schema`: one walker over a section's dataclass (unknown field, type, range) and
    the builder of its ``ConfigDict`` (``configs/common.py``).
  - :mod:`rl.config.sections`: the sections' dataclasses: every field, default, range and doc.
  - :mod:`rl.config.settings`: the config read and checked once into frozen ``Settings``.
  - :mod:`rl.config.errors`: ``ConfigError`` and the checks that raise it (a leaf module).
  - :mod:`rl.config.registry_checks`: ``rollout.env_kwargs`` and ``sft.options`` against their registries.
  - :mod:`rl.config.config_file`: ``config.json``, which experiment a workdir holds (no JAX).

Modules are imported explicitly and this file imports none of them.
"""
