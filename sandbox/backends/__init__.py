"""Backends: what makes one sandbox, and the host end of the channel to the agent inside it.

    base.py      the Sandbox API (argument checks, exec/files/snapshots over the channel) and Backend
    channel.py   transports (pipes, Docker's attach socket) and the request/response channel
    bwrap.py     the fast local backend: bubblewrap namespaces + a cgroup + seccomp
    docker.py    the production backend: one container per sandbox, local or remote daemon
    cgroups.py   the per-sandbox cgroups bwrap uses for memory, process and CPU limits

A backend only starts ``python3 -c BOOTSTRAP`` isolated and hands over a
transport; everything a sandbox does goes through the one channel, so both
backends behave the same. Pick one with :func:`sandbox.get_backend`.
"""
