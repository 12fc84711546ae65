"""What repository repair runs inside sandboxes: the split judge's three programs and their wire.

``repo_server.py`` (the repository under test, as the sandbox user),
``repo_judge.py`` (pytest over the hidden tests, as the judge user) with
``repo_proxy.py`` (the judge's view of the repository), and ``repo_wire.py``
(length-prefixed JSON messages of :mod:`plain_data <envs.in_sandbox.plain_data>`
values). Shipped as files side by side by :mod:`envs.domains.repair.split_judge`;
on the host only tests import them.
"""
