"""What pipeline tasks run inside sandboxes: ``runner.py``, the pipeline runner shipped as the task's ``runner.py``.

The same file runs the agent's config in the workspace, the judge's rerun on
hidden datasets, and (on the host, at authoring time) the gold config that
produces the expected outputs.
"""
