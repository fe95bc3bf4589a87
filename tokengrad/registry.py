"""One helper for every extension point (weighting rules, tasks, models, aggregations, advantage scales).

    RULES = Registry("weighting rule")

    @RULES.register("my_rule", pointwise=True)      # extra keywords become attributes of the entry
    def my_rule(batch, **params): ...

    RULES["my_rule"]              # the function; an unknown name raises ValueError listing the known ones
    RULES.describe()              # help text: one line per name with the first line of its docstring

A registry is a read-only Mapping from name to entry, filled only through `register`, which refuses a name
that is already taken (a plugin cannot silently replace a built-in). No torch here: the bottom layer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Mapping[str, T], Generic[T]):
    """name -> entry, filled by the `register` decorator.

    Args:
        kind: what an entry is, in words ("weighting rule"); used in every error and help text.
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str, **attrs) -> Callable[[T], T]:
        """Decorator: store the decorated object under `name`, with `attrs` set on it as attributes."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} needs a non-empty string name, got {name!r}")

        def deco(entry: T) -> T:
            self.add(name, entry, **attrs)
            return entry

        return deco

    def add(self, name: str, entry: T, **attrs) -> T:
        """Store `entry` under `name` (the decorator's body, for entries that are not functions)."""
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered; choose another name")
        for key, value in attrs.items():
            setattr(entry, key, value)
        self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> T:
        """Remove and return an entry (for tests and interactive sessions that redefine a plugin)."""
        return self._entries.pop(self._known(name))

    def __getitem__(self, name: str) -> T:
        return self._entries[self._known(name)]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def get(self, name: str, default=None):
        return self._entries.get(name, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {sorted(self._entries)})"

    def _known(self, name: str) -> str:
        if name not in self._entries:
            raise ValueError(f"unknown {self.kind} {name!r}; known {self.kind}s: {sorted(self._entries)}")
        return name

    def describe(self) -> str:
        """One line per entry, sorted: name and the first line of its docstring."""
        width = max((len(n) for n in self._entries), default=0)
        return "\n".join(
            f"{name:<{width}}  {_summary(entry)}".rstrip() for name, entry in sorted(self._entries.items())
        )


def _summary(entry: object) -> str:
    doc = getattr(entry, "__doc__", None) or ""
    return doc.strip().split("\n", 1)[0] if doc.strip() else ""
