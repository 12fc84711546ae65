"""The in-sandbox agent (PID 1 of every sandbox) and how the host ships it.

The modules of this package other than this one run *inside* the sandbox
(standard library only, Python >= 3.8): :mod:`~sandbox.agent.protocol` (the
wire format, also used by the host), :mod:`~sandbox.agent.confine` (locking the
agent down at boot, dropping commands to their uid), :mod:`~sandbox.agent.files`
(symlink-safe file operations), :mod:`~sandbox.agent.ipc` (System V IPC),
:mod:`~sandbox.agent.processes` (the process table, starting a command as its
uid), :mod:`~sandbox.agent.roots` (the writable roots' own xattrs and times) and :mod:`~sandbox.agent.server` (the request loop). A backend starts
``python3 -c BOOTSTRAP`` and writes :func:`bundle` to its stdin: the sources,
registered as modules under the same names, so the agent imports its parts as
it does on the host.
"""

from __future__ import annotations

import functools
import json
import struct
from pathlib import Path

from sandbox.agent.protocol import encode_message

# Read a u32 length and that much JSON [[module name, source], ...]; register each; run the last's main().
BOOTSTRAP = (
    "import sys,struct,json,types\n"
    "r=sys.stdin.buffer;n=struct.unpack('>I',r.read(4))[0]\n"
    "for k,s in json.loads(r.read(n)):\n"
    " m=types.ModuleType(k);m.__path__=[];sys.modules[k]=m;exec(compile(s,'agentrl:'+k,'exec'),m.__dict__)\n"
    "sys.modules[k].main()\n"
)
# In dependency order; the last one's main() runs.
_INSIDE = ("protocol", "confine", "files", "ipc", "processes", "signals", "roots", "server")


@functools.cache
def bundle() -> bytes:
    """What the host writes to a booting sandbox's stdin: the framed sources of the in-sandbox modules."""
    here = Path(__file__).parent
    modules = [["sandbox", ""], ["sandbox.agent", ""]]
    modules += [[f"sandbox.agent.{name}", (here / f"{name}.py").read_text()] for name in _INSIDE]
    raw = json.dumps(modules).encode()
    return struct.pack(">I", len(raw)) + raw


__all__ = ["BOOTSTRAP", "bundle", "encode_message"]
