"""train.py's end (fast_exit.exit_now): what an exit must do still happens, in order, with the code."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers.env import REPO

PROGRAM = """
import atexit, logging, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
from pretrain.cli.fast_exit import exit_now

pool = ThreadPoolExecutor(2)  # idle workers left running (inductor's compile pool): never joined as is
pool.submit(print, "pool job ran").result()

logging.basicConfig(filename=sys.argv[1], level=logging.INFO)
logging.info("logged before the exit")  # a file handler's buffer: closed by logging's atexit handler
atexit.register(lambda: print("atexit handler ran"))
worker = threading.Thread(target=lambda: (time.sleep(0.3), print("worker finished")))
worker.start()
print("buffered, no newline", end="")
exit_now(3)
print("never printed")
"""


def test_exit_now_waits_for_threads_runs_atexit_flushes_and_exits_with_its_code(tmp_path):
    log = tmp_path / "run.log"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(log)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout.startswith("pool job ran\nbuffered, no newline")
    assert done.stdout.index("worker finished") < done.stdout.index("atexit handler ran")
    assert "never printed" not in done.stdout
    assert "logged before the exit" in log.read_text()
