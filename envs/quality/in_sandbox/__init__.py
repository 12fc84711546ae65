"""What the task-quality tools run inside sandboxes: ``oracle_scan.py``, bundled with ``git_env`` (:mod:`envs.in_sandbox`)."""
