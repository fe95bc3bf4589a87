"""Size limits of the house rules: no module of the package or the app over 400 lines of code, no function
over about 50 (docstrings, comments and blank lines not counted; 60 is the hard stop). A function that is
one concept and longer (a signature a host framework fixes, one formula's steps) is listed in LONG_ALLOWED
with the reason; an entry that is no longer long, or no longer exists, fails."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCES = sorted(p for d in ("tokengrad",) for p in (REPO / d).rglob("*.py"))
MAX_MODULE_LINES = 400
MAX_FUNCTION_CODE_LINES = 60

# "path:function" -> why the function stays one piece though it is over MAX_FUNCTION_CODE_LINES
LONG_ALLOWED: dict[str, str] = {}


def _is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(getattr(stmt, "value", None), ast.Constant)


def _counted(line_numbers, lines: list[str]) -> int:
    return sum(1 for n in line_numbers if lines[n - 1].strip() and not lines[n - 1].strip().startswith("#"))


def code_lines(fn: ast.AST, lines: list[str]) -> int:
    body = fn.body
    if body and _is_docstring(body[0]):
        body = body[1:]  # the docstring
    covered = {n for stmt in body for n in range(stmt.lineno, stmt.end_lineno + 1)}
    return _counted(covered, lines)


def module_code_lines(text: str) -> int:
    """Lines of code of a module: every line but blank ones, comments and the docstrings of the module,
    its classes and functions."""
    lines = text.splitlines()
    docs = set()
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body:
            if _is_docstring(body[0]):
                docs.update(range(body[0].lineno, body[0].end_lineno + 1))
    return _counted((n for n in range(1, len(lines) + 1) if n not in docs), lines)


def long_functions() -> dict[str, int]:
    """{"path:function": lines of code} of every function over MAX_FUNCTION_CODE_LINES."""
    long = {}
    for path in SOURCES:
        text = path.read_text()
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if (n := code_lines(node, lines)) > MAX_FUNCTION_CODE_LINES:
                    long[f"{path.relative_to(REPO)}:{node.name}"] = n
    return long


def test_no_module_over_400_lines_of_code():
    long = {
        str(p.relative_to(REPO)): n
        for p in SOURCES
        if (n := module_code_lines(p.read_text())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines of code (split them by concept): {long}"


def test_no_function_over_about_50_lines_of_code():
    long = long_functions()
    unlisted = {k: n for k, n in long.items() if k not in LONG_ALLOWED}
    assert not unlisted, f"functions over {MAX_FUNCTION_CODE_LINES} lines of code: {unlisted}"
    stale = sorted(set(LONG_ALLOWED) - set(long))
    assert not stale, f"LONG_ALLOWED entries no longer over {MAX_FUNCTION_CODE_LINES} lines or gone: {stale}"


def test_the_counter_counts_code_not_docs():
    src = 'def f():\n    """doc\n    more doc"""\n    # a comment\n\n    a = 1\n    return a\n'
    fn = ast.parse(src).body[0]
    assert code_lines(fn, src.splitlines()) == 2


def test_the_module_counter_skips_docstrings_comments_and_blank_lines():
    src = (
        '"""module doc\nmore"""\n\nimport os\n\n\nclass C:\n    """class doc"""\n\n    x = 1  # kept\n'
        '    # a comment\n    def f(self):\n        """doc"""\n        return """a string,\nnot a doc"""\n'
    )
    assert module_code_lines(src) == 6  # import, class, x, def, and the return's two lines
