"""What function tests run inside sandboxes: the candidate driver, the check recorder, and the check evaluator.

``driver.py`` and ``recorder.py`` are programs, shipped as source
(:mod:`envs.in_sandbox`); ``checks.py`` is imported on the host too, so a
check is evaluated with the very same code when it is recorded and when it
judges a candidate.
"""
