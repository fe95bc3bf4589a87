"""Shareable URL state: the picked runs and the main settings live in the query string.

    http://127.0.0.1:8501/?runs=grpo,tr_grpo&smooth=0.8&x=tokens+seen&metrics=reward_mean,kl

Each synced widget is listed once in PARAMS (query parameter -> session key and codec). On the first
script run of a browser session, `restore()` copies the URL's values into Session State before any
widget is created; the widgets read their defaults through `default()` (never a `value=` argument, which
Streamlit would report as set twice); `push()` writes the current values back, so the address bar can be
copied at any time. A value that does not parse or lies outside what its widget offers (`?smooth=5`,
`-1`, `1e999`, `nan`, an unknown x axis) is ignored: the widget keeps its default.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import streamlit as st

from tokengrad.figures.curves import X_AXES

_RESTORED_KEY = "tg_url_restored"
SMOOTH_MAX = 0.99  # the Overview slider's upper end


class Param(NamedTuple):
    key: str  # Session State key of the widget
    decode: Callable[[str], Any]
    encode: Callable[[Any], str]


def _bool(text: str) -> bool:
    if text not in ("0", "1"):
        raise ValueError(text)
    return text == "1"


def _smoothing(text: str) -> float:
    """The Overview's EMA weight: a number in the slider's range 0..0.99 (NaN fails the comparison)."""
    value = float(text)
    if not 0.0 <= value <= SMOOTH_MAX:
        raise ValueError(text)
    return round(value, 2)  # the slider's step


def _x_axis(text: str) -> str:
    if text not in X_AXES:
        raise ValueError(text)
    return text


def _names(text: str) -> list[str]:
    """Comma-separated names, each once (`?runs=a,a,a,...` picks run a once)."""
    return list(dict.fromkeys(t for t in text.split(",") if t))


_LIST = (_names, lambda v: ",".join(v))
PARAMS: dict[str, Param] = {
    "runs": Param("tg_pick", *_LIST),
    "smooth": Param("ov_smooth", _smoothing, lambda v: f"{v:g}"),
    "logy": Param("ov_logy", _bool, lambda v: "1" if v else "0"),
    "x": Param("ov_x", _x_axis, str),
    "metrics": Param("ov_metrics_pick", *_LIST),
    "step": Param("in_step", int, str),  # the inspected step (tokengrad doctor's links)
    "sample": Param("in_sample", int, str),  # the completion to show first at that step
}


def restore() -> None:
    """Copy the URL's parameters into Session State once per browser session."""
    if st.session_state.get(_RESTORED_KEY):
        return
    st.session_state[_RESTORED_KEY] = True
    for name, p in PARAMS.items():
        if name in st.query_params:
            try:
                st.session_state[p.key] = p.decode(st.query_params[name])
            except (TypeError, ValueError):
                continue


def default(key: str, value: Any) -> None:
    """Give a widget its default through Session State (unless the URL or the user already set it)."""
    if key not in st.session_state:
        st.session_state[key] = value


def push() -> None:
    """Write the synced widgets' current values to the query string."""
    for name, p in PARAMS.items():
        if p.key in st.session_state:
            value = p.encode(st.session_state[p.key])
            if st.query_params.get(name) != value:
                st.query_params[name] = value
