"""Task-quality tools: is a task set sound, are the verifiers exact, does anything leak, how hard is each task.

    python -m envs.quality.validate builtin:repair builtin:shell --report val.json   # gold solves, no-op fails
    python -m envs.quality.selfcheck                 # every verifier on known-right and known-wrong samples
    python -m envs.quality.authoring build           # envs/data/src/*.yaml -> envs/data/*.jsonl

* :mod:`~envs.quality.validate`: screens task sets through their own environments.
* :mod:`~envs.quality.selfcheck`: runs every registered self-check set.
* :mod:`~envs.quality.leaks` and :mod:`~envs.quality.leak_probes`: split leaks, and hidden material
  reachable from the sandbox (``in_sandbox/oracle_scan.py`` looks).
* :mod:`~envs.quality.difficulty`: per-task pass rates and a sampler that favours the informative tasks.
* :mod:`~envs.quality.authoring`: the generic compile driver; each domain registers its compiler.
* :mod:`~envs.quality.hooks`: what a domain registers (self-check samples, compiler) and the case types;
  :mod:`~envs.quality.exploits`: attack programs several domains' self-checks use.

Nothing here is imported by ``import envs`` except ``hooks`` and ``exploits``,
which the domain packages use to register.
"""
