"""Size limits of the house rules: no module of the package or the app over 400 lines, no function over
about 50 lines of code (docstrings, comments and blank lines not counted; 60 is the hard stop)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCES = sorted(p for d in ("tokengrad", "app") for p in (REPO / d).rglob("*.py"))
MAX_MODULE_LINES = 400
MAX_FUNCTION_CODE_LINES = 60


def code_lines(fn: ast.AST, lines: list[str]) -> int:
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        body = body[1:]  # the docstring
    covered = {n for stmt in body for n in range(stmt.lineno, stmt.end_lineno + 1)}
    return sum(1 for n in covered if lines[n - 1].strip() and not lines[n - 1].strip().startswith("#"))


def test_no_module_over_400_lines():
    long = {
        str(p.relative_to(REPO)): n
        for p in SOURCES
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by concept): {long}"


def test_no_function_over_about_50_lines_of_code():
    long = {}
    for path in SOURCES:
        text = path.read_text()
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if (n := code_lines(node, lines)) > MAX_FUNCTION_CODE_LINES:
                    long[f"{path.relative_to(REPO)}:{node.lineno} {node.name}"] = n
    assert not long, f"functions over {MAX_FUNCTION_CODE_LINES} lines of code: {long}"


def test_the_counter_counts_code_not_docs():
    src = 'def f():\n    """doc\n    more doc"""\n    # a comment\n\n    a = 1\n    return a\n'
    fn = ast.parse(src).body[0]
    assert code_lines(fn, src.splitlines()) == 2
