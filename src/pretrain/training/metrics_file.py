"""`metrics.csv`: one row per logged optimizer step, on disk as soon as it is logged.

The format is Lightning's CSV logger's: a header of the sorted column names (`step` and the metric
names), then one row per logged step; an empty cell means the metric was not logged at that step.

How it is written (`MetricsFile`):

* a logged row is appended at once (one write of one line, flushed): a run killed with `kill -9` or by
  the OOM killer leaves every step it logged in the file. Appending costs O(1) per row; the whole file
  is rewritten only when a new column appears (`val/loss` at the first validation, a handful of times
  per run), atomically (a temporary file renamed over it), so a kill never leaves half a file;
* a run that starts in a directory that already has a `metrics.csv` (a resume into its own run
  directory) keeps the rows up to the step it starts from and drops the later ones: those steps are
  trained again, so the step column stays increasing. `start` says so in one line.

Reading (`read_table`, `numeric_rows`, `join_steps`) is shared with `pretrain compare`, which joins
repeated steps (last write wins) so that a resumed run is one continuous curve. Nothing here imports
Lightning.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
from collections.abc import Iterable
from pathlib import Path

from ..errors import ConfigError, WriteError
from ..fileio import write_text_atomic

FILE_NAME = "metrics.csv"
STEP = "step"
UNREADABLE_NAME = "metrics.unreadable.csv"
"""Where a run moves a `metrics.csv` it cannot read before it writes its own."""


def read_table(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    """The header and the complete rows (raw cells) of a metrics file.

    A last line cut off by a kill (no newline at its end, or fewer cells than the header) is left out.
    Raises ConfigError naming the file when it is not a CSV file with a `step` column."""
    header, rows, _ = _parse(Path(path))
    return header, rows


def _parse(path: Path) -> tuple[list[str], list[dict[str, str]], list[str]]:
    """read_table, plus the file's complete lines (line endings kept) when each is one record."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"{path} is not a metrics file (not UTF-8 text: {error.reason}): pass the directory of a run "
            "written by python train.py, or move this file away"
        ) from None
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith(("\n", "\r")):
        lines = lines[:-1]  # cut off mid-write
    try:
        parsed = list(csv.reader(lines))
    except csv.Error as error:
        raise ConfigError(f"{path} is not a CSV file ({error}): move it away or delete it") from None
    header = parsed[0] if parsed else []
    if STEP not in header:
        found = ", ".join(header[:6]) or "nothing"
        raise ConfigError(
            f"{path} is not a metrics file: its header has no `{STEP}` column (found: {found}); pass the "
            "directory of a run written by python train.py, or move this file away"
        )
    complete = [cells for cells in parsed[1:] if len(cells) == len(header)]
    rows = [dict(zip(header, cells, strict=True)) for cells in complete]
    return header, rows, lines if len(complete) == len(parsed) - 1 == len(lines) - 1 else []


def row_step(row: dict[str, str]) -> int | None:
    """The row's step, None when the cell is not a whole number."""
    try:
        value = float(row.get(STEP) or "nan")
    except ValueError:
        return None
    return int(value) if value.is_integer() else None


def numeric_rows(path: Path, rows: list[dict[str, str]]) -> list[dict[str, float]]:
    """Rows as numbers (empty cells left out); a cell that is not a number is a ConfigError naming the
    file, the line and the column."""
    numeric = []
    for line, row in enumerate(rows, start=2):
        values: dict[str, float] = {}
        for key, cell in row.items():
            if cell == "":
                continue
            try:
                values[key] = float(cell)
            except ValueError:
                raise ConfigError(
                    f"{path} line {line}: {cell[:40]!r} in column {key!r} is not a number; "
                    "fix or delete that line"
                ) from None
        numeric.append(values)
    return numeric


def join_steps(rows: Iterable[dict[str, float]]) -> list[dict[str, float]]:
    """One row per step, in step order; where a step was logged more than once (a resumed run, files
    joined), the later value of each metric wins."""
    by_step: dict[int, dict[str, float]] = {}
    for row in rows:
        if STEP in row:
            by_step.setdefault(int(row[STEP]), {}).update(row)
    return [by_step[step] for step in sorted(by_step)]


def _csv_text(columns: list[str], rows: Iterable[dict], header: bool) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    if header:
        writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


class MetricsFile:
    """Writes one run's metrics.csv (see the module docstring)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.columns: list[str] = []
        self.started = False
        self.dropped = 0  # rows `start` dropped or replaced (or 1 for an unreadable file moved aside)

    def _failed(self, error: OSError) -> WriteError:
        return WriteError(
            f"could not write {self.path}: {error.strerror or error}; free disk space or make "
            f"{self.path.parent} writable, then resume with ckpt_path=auto"
        )

    def _rewrite(self, rows: list[dict]) -> None:
        """The whole file, atomically: a kill or a full disk leaves the old file or the new one."""
        try:
            write_text_atomic(self.path, _csv_text(self.columns, rows, header=True))
        except OSError as error:
            raise self._failed(error) from None

    def start(self, start_step: int) -> str | None:
        """Take over the file for a run that starts after `start_step` optimizer steps (0 = a fresh
        start, k = resumed from a checkpoint of step k). Rows up to `start_step` are kept, later ones
        dropped; returns the one line that tells the user, or None when there was nothing to keep."""
        self.started = True
        if not self.path.is_file():
            return None
        try:
            header, rows, lines = _parse(self.path)
        except ConfigError as error:
            moved = self.path.with_name(UNREADABLE_NAME)
            os.replace(self.path, moved)
            self.dropped = 1
            return f"{error}; moved it to {moved} and starting a new {self.path.name}"
        steps = [row_step(row) for row in rows]
        keep = [step is not None and step <= start_step for step in steps]
        kept = [row for row, keeping in zip(rows, keep, strict=True) if keeping]
        dropped = [step for step, keeping in zip(steps, keep, strict=True) if not keeping]
        self.dropped = len(dropped)
        self.columns = header if kept else []
        if not kept:
            self.path.unlink()
        elif lines and all(keep[: len(kept)]):
            # The kept rows come first (the usual case): cut the file after them, no rewrite.
            os.truncate(self.path, sum(len(line.encode("utf-8")) for line in lines[: len(kept) + 1]))
        else:
            self._rewrite(kept)
        if start_step == 0:
            if not rows:
                return None
            return (
                f"{self.path} held {len(rows)} rows of an earlier run; this run starts from step 0 "
                "(no checkpoint resumed), so its rows replace them"
            )
        message = f"resuming after step {start_step}: {self.path} keeps its {len(kept)} rows up to that step"
        if not dropped:
            return message + ", new rows are appended"
        numbers = [step for step in dropped if step is not None]
        span = f" (steps {min(numbers)}..{max(numbers)})" if numbers else ""
        return message + (
            f" and drops {len(dropped)} rows logged after it before the interruption{span}: "
            "those steps are trained again"
        )

    def append(self, rows: list[dict]) -> None:
        """Write logged rows now: appended, or the whole file when a new column appears."""
        if not rows:
            return
        new = {key for row in rows for key in row} - set(self.columns)
        if new or not self.path.is_file():
            old = read_table(self.path)[1] if self.path.is_file() and self.columns else []
            self.columns = sorted(set(self.columns) | new)
            self._rewrite([*old, *rows])
            return
        text = _csv_text(self.columns, rows, header=False)
        size = self.path.stat().st_size
        try:
            with open(self.path, "a", newline="", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
        except OSError as error:
            with contextlib.suppress(OSError):  # no half row: the file ends with the last complete one
                os.truncate(self.path, size)
            raise self._failed(error) from None
