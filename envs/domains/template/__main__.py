"""``python -m envs.domains.template [PATH]``: writes the template's tasks (default ``envs/data/<NAME>.jsonl``)."""

import sys

from envs import write_jsonl
from envs.domains.template.env import NAME
from envs.domains.template.tasks import make_tasks

path = sys.argv[1] if len(sys.argv) > 1 else f"envs/data/{NAME}.jsonl"
print(f"{write_jsonl(make_tasks(), path)} tasks -> {path}")
