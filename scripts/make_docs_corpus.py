"""Write corpora/pretrain_docs.jsonl: this repository's own prose as a small local corpus (one JSON line
per document, a `text` column), the second component of `mixture=pydocs_repo` beside the embedded
pydocs corpus. Documents: each `## ` section of README.md and docs/*.md, and each module docstring of
src/pretrain with the docstrings of its classes and functions. Deterministic (sorted paths, source
order); rerun after the docs change: `python scripts/make_docs_corpus.py`.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUTPUT = REPO / "corpora" / "pretrain_docs.jsonl"


def markdown_sections(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    return [s.strip() for s in re.split(r"\n(?=## )", text) if len(s.strip()) > 200]


def module_docstrings(path: Path) -> str:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    parts = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node)
            if doc and (node is tree or len(doc) > 60):
                parts.append(doc if node is tree else f"{node.name}\n{doc}")
    return "\n\n".join(dict.fromkeys(parts))


def documents() -> list[str]:
    docs = [
        s for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))] for s in markdown_sections(p)
    ]
    for path in sorted((REPO / "src" / "pretrain").rglob("*.py")):
        text = module_docstrings(path)
        if len(text) > 200:
            docs.append(text)
    return docs


def main() -> None:
    OUTPUT.parent.mkdir(exist_ok=True)
    lines = [json.dumps({"text": text}, ensure_ascii=False) for text in documents()]
    OUTPUT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{OUTPUT.relative_to(REPO)}: {len(lines)} documents, {OUTPUT.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
