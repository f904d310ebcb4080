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


def run_python(program: str, arg: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run(
        [sys.executable, "-c", program, arg], env=env, capture_output=True, text=True, timeout=120
    )


def test_exit_now_waits_for_threads_runs_atexit_flushes_and_exits_with_its_code(tmp_path):
    log = tmp_path / "run.log"
    done = run_python(PROGRAM, str(log))
    assert done.returncode == 3, done.stderr
    assert done.stdout.startswith("pool job ran\nbuffered, no newline")
    assert done.stdout.index("worker finished") < done.stdout.index("atexit handler ran")
    assert "never printed" not in done.stdout
    assert "logged before the exit" in log.read_text()


RUN_AND_EXIT = """
import atexit, sys
from pretrain.cli.fast_exit import run_and_exit


class TornDown:
    def __del__(self):  # runs in the interpreter's teardown (module globals cleared), never after os._exit
        print("teardown ran", flush=True)


kept = TornDown()
atexit.register(lambda: print("atexit handler ran"))


def main():
    how = sys.argv[1]
    if how == "code":
        raise SystemExit(143)  # a run stopped by SIGTERM
    if how == "message":
        raise SystemExit("error: a message")
    if how == "error":
        raise ValueError("a bug")


run_and_exit(main)
"""


def test_run_and_exit_ends_a_return_or_an_exit_code_without_the_teardown():
    for how, code in (("return", 0), ("code", 143)):
        done = run_python(RUN_AND_EXIT, how)
        assert done.returncode == code, done.stderr
        assert done.stdout == "atexit handler ran\n"  # atexit yes, the interpreter's teardown no


def test_run_and_exit_leaves_a_message_or_a_traceback_to_python():
    message = run_python(RUN_AND_EXIT, "message")
    assert message.returncode == 1 and message.stderr.strip() == "error: a message"
    assert "teardown ran" in message.stdout and "atexit handler ran" in message.stdout
    error = run_python(RUN_AND_EXIT, "error")
    assert error.returncode == 1 and error.stderr.rstrip().endswith("ValueError: a bug")
    assert "teardown ran" in error.stdout
