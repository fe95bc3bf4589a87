"""A weighting rule named with its parameters, as a config or an option gives it: ``"tr_grpo"``,
``"tr_grpo:alpha=0.5,placement=ratio"`` or ``{"name": "tr_grpo", "alpha": 0.5}``. Plain Python, no torch, so
that a config is checked before the trainer's modules are imported.

    parse_rule("tr_grpo:alpha=0.5", known=WEIGHTINGS, defaults=rule_params)   # ("tr_grpo", {"alpha": 0.5})
    rule_label("tr_grpo", {"alpha": 0.5})                                      # "tr_grpo:alpha=0.5"

The label is the rule's name in the ``whatif`` table and on the dashboard: the name alone with the rule's
defaults, else ``name:key=value,...`` over the parameters given, sorted by key.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from tokengrad.objective.params import check_params

_WORDS = {"true": True, "false": False, "none": None}


def _value(text: str):
    """A parameter value as written after '=': a bool, None, an int, a float, or else the string."""
    word = text.strip()
    if word.lower() in _WORDS:
        return _WORDS[word.lower()]
    for kind in (int, float):
        try:
            return kind(word)
        except ValueError:
            pass
    return word


def _split(spec) -> tuple[str, dict]:
    """(name, params) of a string ``name[:k=v,...]`` or a mapping with a ``name`` key."""
    if isinstance(spec, Mapping):
        if "name" not in spec:
            raise ValueError(f"a weighting rule given as a mapping needs a 'name' key, got {dict(spec)!r}")
        return str(spec["name"]), {k: v for k, v in spec.items() if k != "name"}
    if not isinstance(spec, str):
        raise ValueError(f"a weighting rule is a name, 'name:key=value,...' or a dict, got {spec!r}")
    name, _, rest = spec.partition(":")
    params = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"weighting rule {spec!r}: {item!r} is not key=value")
        params[key.strip()] = _value(value)
    return name.strip(), params


def parse_rule(spec, *, known: Collection[str], defaults: Callable[[str], Mapping]) -> tuple[str, dict]:
    """(name, params) of one rule spec, checked: an unknown name lists the known ones, a parameter the rule
    does not take (or of the wrong kind) names it (``check_params``)."""
    name, params = _split(spec)
    if name not in known:
        raise ValueError(f"unknown weighting rule {name!r}; known rules: {', '.join(sorted(known))}")
    check_params(name, params, defaults(name))
    return name, params


def regroup(pieces: list) -> list:
    """A list split at every comma (``whatif=tr_grpo:alpha=0.5,upper=1.8,lopti`` on a command line) put
    back into rules: a ``key=value`` piece without a ``:`` continues the rule before it."""
    out: list = []
    for piece in pieces:
        if isinstance(piece, str) and out and isinstance(out[-1], str) and "=" in piece and ":" not in piece:
            out[-1] += "," + piece
        else:
            out.append(piece)
    return out


def parse_rules(specs, *, known: Collection[str], defaults: Callable[[str], Mapping]) -> list[tuple]:
    """Several rule specs (one spec, or a list of them) -> [(name, params)], each label at most once."""
    if isinstance(specs, (str, Mapping)):
        specs = [specs]
    specs = regroup(list(specs))
    rules = [parse_rule(s, known=known, defaults=defaults) for s in specs]
    labels = [rule_label(*r) for r in rules]
    twice = sorted({x for x in labels if labels.count(x) > 1})
    if twice:
        raise ValueError(f"weighting rule(s) {twice} given twice")
    return rules


def rule_label(name: str, params: Mapping) -> str:
    """The rule's label: its name, then ``:key=value,...`` over the given parameters, sorted by key."""
    if not params:
        return name
    return name + ":" + ",".join(f"{k}={params[k]}" for k in sorted(params))
