"""What shell tasks run inside sandboxes: ``state_checker.py``, bundled with ``git_env`` (:mod:`envs.in_sandbox`)."""
