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

Every file is written under a temporary name in its folder and renamed when whole (write_atomic), so a
full disk or a killed export leaves no partial file; a folder that cannot take the files (disk full,
read-only, no permission) raises OutputError naming it. A figure the browser fails on is listed and the
others are written (export_static).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import io
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import plotly.graph_objects as go

from tokengrad.figures.figureset import FigureSpec, one_line
from tokengrad.figures.style import PNG_DPI, PNG_SCALE, captions, paper_style
from tokengrad.read.display import visible_text

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


class OutputError(OSError):
    """The output folder cannot take the files (disk full, read-only, no permission); names the folder.
    OutputError(errno, message); str() is the message alone, without OSError's "[Errno N]" prefix."""

    def __str__(self) -> str:
        return str(self.strerror)


class StaticExport(NamedTuple):
    written: list[Path]
    failed: list[str]  # "name.fmt: error" per figure the browser could not render; the rest are written


def output_error(err: OSError, folder: Path) -> OutputError:
    """`err` from writing into `folder` as a message saying which folder and what to do."""
    where = visible_text(str(folder))
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        text = f"disk full: no space left in {where} ({err.strerror}); free space or pick another --out"
    elif err.errno == errno.EROFS:
        text = f"cannot write into {where}: read-only file system; pick another --out"
    elif err.errno in (errno.EACCES, errno.EPERM):
        text = f"cannot write into {where}: permission denied; pick another --out"
    else:
        text = f"cannot write into {where}: {err.strerror or err}"
    return OutputError(err.errno, text + " (no partial file left behind)")


def write_atomic(path: Path, data: bytes | Callable[[Path], object]) -> Path:
    """Write `data` (bytes, or a function writing the file at the path it is given) under a temporary
    name in the same folder, then rename: `path` is whole or absent. On failure the temporary file is
    removed and an OutputError names the folder."""
    tmp = partial_path(path)
    try:
        if callable(data):
            data(tmp)
        else:
            tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):  # a read-only folder cannot even remove it; nothing was made
            tmp.unlink(missing_ok=True)
        raise output_error(err, path.parent) from err
    return path


def make_out_dir(out_dir: Path) -> Path:
    """`out_dir` created (with parents); an OutputError naming it when that is impossible."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise output_error(err, out_dir) from err
    return out_dir


def export_static(
    specs: Sequence[FigureSpec], out_dir: Path, formats: str | Sequence[str] = "png"
) -> StaticExport:
    """Render paper-styled figures in one or more formats with one browser and write each as it is done
    (write_atomic: whole or absent; PNGs with their 300 dpi). A figure the browser fails on is listed in
    `failed` and the others are written; a folder that cannot take the files raises OutputError at once.
    Raises BrowserNotFoundError without a browser, or the browser's error when it does not start."""
    formats = [formats] if isinstance(formats, str) else list(formats)
    jobs, failed = [], []
    for spec in specs:
        try:
            fig = paper_style(spec.figure, spec.width, spec.height_in, keep_title=spec.keep_title)
            jobs += [
                (out_dir / f"{spec.name}.{fmt}", fig, _opts(fig, fmt, None, None, None)) for fmt in formats
            ]
        except Exception as err:  # one figure's styling must not cost the others; reported, not hidden
            failed.append(f"{spec.name}: {one_line(err)}")
    written = _run_blocking(_render(jobs, failed, {"path": _browser(), **_KOPTS}))
    return StaticExport(written, failed)


def write_static(
    specs: Sequence[FigureSpec], out_dir: Path, formats: str | Sequence[str] = "png"
) -> list[Path]:
    """export_static for callers that need every figure: returns the paths, or raises RuntimeError naming
    the figures that failed (after writing the others)."""
    result = export_static(specs, out_dir, formats)
    if result.failed:
        raise RuntimeError(f"{len(result.failed)} figure(s) failed: " + "; ".join(result.failed))
    return result.written


async def _render(jobs: list, failed: list[str], kopts: dict) -> list[Path]:
    """Each job (path, figure, options) rendered in turn in one browser and written when done."""
    import kaleido

    written = []
    async with kaleido.Kaleido(**kopts) as k:
        for path, fig, opts in jobs:
            try:
                data = await k.calc_fig(fig, opts=opts)
            except Exception as err:  # a figure the browser cannot draw: listed, the others go on
                failed.append(f"{path.name}: {one_line(err)}")
                continue
            written.append(write_atomic(path, with_png_dpi(data) if path.suffix == ".png" else data))
    return written


def _run_blocking(coro):
    """Run a coroutine to completion, also from code already inside an event loop (a notebook)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def partial_path(path: Path) -> Path:
    """Where `path` is written before its rename: a dot file with the same extension."""
    return path.with_name(f".{path.stem}.partial{path.suffix}")


def with_png_dpi(png: bytes, dpi: int = PNG_DPI) -> bytes:
    """The PNG with its resolution stored (pHYs chunk, pixels per metre) so viewers and TeX size it right;
    kaleido writes none. Pillow re-encodes it losslessly."""
    from PIL import Image

    out = io.BytesIO()
    with Image.open(io.BytesIO(png)) as im:
        im.save(out, format="PNG", dpi=(dpi, dpi))
    return out.getvalue()


def write_captions(specs: Sequence[FigureSpec], out_dir: Path) -> Path:
    """captions.md: each figure's caption lines (the counts and notes kept out of its legend and title)."""
    lines = ["# Figure captions", ""]
    for spec in specs:
        fig = paper_style(spec.figure, spec.width, spec.height_in, keep_title=spec.keep_title)
        notes = captions(fig)
        if notes:
            lines += [f"- **{spec.name}**: " + "; ".join(notes)]
    return write_atomic(out_dir / "captions.md", ("\n".join(lines) + "\n").encode("utf-8"))


def write_html(specs: Sequence[FigureSpec], out_dir: Path) -> list[Path]:
    """Paper-styled interactive HTML files sharing one plotly.min.js in out_dir (works offline)."""
    from plotly.offline import get_plotlyjs

    bundle = out_dir / "plotly.min.js"  # written whole here: plotly would write it in place
    if not bundle.exists():
        write_atomic(bundle, get_plotlyjs().encode("utf-8"))
    paths = []
    for spec in specs:
        fig = paper_style(spec.figure, spec.width, spec.height_in, keep_title=spec.keep_title)
        paths.append(
            write_atomic(
                out_dir / f"{spec.name}.html", lambda p: fig.write_html(p, include_plotlyjs="directory")
            )
        )
    return paths
