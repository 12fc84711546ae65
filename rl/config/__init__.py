"""An experiment's settings: the config read once and checked before anything starts.

  - :mod:`rl.config.settings`: the config read and checked once into frozen ``Settings``.
  - :mod:`rl.config.errors`: ``ConfigError`` and the checks that raise it (a leaf module).
  - :mod:`rl.config.registry_checks`: ``rollout.env_kwargs`` and ``sft.options`` against their registries.
  - :mod:`rl.config.config_file`: ``config.json``, which experiment a workdir holds (no JAX).

Modules are imported explicitly and this file imports none of them.
"""
