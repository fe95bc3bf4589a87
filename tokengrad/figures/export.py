"""Static, publication-ready figures: `tokengrad export RUN [RUN ...] --out DIR --format png|svg|pdf`.

    tokengrad export runs/grpo runs/tr_grpo --out figs --format pdf

writes the papers' figure set (figures.figureset: reward, entropy and gradient-norm trajectories, accuracy
by difficulty, weight curves; per run the share of tokens vs share of the gradient, bucket update shares,
gradient norm vs probability, per-layer norms and high/low-probability word clouds) in one style
(figures.style.paper_style: 3.5 in columns / 7 in pages, paper fonts, no dashboard chrome). PNGs carry
their resolution (a pHYs chunk of 300 dpi), so they print at the intended size.

Static images come from kaleido >= 1, which drives a separately installed Chrome/Chromium (Debian:
`apt-get install -y chromium`); one browser renders the whole set. Without a browser the command says how
to install one and writes interactive HTML instead.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import plotly.graph_objects as go

from tokengrad.figures.figureset import FigureSpec
from tokengrad.figures.style import PNG_DPI, PNG_SCALE, captions, paper_style

STATIC_FORMATS = ("png", "svg", "pdf")
BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
BROWSER_PATHS = (
    "/usr/bin/chromium",
    "/usr/bin/chromium-browser",
    "/usr/bin/google-chrome",
    "/snap/bin/chromium",
    "/Applications/Google Chrome.app/Contents/MacOS/Google Chrome",
)
INSTALL_HINT = (
    "Static image export (kaleido >= 1) needs Chrome or Chromium. Install it with\n"
    "    apt-get install -y chromium        # Debian/Ubuntu (as root)\n"
    "or point BROWSER_PATH at an existing Chrome/Chromium binary."
)
_KOPTS = {"mathjax": False}  # no LaTeX in our figures; MathJax would be fetched from a CDN


class BrowserNotFoundError(RuntimeError):
    """No Chrome/Chromium for kaleido; the message says how to install one."""


def find_browser() -> str | None:
    """Chrome/Chromium executable: $BROWSER_PATH, then PATH names, then usual install locations."""
    env = os.environ.get("BROWSER_PATH")
    if env and os.access(env, os.X_OK):
        return env
    for name in BROWSER_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return next((p for p in BROWSER_PATHS if os.access(p, os.X_OK)), None)


def _browser() -> str:
    path = find_browser()
    if path is None:
        raise BrowserNotFoundError(INSTALL_HINT)
    return path


def _opts(fig: go.Figure, fmt: str, width: int | None, height: int | None, scale: float | None) -> dict:
    if fmt not in STATIC_FORMATS:
        raise ValueError(f"unknown image format {fmt!r}; known: {sorted(STATIC_FORMATS + ('html',))}")
    return {
        "format": fmt,
        "width": width or fig.layout.width or 700,
        "height": height or fig.layout.height or 450,
        "scale": scale if scale is not None else (PNG_SCALE if fmt == "png" else 1),
    }


def figure_to_bytes(
    fig: go.Figure,
    fmt: str = "png",
    *,
    width: int | None = None,
    height: int | None = None,
    scale: float | None = None,
) -> bytes:
    """The figure as PNG (300 dpi by default), SVG, PDF or self-contained HTML bytes (for download buttons).

    Static formats start one headless browser per call (~1-2 s); call paper_style(fig) first for the
    publication look. Raises BrowserNotFoundError (with the install command) when no browser exists.
    """
    if fmt == "html":
        return fig.to_html(full_html=True, include_plotlyjs=True).encode("utf-8")
    opts = _opts(fig, fmt, width, height, scale)
    import kaleido

    return kaleido.calc_fig_sync(fig, opts=opts, kopts={"path": _browser(), **_KOPTS})


def write_static(
    specs: Sequence[FigureSpec], out_dir: Path, formats: str | Sequence[str] = "png"
) -> list[Path]:
    """Write paper-styled figures in one or more formats with one browser for all; returns the paths.
    Each file is written under a temporary name and renamed when complete (a PNG with its 300 dpi), so a
    killed export leaves no partial file under a final name."""
    import kaleido

    formats = [formats] if isinstance(formats, str) else list(formats)
    jobs, paths = [], []
    for spec in specs:
        fig = paper_style(spec.figure, spec.width, spec.height_in, keep_title=spec.keep_title)
        for fmt in formats:
            path = out_dir / f"{spec.name}.{fmt}"
            jobs.append(
                {"fig": fig, "path": str(partial_path(path)), "opts": _opts(fig, fmt, None, None, None)}
            )
            paths.append(path)
    try:
        errors = kaleido.write_fig_from_object_sync(jobs, kopts={"path": _browser(), **_KOPTS})
        if errors:
            raise RuntimeError(f"kaleido failed on {len(errors)} figure(s): {errors[0]!r}")
        for path in paths:
            if path.suffix == ".png":
                set_png_dpi(partial_path(path))
            os.replace(partial_path(path), path)
    finally:
        for path in paths:
            partial_path(path).unlink(missing_ok=True)
    return paths


def partial_path(path: Path) -> Path:
    """Where `path` is written before its rename: a dot file with the same extension."""
    return path.with_name(f".{path.stem}.partial{path.suffix}")


def set_png_dpi(path: Path, dpi: int = PNG_DPI) -> None:
    """Store the resolution in the PNG (pHYs chunk, pixels per metre) so viewers and TeX size it right;
    kaleido writes none. Pillow rewrites the file losslessly."""
    from PIL import Image

    with Image.open(path) as im:
        im.load()
        im.save(path, format="PNG", dpi=(dpi, dpi))


def write_captions(specs: Sequence[FigureSpec], out_dir: Path) -> Path:
    """captions.md: each figure's caption lines (the counts and notes kept out of its legend and title)."""
    lines = ["# Figure captions", ""]
    for spec in specs:
        fig = paper_style(spec.figure, spec.width, spec.height_in, keep_title=spec.keep_title)
        notes = captions(fig)
        if notes:
            lines += [f"- **{spec.name}**: " + "; ".join(notes)]
    path = out_dir / "captions.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def write_html(specs: Sequence[FigureSpec], out_dir: Path) -> list[Path]:
    """Paper-styled interactive HTML files sharing one plotly.min.js in out_dir (works offline)."""
    paths = []
    for spec in specs:
        path = out_dir / f"{spec.name}.html"
        fig = paper_style(spec.figure, spec.width, spec.height_in, keep_title=spec.keep_title)
        fig.write_html(partial_path(path), include_plotlyjs="directory")
        os.replace(partial_path(path), path)
        paths.append(path)
    return paths
