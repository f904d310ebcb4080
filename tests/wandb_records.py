"""Read what W&B wrote offline: the `Record`s of a `run-*.wandb` file, and helpers over them.

W&B >= 0.2x keeps an offline run in one binary file (what `wandb sync` uploads) and ships no Python
reader for it any more. The format is a LevelDB-style log:

* a 7-byte file header: `:W&B`, the magic 0xBEE1 (little-endian uint16), version 0;
* 32 KiB blocks, counted from the start of the file (the header included); a record header never
  straddles a block: fewer than 7 bytes left in a block are zero padding;
* each fragment: crc32 (zlib, little-endian uint32) of the type byte followed by the data, the data
  length (little-endian uint16), the type (FULL=1, FIRST=2, MIDDLE=3, LAST=4), the data;
* a whole record (FULL, or FIRST + MIDDLE... + LAST) is a `wandb_internal_pb2.Record` protobuf.
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

from wandb.proto import wandb_internal_pb2 as pb

MAGIC = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def read_payloads(path: Path) -> list[bytes]:
    """The whole records of a .wandb file, as bytes; a bad checksum or framing raises."""
    data = Path(path).read_bytes()
    if not data.startswith(MAGIC):
        raise ValueError(f"{path}: not a W&B record file (header {data[:7]!r})")
    payloads: list[bytes] = []
    pending: bytearray | None = None
    offset = len(MAGIC)
    while offset + HEADER <= len(data):
        left = BLOCK - offset % BLOCK
        if left < HEADER:  # the block's tail is padding
            offset += left
            continue
        crc, length, kind = struct.unpack("<IHB", data[offset : offset + HEADER])
        if crc == length == kind == 0:  # zero padding (a block's unused tail)
            offset += left
            continue
        body = data[offset + HEADER : offset + HEADER + length]
        if len(body) < length:
            break  # a record being written when the file was read
        if zlib.crc32(bytes([kind]) + body) & 0xFFFFFFFF != crc:
            raise ValueError(f"{path}: checksum mismatch at byte {offset}")
        offset += HEADER + length
        if kind == FULL:
            payloads.append(body)
        elif kind == FIRST:
            pending = bytearray(body)
        elif kind in (MIDDLE, LAST):
            if pending is None:
                raise ValueError(f"{path}: fragment without a first part at byte {offset}")
            pending += body
            if kind == LAST:
                payloads.append(bytes(pending))
                pending = None
        else:
            raise ValueError(f"{path}: unknown fragment type {kind} at byte {offset}")
    return payloads


def read_records(path: Path) -> list[pb.Record]:
    records = []
    for payload in read_payloads(path):
        record = pb.Record()
        record.ParseFromString(payload)
        records.append(record)
    return records


def run_file(directory: Path) -> Path:
    """The one offline run's .wandb file under `directory` (a run's save_dir, its wandb/ folder, or
    the offline-run folder itself)."""
    directory = Path(directory)
    pattern = "run-*.wandb" if directory.name.startswith("offline-run-") else "offline-run-*/run-*.wandb"
    found = sorted(directory.rglob(pattern))
    if len(found) != 1:
        raise AssertionError(f"expected one offline W&B run under {directory}, found {found}")
    return found[0]


def finished_run_file(directory: Path, timeout: float = 30.0) -> Path:
    """`run_file`, once W&B has written its exit record: `finish()` can return before W&B's own
    process has flushed the last records (the history row with the tables among them)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        path = run_file(directory)
        if any(r.WhichOneof("record_type") == "exit" for r in read_records(path)):
            return path
        if time.monotonic() > deadline:
            raise AssertionError(f"{path}: no exit record after {timeout:.0f} s")
        time.sleep(0.2)


class OfflineRun:
    """What one offline run logged: its run record, config, metric definitions, history, summary."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.records = read_records(self.path)
        kinds = [r.WhichOneof("record_type") for r in self.records]
        self.runs = [r.run for r, k in zip(self.records, kinds, strict=True) if k == "run"]
        self.metrics = [r.metric for r, k in zip(self.records, kinds, strict=True) if k == "metric"]
        self.history: list[dict] = []
        for record, kind in zip(self.records, kinds, strict=True):
            if kind == "history":
                row: dict = {}
                self._apply(row, record.history.item, ())
                self.history.append(row)
        self.config: dict = {}
        self.summary: dict = {}
        for record, kind in zip(self.records, kinds, strict=True):
            if kind == "config":
                self._apply(self.config, record.config.update, record.config.remove)
            elif kind == "summary":
                self._apply(self.summary, record.summary.update, record.summary.remove)
        if self.runs:  # the run record carries the config given to wandb.init
            first: dict = {}
            self._apply(first, self.runs[0].config.update, ())
            self.config = {**first, **self.config}

    @staticmethod
    def _apply(target: dict, updates, removes) -> None:
        """Items name a top-level `key` or a `nested_key` path (a media value's fields, a nested
        config entry): paths become nested dicts."""
        for item in updates:
            path = [item.key] if item.key else list(item.nested_key)
            node = target
            for part in path[:-1]:
                node = node.setdefault(part, {})
            node[path[-1]] = json.loads(item.value_json)
        for item in removes:
            path = [item.key] if item.key else list(item.nested_key)
            node = target
            for part in path[:-1]:
                node = node.get(part, {})
            node.pop(path[-1], None)

    @property
    def name(self) -> str:
        return self.runs[-1].display_name

    @property
    def group(self) -> str:
        return self.runs[-1].run_group

    @property
    def job_type(self) -> str:
        return self.runs[-1].job_type

    def config_value(self, key: str):
        """A config entry as the user gave it (W&B stores each as {"value": ..., "desc": ...})."""
        value = self.config[key]
        return value["value"] if isinstance(value, dict) and "value" in value else value

    def step_metrics(self) -> dict[str, str]:
        """name or glob -> step metric of every metric definition (the last one wins)."""
        result: dict[str, str] = {}
        for metric in self.metrics:
            result[metric.name or metric.glob_name] = metric.step_metric
        return result

    def logged_keys(self) -> set[str]:
        return {key for row in self.history for key in row}
