"""The scheduler: sandbox jobs in priority order on a warm pool, each ending in exactly one result.

scheduler.py  Scheduler: submit / run, metrics, close (the public API)
core.py       its engine: job states, the dispatcher thread, attempts, retries and endings
jobs.py       Job, RetryPolicy, JobResult, and the JobHandle / Batch to wait on them
"""
