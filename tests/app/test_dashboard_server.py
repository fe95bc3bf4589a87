"""The `tokengrad dashboard` server process: it answers only to the hosts it serves (DNS rebinding), and
SIGTERM stops the Streamlit server it started instead of leaving it serving."""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tokengrad.cli import dashboard

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.subprocess


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def handshake(port: int, host: str, origin: str) -> str:
    """The status line of a WebSocket upgrade to the app's stream with these Host and Origin headers."""
    key = base64.b64encode(os.urandom(16)).decode()
    request = (
        f"GET /_stcore/stream HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nOrigin: {origin}\r\n"
        "Sec-WebSocket-Protocol: streamlit\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request.encode())
        return s.recv(4096).decode(errors="replace").split("\r\n")[0]


def serving(port: int) -> bool:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2).read() == b"ok"
    except OSError:
        return False


@pytest.fixture
def server(tmp_path):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.environ["PYTHONPATH"]}
    cmd = [sys.executable, "-m", "tokengrad.cli", "dashboard", str(tmp_path), "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not serving(port):
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read()[-2000:]
        time.sleep(0.5)
    yield proc, port
    if proc.poll() is None:  # SIGTERM: the command stops its Streamlit server (a SIGKILL would orphan it)
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert not serving(port), "the dashboard command left its Streamlit server running"


def test_only_the_served_hosts_get_a_websocket(server):
    _, port = server
    assert " 101 " in handshake(port, f"127.0.0.1:{port}", f"http://127.0.0.1:{port}")
    assert " 101 " in handshake(port, f"localhost:{port}", f"http://localhost:{port}")
    rebound = handshake(port, f"attacker.example:{port}", f"http://attacker.example:{port}")
    assert " 101 " not in rebound and rebound.startswith("HTTP/1.1 4"), rebound


def test_sigterm_stops_the_streamlit_server(server):
    proc, port = server
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143
    time.sleep(1)
    assert not serving(port)  # the child went with it


def test_allowed_hosts_cover_the_bound_address_and_the_named_ones():
    assert dashboard.allowed_hosts("127.0.0.1") == ["127.0.0.1", "localhost", "::1"]
    wide = dashboard.allowed_hosts("0.0.0.0", ["dash.example.com"])
    assert socket.gethostname() in wide and wide[-1] == "dash.example.com"
    cmd = dashboard.build_command(Path("runs"), "127.0.0.1", 8501, extra_hosts=["proxy.local"])
    given = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--server.allowedHosts"]
    assert given == ["127.0.0.1", "localhost", "::1", "proxy.local"]
