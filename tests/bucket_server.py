"""An S3-compatible server for the tests of runs in a bucket: moto's threaded server on 127.0.0.1.

    def test_x(bucket): ...      # bucket: "s3://NAME", a fresh empty bucket (tests/conftest.py imports these)

`bucket` points the standard AWS variables at the server (AWS_ENDPOINT_URL, test credentials) and
TOKENGRAD_CACHE at the test's own folder, so staging folders and local copies never leave tmp_path.
"""

from __future__ import annotations

import itertools
import logging
import os

import pytest

_names = itertools.count()
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="session")
def s3_server():
    """The server's endpoint URL (one server for the whole test run, a bucket per test)."""
    moto_server = pytest.importorskip("moto.server", reason="moto[server] is in the dev extra")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def point_at(monkeypatch, endpoint: str, cache) -> None:
    """The environment a user of an S3-compatible server sets, plus a private cache folder."""
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {**CREDENTIALS, "AWS_ENDPOINT_URL": endpoint, "TOKENGRAD_CACHE": str(cache)}.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def bucket(s3_server, monkeypatch, tmp_path):
    """A new empty bucket on the server: its URL, s3://NAME."""
    boto3 = pytest.importorskip("boto3")
    point_at(monkeypatch, s3_server, tmp_path / "cache")
    name = f"tgruns-{os.getpid()}-{next(_names)}"
    boto3.client("s3").create_bucket(Bucket=name)
    return f"s3://{name}"
