"""`tokengrad dashboard [RUNS_ROOT] [--port N] [--host ADDR]`: serve the Streamlit dashboard over a runs
folder.

    tokengrad dashboard                      # the runs below the current folder (none: the shipped demo run)
    tokengrad dashboard runs/ --port 8600    # every run directory (holding meta.json) under runs/

The server binds 127.0.0.1 unless --host says otherwise: run folders hold prompts and completions, so
exposing them on a network interface is an explicit choice. For the same reason the "Runs folder" box of the
app only accepts folders inside the served root, and run folders that are symlinks leading out of it are
skipped; `--allow-any-folder` lifts the first limit. No torch is imported here or in the app.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tokengrad.cli.signals import Terminated, sigterm_unwinds
from tokengrad.read import remote
from tokengrad.read.served_root import ALLOW_ANY_FLAG, NO_RUNS_FLAG, PACKAGE_PARENT, serve_plan

DEFAULT_PORT = 8501
DEFAULT_HOST = "127.0.0.1"
# Streamlit runs every script run on a new thread, and glibc gives threads malloc arenas of their own (up to
# 8 per core) whose freed pages it rarely hands back: Live refresh grew the server by ~7 MB a refresh until
# every arena was full (benchmarks/bench_live_refresh.py). Two arenas keep it flat after warm-up.
MALLOC_ARENA = "2"


def app_path() -> Path:
    """The Streamlit entrypoint of `tokengrad.app` (editable install or not), located by path: Streamlit
    runs a script file, not a module."""
    path = PACKAGE_PARENT / "tokengrad" / "app" / "streamlit_app.py"
    if not path.is_file():
        raise FileNotFoundError(f"the dashboard app is missing: {path} (reinstall tokengrad)")
    return path


def _port(text: str) -> int:
    """argparse type: a TCP port number."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is out of range 1-65535")
    return port


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tokengrad dashboard", description="Serve the tokengrad dashboard.")
    p.add_argument(
        "root",
        nargs="?",
        default=None,
        help="folder of run directories, or one run directory (default: the current folder; where it "
        "holds no runs, the demo run shipped with tokengrad and how to record one)",
    )
    p.add_argument("--port", type=_port, default=DEFAULT_PORT, help=f"port, 1-65535 (default {DEFAULT_PORT})")
    p.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"address to bind (default {DEFAULT_HOST}; 0.0.0.0 exposes the dashboard to the network)",
    )
    p.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="another host name the dashboard is reached by (e.g. behind a proxy); repeatable. Requests "
        "naming any other host are refused (DNS rebinding)",
    )
    p.add_argument(
        ALLOW_ANY_FLAG,
        action="store_true",
        help="let the app's 'Runs folder' box open any folder the server can read (default: only folders "
        "inside the served root)",
    )
    return p


def allowed_hosts(host: str, extra: list[str] | None = None) -> list[str]:
    """Host names the server answers to (its WebSocket refuses any other Host header, which stops a DNS
    rebinding page from reaching a server bound to 127.0.0.1): the bound address, the loopback names,
    this machine's names when bound to every interface, and the --allowed-host names."""
    names = [host, "127.0.0.1", "localhost", "::1"]
    if host in ("0.0.0.0", "::", ""):
        names += [socket.gethostname(), socket.getfqdn()]
    return list(dict.fromkeys(n for n in names + list(extra or []) if n))


def build_command(
    root: Path | str,
    host: str,
    port: int,
    allow_any: bool = False,
    extra_hosts: list[str] | None = None,
    *,
    no_runs_in: Path | None = None,
) -> list[str]:
    """The `python -m streamlit run ...` command line; everything after `--` goes to the app (`no_runs_in`:
    the folder without runs that the served demo stands in for)."""
    hosts = [arg for name in allowed_hosts(host, extra_hosts) for arg in ("--server.allowedHosts", name)]
    return (
        [
            sys.executable,
            "-m",
            "streamlit",
            "run",
            str(app_path()),
            "--server.address",
            host,
            "--server.port",
            str(port),
            "--server.headless",
            "true",
            "--browser.gatherUsageStats",
            "false",
            "--client.toolbarMode",
            "minimal",
            *hosts,
            "--",
            "--root",
            str(root),
        ]
        + [ALLOW_ANY_FLAG] * allow_any
        + ([NO_RUNS_FLAG, str(no_runs_in)] if no_runs_in else [])
    )


def server_env() -> dict[str, str]:
    """The environment of the server: the package folder first on PYTHONPATH, so the app imports this
    tokengrad even when it runs from a checkout that is not installed, and the allocators set up for a
    long-running server (unless the caller set them): glibc's malloc kept to MALLOC_ARENA arenas, pyarrow
    on the system allocator."""
    env = dict(os.environ)
    env.setdefault("MALLOC_ARENA_MAX", MALLOC_ARENA)
    # pyarrow's default pool (mimalloc) keeps each thread's freed pages; the system pool is glibc's malloc,
    # which the app trims after every script run (tokengrad.app.data.release_freed_memory)
    env.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    parts = [str(PACKAGE_PARENT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def cli_dashboard(argv: list[str]) -> int:
    """Entry point of `tokengrad dashboard`; returns the server's exit status."""
    args = build_parser().parse_args(argv)
    in_bucket = remote.is_url(args.root or "")
    if in_bucket:  # a first copy before the server starts (a bad URL is one line here, not in the page),
        remote.local_copy(args.root, skip=("tokens",))  # without the largest table: the app copies it
    root, no_runs_in = serve_plan(args.root)
    if not root.exists():
        print(
            f"tokengrad dashboard: runs root {root} does not exist; pass a folder of runs "
            "(e.g. `tokengrad dashboard runs/`) or create sample runs with scripts/make_sample_runs.py",
            file=sys.stderr,
        )
        return 2
    if no_runs_in:
        print(f"tokengrad dashboard: no runs under {no_runs_in}; opening the demo run shipped with tokengrad")
    shown = f"{args.root} (a local copy in {root})" if in_bucket else root
    print(f"tokengrad dashboard: serving {shown} at http://{args.host}:{args.port}", flush=True)
    try:
        command = build_command(
            args.root if in_bucket else root,
            args.host,
            args.port,
            args.allow_any_folder,
            args.allowed_host,
            no_runs_in=no_runs_in,
        )
        # SIGTERM unwinds like Ctrl-C: subprocess.call then stops the server instead of orphaning it
        with sigterm_unwinds():
            return subprocess.call(command, env=server_env())
    except Terminated:
        return 143
    except KeyboardInterrupt:  # Ctrl-C stops the server; that is the normal way to leave
        return 0


def free_port(host: str = DEFAULT_HOST) -> int:
    """A TCP port that nothing listens on now (for serving the dashboard in tests and scripts)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """Wait until the dashboard served by `proc` at `url` answers Streamlit's health check; an exit of
    `proc` or the timeout is an error."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dashboard exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.read().strip() == b"ok":
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"dashboard not healthy at {url} after {timeout} s")


@contextlib.contextmanager
def serving(root: Path | str, port: int | None = None, timeout: float = 60.0, cwd: Path | None = None):
    """`tokengrad dashboard ROOT` in a child process on 127.0.0.1 (tests, screenshots): yields its URL once
    healthy and stops it (the CLI and the streamlit child it starts, one process group) on exit."""
    port = port or free_port()
    cmd = [sys.executable, "-m", "tokengrad.cli", "dashboard", str(root), "--port", str(port)]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(PACKAGE_PARENT), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        url = f"http://{DEFAULT_HOST}:{port}"
        wait_healthy(url, proc, timeout)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
