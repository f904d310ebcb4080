"""`python bench/measure_child.py OUT.json COMMAND...`: run COMMAND and write its wall seconds, CPU
seconds and peak RSS (MB) into OUT.json, with `started` (time.time() just before it started) and
`started_monotonic` (time.monotonic() then).

A child's ru_maxrss keeps the high-water mark of the process it was forked from (Linux carries it
across exec), so a child of a large benchmark process reports the parent's size. Started from this
small process instead, COMMAND's ru_maxrss is its own. Its stdout and stderr are COMMAND's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def main(out: str, command: list[str]) -> int:
    started_wall, started_monotonic = time.time(), time.monotonic()
    started = time.perf_counter()
    child = subprocess.Popen(command)
    with open(f"{out}.pid", "w") as handle:  # the parent reads COMMAND's CPU time while it runs
        handle.write(str(child.pid))
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - started
    code = os.waitstatus_to_exitcode(status)
    result = {
        "started": started_wall,
        "started_monotonic": started_monotonic,
        "wall": seconds,
        "cpu": usage.ru_utime + usage.ru_stime,
        "peak_rss_mb": usage.ru_maxrss / 1024,
        "exit_code": code,
    }
    with open(out, "w") as handle:
        json.dump(result, handle)
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], sys.argv[2:]))
