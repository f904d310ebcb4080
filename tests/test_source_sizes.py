"""Files that each do one job: no source module over 450 lines and no function over 60 (the numba
packing kernels aside: batching/packing_kernels.py, whose kernels are one loop each, kept whole for speed)."""

from __future__ import annotations

import ast

from helpers import REPO

PACKAGE = REPO / "src" / "pretrain"
MAX_FILE_LINES = 450
MAX_FUNCTION_LINES = 60
KERNELS = PACKAGE / "data" / "batching" / "packing_kernels.py"


def _functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def _is_kernel(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A numba kernel: decorated with the kernels module's `_kernel` (njit)."""
    return any(ast.unparse(d).split("(")[0] in ("_kernel", "njit", "numba.njit") for d in node.decorator_list)


def test_no_source_file_is_over_the_limit():
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in sorted(PACKAGE.rglob("*.py"))
        if p != KERNELS and (n := len(p.read_text().splitlines())) > MAX_FILE_LINES
    }
    assert long == {}


def test_no_function_is_over_the_limit():
    long = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in _functions(ast.parse(path.read_text())):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_FUNCTION_LINES and not _is_kernel(node):
                long[f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}"] = length
    assert long == {}


def test_the_kernel_exemption_finds_the_kernels():
    """The exemption matches the numba kernels (every other function of their file is checked)."""
    kernels = [n for n in _functions(ast.parse(KERNELS.read_text())) if _is_kernel(n)]
    assert len(kernels) >= 3
