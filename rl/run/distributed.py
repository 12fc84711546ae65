"""Multi-host start-up: ``jax.distributed.initialize()`` exactly when the environment asks for it.

On one host nothing needs initialising, and calling ``jax.distributed.initialize()`` without a
coordinator fails; on a cluster it must run before any other JAX call. The helper decides from
the environment so the same entry point works on a laptop, a GPU node and a TPU slice.
"""

from __future__ import annotations

import os

import jax

# A coordinator address means the launcher set the job up explicitly; otherwise JAX can
# auto-detect SLURM, Open MPI and Cloud TPU jobs when initialize() is called bare.
_COORDINATOR_VARS = ("JAX_COORDINATOR_ADDRESS", "COORDINATOR_ADDRESS")

_initialized = False


def _more_than_one(value: str | None) -> bool:
    try:
        return value is not None and int(value) > 1
    except ValueError:
        return False


def distributed_requested(environ: dict[str, str] | None = None) -> bool:
    """Whether the environment describes a multi-process job.

    ``AGENTRL_DISTRIBUTED=1`` forces it on (and ``=0`` off); otherwise a coordinator address, a
    SLURM or Open MPI job of more than one task, or a multi-worker TPU slice switch it on.
    """
    env = os.environ if environ is None else environ
    forced = env.get("AGENTRL_DISTRIBUTED")
    if forced is not None:
        if forced not in ("0", "1"):
            raise ValueError(f"AGENTRL_DISTRIBUTED: expected '0' or '1', got {forced!r}")
        return forced == "1"
    if any(env.get(name) for name in _COORDINATOR_VARS):
        return True
    if _more_than_one(env.get("SLURM_NTASKS")) or _more_than_one(env.get("OMPI_COMM_WORLD_SIZE")):
        return True
    return "," in env.get("TPU_WORKER_HOSTNAMES", "")


def maybe_initialize_distributed() -> bool:
    """Calls ``jax.distributed.initialize()`` once if the environment asks for it.

    With ``JAX_COORDINATOR_ADDRESS`` (plus ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID``) the
    values are passed explicitly; otherwise JAX auto-detects the cluster. Returns True when this
    process is part of a multi-process job. Must run before any other JAX computation.
    """
    global _initialized
    if _initialized:
        return True
    if not distributed_requested():
        return False
    address = next((os.environ[v] for v in _COORDINATOR_VARS if os.environ.get(v)), None)
    if address is not None:
        jax.distributed.initialize(
            coordinator_address=address,
            num_processes=int(os.environ["JAX_NUM_PROCESSES"]) if "JAX_NUM_PROCESSES" in os.environ else None,
            process_id=int(os.environ["JAX_PROCESS_ID"]) if "JAX_PROCESS_ID" in os.environ else None,
        )
    else:
        jax.distributed.initialize()
    _initialized = True
    return True
