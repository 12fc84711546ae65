"""The kernel's link protections, required before a sandbox is made on this kernel.

The judge and the model's commands share ``/tmp`` (a judge that names a path in it
explicitly, not through its own ``TMPDIR``, meets whatever the model planted there).
With ``fs.protected_symlinks``/``hardlinks`` at 1 and ``protected_regular``/``fifos``
at 2, the kernel refuses to follow a link, or to open for writing a file or FIFO, in a
sticky world-writable directory when its owner is someone else: a planted symlink can
no longer make the judge overwrite its own files. These knobs are global to the
kernel, not per namespace, so nothing inside a sandbox can set them; a backend on a
kernel without them refuses to start and says how to set them
(``scripts/system_setup.sh`` does, persistently).
"""

from __future__ import annotations

from pathlib import Path

from sandbox.errors import BackendUnavailable

REQUIRED = {"protected_symlinks": 1, "protected_hardlinks": 1, "protected_regular": 2, "protected_fifos": 2}
FIX = "bash scripts/system_setup.sh (or: sysctl -w " + " ".join(f"fs.{k}={v}" for k, v in REQUIRED.items()) + ")"


def weak_link_protections(proc_sys: Path = Path("/proc/sys/fs")) -> dict[str, int]:
    """The knobs below their required value on this kernel, with the value they have (unreadable counts as 0)."""
    weak = {}
    for name, need in REQUIRED.items():
        try:
            value = int((proc_sys / name).read_text().strip())
        except (OSError, ValueError):
            value = 0
        if value < need:
            weak[name] = value
    return weak


def require_link_protections(backend: str, proc_sys: Path = Path("/proc/sys/fs")) -> None:
    """Raises :class:`BackendUnavailable` naming each weak knob, unless this kernel protects shared /tmp."""
    weak = weak_link_protections(proc_sys)
    if weak:
        have = ", ".join(f"fs.{k}={v} (need {REQUIRED[k]})" for k, v in weak.items())
        raise BackendUnavailable(
            f"this kernel lets a file planted in the sandbox's shared /tmp redirect the judge's writes: {have}; "
            f"run {FIX}",
            backend=backend,
        )
