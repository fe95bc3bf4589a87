"""Runs in a bucket: URLs (s3://, gs://, az://), the filesystem that reaches them, and a local copy to read.

A run URL names a folder in an object store: `s3://bucket/prefix/run`. It is opened through pyarrow.fs
(`S3FileSystem`, built in) or, for gs:// and az://, the fsspec filesystem installed for the scheme (gcsfs,
adlfs). Credentials and endpoint come from the standard variables: AWS_ACCESS_KEY_ID /
AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, AWS_PROFILE and ~/.aws (the AWS SDK's chain), AWS_REGION or
AWS_DEFAULT_REGION, and AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL for an S3-compatible server.

Readers read a *local copy*: `local_copy(url)` lists the prefix and downloads what changed since the last
call (a file's size and modification time) into the cache, `$TOKENGRAD_CACHE/remote/SCHEME/BUCKET/PREFIX`
(default ~/.cache/tokengrad), each file written whole and renamed into place, so every reader (pandas,
DuckDB, the dashboard) reads ordinary files and DuckDB needs no network extension. Files gone from the bucket
are removed from the copy. Anything that goes wrong is a `RemoteError` of one line naming the URL and the
cause (a missing bucket, refused credentials, an unreachable endpoint).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

SCHEMES = {"s3": "s3", "gs": "gs", "gcs": "gs", "az": "az", "abfs": "az"}  # as typed -> the store
FSSPEC_PACKAGE = {"gs": "gcsfs", "az": "adlfs"}
CACHE_ENV = "TOKENGRAD_CACHE"
# A path typed as an URL, or what pathlib made of one (`Path("s3://b/k")` is "s3:/b/k").
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):/(/?)(.*)$")
# Words of the store's error -> the cause named to the user (pyarrow / AWS SDK error names)
CAUSES = {
    "NO_SUCH_BUCKET": "the bucket does not exist",
    "NoSuchBucket": "the bucket does not exist",
    "ACCESS_DENIED": "access denied: the credentials may not read or write there",
    "INVALID_ACCESS_KEY_ID": "the credentials were refused (unknown access key)",
    "SIGNATURE_DOES_NOT_MATCH": "the credentials were refused (wrong secret key)",
    "NETWORK_CONNECTION": "the endpoint cannot be reached",
    "Could not resolve host": "the endpoint's host name does not resolve",
    "Could not connect": "the endpoint cannot be reached",
    "Timeout": "the endpoint did not answer in time",
}


class RemoteError(OSError):
    """A run URL that cannot be used: bad URL, missing bucket, refused credentials, unreachable store."""


@dataclass(frozen=True)
class Url:
    """A parsed run URL: the store (`s3`, `gs`, `az`), the bucket and the key prefix (no slashes around)."""

    scheme: str
    bucket: str
    key: str

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.key}".rstrip("/")

    @property
    def path(self) -> str:
        """The folder as the filesystem names it: bucket/key."""
        return f"{self.bucket}/{self.key}".rstrip("/")

    def child(self, rel: str) -> "Url":
        return Url(self.scheme, self.bucket, f"{self.key}/{rel}".strip("/"))


def parse_url(target: str | os.PathLike) -> Url | None:
    """The URL `target` names, or None for a local path. An unknown scheme (`ftp://...`) or an URL without
    a bucket is a RemoteError: never a local folder named `s3:`."""
    text = os.fspath(target)
    m = _URL.match(text)
    if m is None or len(m.group(1)) == 1:  # a Windows drive letter (C:/...) is a local path
        return None
    scheme, rest = m.group(1).lower(), m.group(3)
    if scheme not in SCHEMES:
        raise RemoteError(f"{text}: unknown URL scheme {scheme!r}; runs can live in {sorted(set(SCHEMES))}")
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise RemoteError(f"{text}: no bucket named; write {scheme}://BUCKET/PREFIX")
    return Url(SCHEMES[scheme], bucket, key.strip("/"))


def is_url(target) -> bool:
    return isinstance(target, (str, os.PathLike)) and parse_url(target) is not None


def cache_root() -> Path:
    """Where local copies and staging folders live: $TOKENGRAD_CACHE, else $XDG_CACHE_HOME/tokengrad."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "tokengrad"


def cache_path(url: Url, kind: str) -> Path:
    """The local folder of `url` of one kind: "remote" (copies readers read) or "staging" (the writer's)."""
    return cache_root() / kind / url.scheme / url.bucket / url.key


