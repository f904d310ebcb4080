"""FineWeb-shaped fixture files: the same columns as the hub's parquet, as parquet or JSON lines."""

from __future__ import annotations

import json
import random
from pathlib import Path


def fineweb_rows(texts) -> list[dict]:
    rng = random.Random(len(texts))
    rows = []
    for i, text in enumerate(texts):
        rows.append(
            {
                "text": text,
                "id": f"<urn:uuid:{rng.getrandbits(128):032x}>",
                "dump": "CC-MAIN-2024-10",
                "url": f"https://example{i % 13}.org/articles/{i}",
                "date": f"2024-02-{1 + i % 28:02d}T{i % 24:02d}:00:00Z",
                "file_path": f"s3://commoncrawl/crawl-data/CC-MAIN-2024-10/segments/{i % 5}/warc/{i}.warc.gz",
                "language": "en",
                "language_score": round(0.8 + 0.2 * rng.random(), 6),
                "token_count": len(text.split()),
            }
        )
    return rows


def write_parquet(
    path: Path, texts, rows: list[dict] | None = None, row_group_size: int | None = None
) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = fineweb_rows(texts) if rows is None else rows
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)
    return path


def write_jsonl(path: Path, texts, rows: list[dict] | None = None) -> Path:
    rows = fineweb_rows(texts) if rows is None else rows
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path
