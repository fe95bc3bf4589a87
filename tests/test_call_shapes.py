"""Call shapes of the house rules: no def in the package or the app takes 6 or more positional parameters
and no call passes 6 or more positional arguments; records and long signatures take keywords
(`@dataclass(kw_only=True)`, a `*` in the signature), so a call names what it passes. Signatures a host
framework fixes are listed in ALLOWED with the reason; an entry that no longer matches anything fails."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCES = sorted(p for d in ("tokengrad",) for p in (REPO / d).rglob("*.py"))
MAX_POSITIONAL = 5

# "path:function" (the def, or the function a call sits in) -> why it keeps 6+ positional slots
ALLOWED = {
    "tokengrad/integrations/openrlhf/trainer.py:forward": (
        "the wrapper takes OpenRLHF PolicyLoss.forward's own signature (log_probs, old_log_probs, "
        "advantages, action_mask, rollout_log_probs, dp_size, ...): it stands in for the host's method"
    ),
    "tokengrad/integrations/verl/losses.py:policy_loss": (
        "verl's register_policy_loss fixes the signature (old_log_prob, log_prob, advantages, response_mask, "
        "loss_agg_mode, config, rollout_is_weights): names and order are verl's"
    ),
}


def _positional(args: ast.arguments) -> list[str]:
    return [a.arg for a in args.posonlyargs + args.args if a.arg not in ("self", "cls")]


def wide_shapes(source: str, path: str = "<source>") -> dict[str, str]:
    """{"path:function": what} for each def with 6+ positional parameters and each call passing 6+
    positional arguments (`function`: the def, or the innermost def the call sits in; "<module>" outside)."""
    found: dict[str, str] = {}

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = where
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = child.name
                if len(params := _positional(child.args)) > MAX_POSITIONAL:
                    found[f"{path}:{inner}"] = f"def {inner} with {len(params)} positional parameters"
            elif isinstance(child, ast.Call) and len(child.args) > MAX_POSITIONAL:
                if not any(isinstance(a, ast.Starred) for a in child.args):
                    call = ast.unparse(child.func)
                    found.setdefault(
                        f"{path}:{where}", f"{call}() with {len(child.args)} positional arguments"
                    )
            visit(child, inner)

    visit(ast.parse(source), "<module>")
    return found


def test_no_call_or_def_with_six_positional_slots():
    found = {}
    for path in SOURCES:
        found.update(wide_shapes(path.read_text(), str(path.relative_to(REPO))))
    unlisted = {k: v for k, v in found.items() if k not in ALLOWED}
    assert not unlisted, (
        f"6+ positional parameters or arguments (make the tail keyword-only: `*` in the def, "
        f"`@dataclass(kw_only=True)` for records, and name them at the call): {unlisted}"
    )
    stale = sorted(set(ALLOWED) - set(found))
    assert not stale, f"ALLOWED entries that no longer have 6+ positional slots (remove them): {stale}"


def test_the_scanner_finds_a_six_positional_call_and_def():
    src = (
        "def f(a, b, c, d, e, g):\n"
        "    return a\n"
        "def ok(a, b, c, *, d, e, g):\n"
        "    return f(1, 2, 3, 4, 5, 6)\n"
        "ok(1, 2, 3, d=4, e=5, g=6)\n"
        "f(*range(6))\n"
    )
    assert wide_shapes(src, "m.py") == {
        "m.py:f": "def f with 6 positional parameters",
        "m.py:ok": "f() with 6 positional arguments",
    }
    method = "class C:\n    def m(self, a, b, c, d, e):\n        return C.m(self, a, b, c, d, e)\n"
    assert wide_shapes(method, "c.py") == {"c.py:m": "C.m() with 6 positional arguments"}
