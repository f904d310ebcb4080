"""What reads as prose in a package's files (source=pkgdocs): a module's docstrings and prose comment
blocks, a C/C++ file's prose comments, a documentation file that is prose (not code, data or legal text)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

_C_COMMENT = re.compile(rb"/\*(.*?)\*/|//([^\n]*)", re.S)
_WORD = re.compile(r"[A-Za-z][a-z]*[.,;:!?)'\"]*")
_PRAGMA = re.compile(r"(noqa|type:|pylint|fmt:|mypy:|pragma|isort:|ruff:|pyright:|-\*-|!)", re.I)
_LEGAL = re.compile(r"copyright|licen[cs]e|spdx|warrant", re.IGNORECASE)
_MIN_WORDS = 3  # a comment block this short says little
_MIN_DOCSTRING = 20  # characters of a class's or function's docstring
_PROSE_SHARE = 0.6  # of whitespace-separated tokens that are words: prose, not code or data


def is_prose(text: str, min_words: int = _MIN_WORDS) -> bool:
    """Enough words, and mostly words: prose rather than code, data or a list of names."""
    tokens = text.split()
    if len(tokens) < min_words:
        return False
    return sum(bool(_WORD.fullmatch(t.lstrip("(\"'`"))) for t in tokens) >= _PROSE_SHARE * len(tokens)


def _string_lines(tree: ast.AST) -> set[int]:
    """Lines inside multi-line string literals (a `#` there is text, not a comment)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            end = node.end_lineno or node.lineno
            if end > node.lineno:
                lines.update(range(node.lineno + 1, end + 1))
    return lines


def _comment_blocks(source: str, inside_strings: set[int]) -> Iterator[tuple[int, str]]:
    """(first line, text) of each run of full-line comments that reads as prose."""
    block: list[str] = []
    start = last = -2
    for number, line in enumerate(source.splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith("#") and number not in inside_strings:
            body = stripped.lstrip("#").strip()
            if _PRAGMA.match(body):
                continue
            if number != last + 1 and block:
                yield start, " ".join(block)
                block = []
            if not block:
                start = number
            if body:
                block.append(body)
            last = number
    if block:
        yield start, " ".join(block)


def module_prose(data: bytes) -> str:
    """A module's docstrings (each class's or function's after its name, if over 20 characters)
    and its comment blocks that read as prose (not code commented out, not legal text), in source
    order; a repeated passage once."""
    try:
        tree = ast.parse(data)
        source = data.decode("utf-8")
    except (SyntaxError, ValueError, UnicodeDecodeError):
        return ""
    pieces: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node)
            if doc and (node is tree or len(doc) > _MIN_DOCSTRING):  # examples and all: documentation
                line = node.body[0].lineno if node.body else 0
                title = "" if isinstance(node, ast.Module) else f"{node.name}\n"
                pieces.append((line, title + doc))
    for line, text in _comment_blocks(source, _string_lines(tree)):
        if is_prose(text) and not _LEGAL.search(text):
            pieces.append((line, text))
    pieces.sort(key=lambda piece: piece[0])
    return "\n\n".join(dict.fromkeys(text for _, text in pieces))


def c_prose(data: bytes) -> str:
    """A C or C++ file's comments that read as prose (`/* */` blocks, runs of `//` lines), in order."""
    pieces: list[str] = []
    run: list[str] = []
    line = position = 0
    last = -2
    for match in _C_COMMENT.finditer(data):
        line += data.count(b"\n", position, match.start())
        position = match.start()
        block, single = match.group(1), match.group(2)
        alone = not data[data.rfind(b"\n", 0, match.start()) + 1 : match.start()].strip()
        if single is not None and alone and line == last + 1:
            run.append(single.decode("utf-8", "replace").strip("/! ").strip())
        else:
            pieces.append(" ".join(run))
            run = []
            if single is not None:
                run = [single.decode("utf-8", "replace").strip("/! ").strip()]
            else:
                text = block.decode("utf-8", "replace")
                pieces.append(re.sub(r"^\s*\*+ ?", "", text, flags=re.M).strip("*! \n"))
        last = line + (block.count(b"\n") if block is not None else 0) if alone else -2
    pieces.append(" ".join(run))
    kept = [p for p in pieces if is_prose(p) and not _LEGAL.search(p)]
    return "\n\n".join(dict.fromkeys(kept))


def doc_prose(data: bytes) -> str:
    """A documentation file's text when it reads as prose, else ""."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return ""
    return text if is_prose(text, 20) else ""
