"""Each log line once when the output is not a terminal (a log file, CI), under ``absl.app`` as the CLI runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = """
import logging, sys
from absl import app
from tqdm.auto import tqdm
from {module} import {name} as redirect

def main(argv):
    logging.getLogger().setLevel(logging.INFO)
    bar = tqdm(total=2, desc="agentrl")
    with redirect():
        logging.getLogger("rl.run.trainer").info("LINE-ONE")
        bar.update(1)
        logging.getLogger("rl.run.trainer").warning("LINE-TWO")
    bar.close()
    logging.getLogger("after").info("LINE-AFTER")  # the console handlers are back

app.run(main)
"""


def run_to_file(tmp_path: Path, module: str, name: str) -> str:
    """The program's stdout and stderr, redirected to a file (no tty) as a CI job or `> run.log 2>&1` does."""
    out = tmp_path / "run.log"
    with out.open("w") as f:
        subprocess.run(
            [sys.executable, "-c", PROGRAM.format(module=module, name=name)],
            stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, check=True, timeout=120,
        )  # fmt: skip
    return out.read_text()


def test_each_log_line_is_printed_once_to_a_file(tmp_path):
    text = run_to_file(tmp_path, "rl.run.console", "logs_above_bar")
    for line in ("LINE-ONE", "LINE-TWO", "LINE-AFTER"):
        assert text.count(line) == 1, text
    assert "<string>:11] " in text.split("LINE-ONE")[0].splitlines()[-1]  # absl's prefix (file:line) is kept


def test_control_tqdm_redirect_alone_prints_twice_under_absl(tmp_path):
    """Control: the probe sees the doubling when it is there (tqdm's redirect leaves absl's handler in place)."""
    text = run_to_file(tmp_path, "tqdm.contrib.logging", "logging_redirect_tqdm")
    assert text.count("LINE-ONE") == 2, text