def describe(url: Url | str, err: BaseException) -> RemoteError:
    """One line naming the URL and the cause of a store error."""
    text = " ".join(str(err).split())
    cause = next((why for word, why in CAUSES.items() if word.lower() in text.lower()), None)
    detail = text if len(text) < 160 else text[:157] + "..."
    return RemoteError(f"{url}: {cause} ({detail})" if cause else f"{url}: {detail}")


def filesystem(url: Url) -> pafs.FileSystem:
    """The filesystem that reaches `url`'s store, configured from the environment (module docstring)."""
    if url.scheme == "s3":
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        return pafs.S3FileSystem(
            endpoint_override=endpoint or None,
            region=region or None,
            connect_timeout=5,
            request_timeout=30,
            retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=2),  # the uploader retries on its own
        )
    try:
        import fsspec

        return pafs.PyFileSystem(pafs.FSSpecHandler(fsspec.filesystem(url.scheme)))
    except ImportError:
        raise RemoteError(
            f"{url}: reading {url.scheme}:// needs the {FSSPEC_PACKAGE[url.scheme]} package "
            f"(pip install {FSSPEC_PACKAGE[url.scheme]})"
        ) from None


def listing(fs: pafs.FileSystem, url: Url) -> dict[str, pafs.FileInfo]:
    """Every file under `url`, by its path relative to it (dot files left out). Checks the bucket first,
    so that a missing bucket is named as such rather than read as an empty folder."""
    try:
        if fs.get_file_info(url.bucket).type == pafs.FileType.NotFound:
            raise RemoteError(f"{url}: the bucket {url.bucket!r} does not exist")
        infos = fs.get_file_info(pafs.FileSelector(url.path, recursive=True, allow_not_found=True))
    except RemoteError:
        raise
    except (OSError, ValueError) as err:
        raise describe(url, err) from None
    out = {}
    for info in infos:
        rel = info.path[len(url.path) :].strip("/")
        if info.type == pafs.FileType.File and not any(part.startswith(".") for part in rel.split("/")):
            out[rel] = info
    return out


def _same(local: Path, info: pafs.FileInfo) -> bool:
    try:
        st = local.stat()
    except OSError:
        return False
    return st.st_size == info.size and (info.mtime_ns is None or st.st_mtime_ns == info.mtime_ns)


def download(fs: pafs.FileSystem, url: Url, rel: str, info: pafs.FileInfo, dest: Path) -> None:
    """One file of `url` to `dest/rel`, whole (a temporary name, then a rename), with the store's mtime."""
    target = dest / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{os.urandom(4).hex()}.part")  # copies may overlap
    try:
        with fs.open_input_stream(url.child(rel).path) as src, open(tmp, "wb") as out:
            while chunk := src.read(1 << 22):
                out.write(chunk)
        if info.mtime_ns is not None:
            os.utime(tmp, ns=(info.mtime_ns, info.mtime_ns))
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def mirror(url: Url, dest: Path, keep=None, prune: bool = True) -> int:
    """Make `dest` hold what `url` holds: download new and changed files (those `keep(rel)` accepts, all by
    default) and, with `prune`, remove files of the copy the bucket no longer has. Returns files fetched."""
    fs = filesystem(url)
    found = listing(fs, url)
    fetched = 0
    try:
        for rel, info in sorted(found.items()):
            if (keep is None or keep(rel)) and not _same(dest / rel, info):
                download(fs, url, rel, info, dest)
                fetched += 1
    except (OSError, ValueError) as err:
        raise describe(url, err) from None
    if prune and dest.is_dir():
        for p in dest.rglob("*"):
            rel = p.relative_to(dest).as_posix()
            if p.is_file() and not p.name.startswith(".") and rel not in found:
                p.unlink(missing_ok=True)
    return fetched


def table_of(rel: str) -> str | None:
    """The table a file of a run (or of a folder of runs) belongs to: TABLE/rankRRR/FILE; None for others
    (meta.json, the rank status files)."""
    parts = rel.split("/")
    return parts[-3] if len(parts) >= 3 and parts[-2].startswith("rank") else None


def local_copy(target: str | os.PathLike, tables=None, skip=()) -> Path:
    """The folder to read for `target`: a local path as it is, an URL's local copy brought up to date:
    meta.json, the rank files and the files of `tables` (every table when None) except those of `skip`.
    A reader fetches a table when it first reads it (tokengrad.read.runs), so a page that needs only
    the steps never waits for the tokens."""
    url = parse_url(target)
    if url is None:
        return Path(target)
    dest = cache_path(url, "remote")

    def keep(rel: str) -> bool:
        table = table_of(rel)
        return table is None or (table not in skip and (tables is None or table in tables))

    mirror(url, dest, keep)
    dest.mkdir(parents=True, exist_ok=True)  # an empty prefix is an empty folder of runs
    return dest
