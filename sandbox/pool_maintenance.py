"""The warm pool's upkeep: host health (probes, reports), shrinking, warming ahead of demand.

One pass runs every ``maintenance_interval_s`` on the pool's maintenance thread
(:meth:`WarmPool._maintain`). Talking to daemons and creating or destroying
sandboxes happens outside the pool's lock; only bookkeeping happens inside it,
so a slow or dead daemon never stalls a lease on a healthy host.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import time
from typing import TYPE_CHECKING

from sandbox import base
from sandbox.errors import DaemonUnreachable, ImageMissing, SandboxError, SandboxInfraError
from sandbox.metrics import percentile_keys
from sandbox.pooled import spec_key
from sandbox.spec import SandboxSpec

if TYPE_CHECKING:
    from sandbox.hosts import Host
    from sandbox.pool import WarmPool, _Entry

log = logging.getLogger(__name__)


def maintenance_pass(pool: WarmPool) -> None:
    """One round of upkeep; see the module docstring."""
    _probe_hosts(pool)
    _collect_abandoned_leases(pool)
    _shrink(pool)
    _warm(pool)


def report_infra_error(pool: WarmPool, host: Host, error: SandboxInfraError, spec: SandboxSpec | None) -> None:
    """What an infrastructure error says about its host.

    A missing image marks the host as lacking it (re-checked with backoff); an
    unreachable daemon takes the host out of rotation at once and drops its idle
    sandboxes; anything else (a container killed on a live daemon) only makes
    the host a suspect, probed on the next pass.
    """
    cfg, now = pool.config, time.monotonic()
    drop: list[_Entry] = []
    with pool._cond:
        if isinstance(error, ImageMissing) and spec is not None:
            host.mark_missing(spec.image, error, now, first_s=cfg.image_recheck_s, max_s=cfg.image_recheck_max_s)
        elif isinstance(error, DaemonUnreachable):
            if host.mark_down(str(error), now, first_probe_s=cfg.health_first_probe_s):
                drop = pool._drop_idle(host)
        else:
            pool._suspects.add(host.name)
            pool._wake.set()
        pool._cond.notify_all()
    for entry in drop:  # closing them may wait on the dead daemon: not on this thread
        if not _submit(pool, pool._destroy, entry):
            pool._destroy(entry)


def _probe_hosts(pool: WarmPool) -> None:
    cfg = pool.config
    now = time.monotonic()
    with pool._cond:
        down = [h for h in pool.hosts if not h.healthy and now >= h.next_probe]
        suspects = [h for h in pool.hosts if h.healthy and h.name in pool._suspects]
        pool._suspects.clear()
    for host in down:
        try:
            host.probe(cfg.probe_timeout_s)
            # Back up: first remove what a restart may have left of our containers there.
            host.sweep({sb.id for sb in list(base._live) if not sb.closed})
        except Exception as exc:  # noqa: BLE001 - any failure keeps it out of rotation
            with pool._cond:
                host.probe_failed(
                    f"{exc.__class__.__name__}: {exc}", time.monotonic(), max_backoff_s=cfg.health_max_backoff_s
                )
            continue
        with pool._cond:
            host.mark_up()
            pool._cond.notify_all()
    for host in suspects:
        try:
            host.probe(cfg.probe_timeout_s)
        except SandboxInfraError as exc:
            pool.report(host, exc)  # a DaemonUnreachable: out of rotation, idle sandboxes dropped


def _collect_abandoned_leases(pool: WarmPool) -> None:
    """A holder that closed its sandbox instead of releasing it still frees the slot."""
    with pool._cond:
        abandoned = [e.sandbox for e in pool._leased.values() if e.sandbox.closed]
    for sandbox in abandoned:
        pool.release(sandbox, reusable=False)


def _shrink(pool: WarmPool) -> None:
    cfg = pool.config
    cutoff = time.monotonic() - cfg.idle_ttl_s
    victims: list[_Entry] = []
    with pool._cond:
        by_key: dict[tuple, list[_Entry]] = {}
        for host in pool.hosts:
            for key, entries in host.idle.items():
                by_key.setdefault(key, []).extend(entries)
        for entries in by_key.values():
            entries.sort(key=lambda e: e.last_used, reverse=True)
            victims += [e for e in entries[cfg.min_idle :] if e.last_used < cutoff]
        for entry in victims:
            entry.host.idle[entry.key].remove(entry)
            pool._entries.pop(entry.sandbox.id, None)
    for entry in victims:
        _submit(pool, pool._destroy, entry)


def _warm(pool: WarmPool) -> None:
    """Creates sandboxes for queued demand (:meth:`WarmPool.want`) and to keep ``min_idle``."""
    with pool._cond:
        if pool._closed:
            return
        capacity = sum(h.capacity for h in pool.hosts if h.healthy)
        count: dict[tuple, int] = dict(pool._warming)
        idle: dict[tuple, int] = {}
        for entry in pool._entries.values():
            count[entry.key] = count.get(entry.key, 0) + 1
        for host in pool.hosts:
            for key, entries in host.idle.items():
                idle[key] = idle.get(key, 0) + len(entries)
        plans = []
        for key, (spec, n) in list(pool._wanted.items()):
            plans.append((key, spec, min(n, capacity) - count.get(key, 0)))
        if pool.config.min_idle:
            for key, spec in pool._seen.items():
                short = pool.config.min_idle - idle.get(key, 0) - pool._warming.get(key, 0)
                plans.append((key, spec, short))
        for key, spec, missing in plans:
            for _ in range(max(0, missing)):
                host = warm_host(pool, spec.image)
                if host is None:
                    break
                host.warming += 1
                pool._warming[key] = pool._warming.get(key, 0) + 1
                if not _submit(pool, warm_one, pool, host, spec, key):
                    host.warming -= 1
                    pool._warming[key] -= 1
                    return


def _submit(pool: WarmPool, fn, *args) -> bool:
    try:
        pool._executor.submit(fn, *args)
        return True
    except RuntimeError:  # executor shut down: the pool is closing
        return False


def warm_host(pool: WarmPool, image: str) -> Host | None:
    """Where the next sandbox made ahead of demand goes: the emptiest host with room (pool lock held)."""
    now = time.monotonic()
    room = [h for h in pool.hosts if h.can_run(image, now) and h.total < h.max_sandboxes]
    return min(room, key=lambda h: (h.total / h.max_sandboxes, h.total)) if room else None


def warm_one(pool: WarmPool, host: Host, spec: SandboxSpec, key: tuple) -> _Entry | None:
    """Creates one idle sandbox on ``host`` (its ``warming`` count was raised by the caller)."""
    try:
        entry = pool._create(host, spec, key)
    except SandboxError as exc:
        with pool._cond:
            host.warming -= 1
            pool._warming[key] -= 1
        if isinstance(exc, SandboxInfraError):
            pool.report(host, exc, spec)
        log.info("warming a sandbox on %s failed: %s", host.name, exc)
        return None
    with pool._cond:
        host.warming -= 1
        pool._warming[key] -= 1
        keep = not pool._closed and host.healthy
        if keep:
            pool._entries[entry.sandbox.id] = entry
            host.idle.setdefault(key, []).insert(0, entry)  # least recently used end: shrunk first
            pool._cond.notify_all()
    if not keep:
        pool._destroy(entry)
        return None
    return entry


def prewarm(pool: WarmPool, spec: SandboxSpec, n: int, timeout: float | None) -> int:
    """See :meth:`WarmPool.prewarm`."""
    key = spec_key(spec)
    futures = []
    with pool._cond:
        have = sum(1 for e in pool._entries.values() if e.key == key) + pool._warming.get(key, 0)
        for _ in range(max(0, n - have)):
            host = warm_host(pool, spec.image)
            if host is None:
                break
            host.warming += 1
            pool._warming[key] = pool._warming.get(key, 0) + 1
            futures.append(pool._executor.submit(warm_one, pool, host, spec, key))
    return sum(f.result() is not None for f in cf.as_completed(futures, timeout=timeout))


def pool_stats(pool: WarmPool) -> dict[str, float]:
    """Pool and host gauges, counters, utilisation and acquire latency, with ``sandbox/`` keys."""
    with pool._lock:
        rows = [(h.healthy, h.capacity, h.n_idle, h.leased, sum(h.resetting.values()), h.total) for h in pool.hosts]
    healthy, capacity, idle, leased, resetting, size = (list(col) for col in zip(*rows, strict=True))
    util = pool.meter.snapshot()
    out = {f"sandbox/pool_{k}": float(v) for k, v in pool.counters.snapshot().items()}
    out.update(percentile_keys("sandbox/pool_acquire", pool.acquire_wait))
    out.update(
        {
            "sandbox/hosts": float(len(rows)),
            "sandbox/hosts_healthy": float(sum(healthy)),
            "sandbox/capacity": float(sum(c for c, ok in zip(capacity, healthy, strict=True) if ok)),
            "sandbox/pool_idle": float(sum(idle)),
            "sandbox/pool_leased": float(sum(leased)),
            "sandbox/pool_resetting": float(sum(resetting)),
            "sandbox/pool_size": float(sum(size)),
            "sandbox/utilisation": util["utilisation"],
            "sandbox/held_s": util["held_s"],
            "sandbox/busy_s": util["busy_s"],
        }
    )
    return out
