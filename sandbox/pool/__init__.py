"""The warm pool: reusable sandboxes over one or more hosts, leased in milliseconds.

    warm_pool.py  WarmPool: acquire / release / open, prewarm, stats, close
    state.py      what the pool holds (leased, idle per host and spec), under one lock
    lifecycle.py  one pooled sandbox's life: made with a snapshot, reset and probed, destroyed
    upkeep.py     PoolUpkeep: host probes, shrinking idle sandboxes, warming ahead of demand
    hosts.py      Host: one backend, its capacity and health; placement of a lease
    config.py     PoolConfig: how the pool behaves
    pooled.py     PooledSandbox: the handle ``pool.open`` lends out (``close()`` gives it back)
    metrics.py    percentiles, utilisation and counters (shared with the scheduler)
    cleanup.py    shutting pools and schedulers down at exit and on SIGINT / SIGTERM

The pool and its upkeep share the bookkeeping in :class:`~sandbox.pool.state.PoolState`
and talk to each other only through public methods; see :mod:`sandbox.pool.upkeep`.
"""
