"""The claim on a rank of a run in a bucket: the object RUN/ranks/rankRRR.lock, created only if absent.

Object stores have no rename and no hard link, so the local claim (tokengrad.record.store.claim) cannot guard
a run two machines record into one bucket. Here the claim is one PUT with `If-None-Match: *`, which S3 (and
S3-compatible servers that implement conditional writes) accept for exactly one writer and refuse with 412
for every other. It holds the same JSON as a local claim (tokengrad.read.claim_file: pid, host, start time,
boot id), so `tokengrad watch` and the dashboard read a bucket run's state the same way.

A claim whose process is gone on this host (a killed run being resumed) is broken: deleted with
`If-Match: ETAG` of the claim that was judged, so two processes breaking it at once cannot delete a fresh
claim, then taken again. A claim of another host is refused with how to break it. Stores without
conditional writes (gs://, az:// through fsspec here, or an S3 server answering 501) get the claim written
unconditionally and one warning that a second recorder on another machine would not be refused.
"""

from __future__ import annotations

import json
import warnings

from tokengrad.read import claim_file
from tokengrad.read.remote import Url, describe
from tokengrad.record.store.claim import RunClaimedError

ATTEMPTS = 5  # stale claims broken before giving up
UNGUARDED = (
    "{url}: this store offers no conditional write, so the claim is written unconditionally: a second "
    "recorder of this rank on another machine would not be refused (docs/buckets.md)"
)


def lock_rel(rank: int) -> str:
    return claim_file.lock_path("", rank).as_posix()


class BucketClaim:
    """The claim this process holds on one rank of a run in a bucket; `release()` deletes it."""

    def __init__(self, url: Url, release):
        self.url = url
        self._release = release

    def release(self) -> None:
        """Delete the claim (idempotent; a store that cannot be reached leaves it, the next opener on this
        host breaks it)."""
        release, self._release = self._release, None
        if release is not None:
            try:
                release()
            except Exception as err:  # noqa: BLE001 - closing never fails on the network
                warnings.warn(f"tokengrad: could not remove the claim {err}", RuntimeWarning, stacklevel=2)


def take(url: Url, rank: int, fs) -> BucketClaim:
    """Claim rank `rank` of the run at `url` (RunClaimedError while another process holds it)."""
    body = json.dumps(claim_file.this_process()).encode()
    lock = url.child(lock_rel(rank))
    client = _s3_client() if url.scheme == "s3" else None
    if client is None:
        return _unguarded(lock, body, fs)
    for _ in range(ATTEMPTS):
        try:
            put = client.put_object(Bucket=lock.bucket, Key=lock.key, Body=body, IfNoneMatch="*")
            etag = put["ETag"]
            return BucketClaim(
                lock, lambda: client.delete_object(Bucket=lock.bucket, Key=lock.key, IfMatch=etag)
            )
        except Exception as err:  # noqa: BLE001 - botocore's ClientError, read by its code below
            code = _code(err)
            if code == "NotImplemented":
                return _unguarded(lock, body, fs)
            if code not in ("PreconditionFailed", "ConditionalRequestConflict"):
                raise describe(lock, err) from None
        _break_if_stale(client, lock)
    raise RunClaimedError(
        f"{lock}: the claim changed hands {ATTEMPTS} times while this process tried to take it"
    )


def _break_if_stale(client, lock: Url) -> None:
    """Delete the claim at `lock` if its process is gone (module doc); RunClaimedError while it holds."""
    try:
        got = client.get_object(Bucket=lock.bucket, Key=lock.key)
        data = got["Body"].read(claim_file.MAX_BYTES + 1)
    except Exception as err:  # noqa: BLE001
        if _code(err) == "NoSuchKey":  # released meanwhile
            return
        raise describe(lock, err) from None
    holder = claim_file.parse(data)
    if isinstance(holder, str):
        raise RunClaimedError(
            f"{lock} cannot be claimed: its claim object {holder}; if no process records this run, "
            "delete that object to break the claim"
        )
    verdict = claim_file.verdict(holder)
    if verdict.state != "gone":
        raise RunClaimedError(
            f"{lock} is held by pid {holder.pid} on host {holder.host}: that "
            "process records this rank; wait for it to end. If it is gone (e.g. it ran on another host), "
            "delete that object to break the claim"
        )
    try:
        client.delete_object(Bucket=lock.bucket, Key=lock.key, IfMatch=got["ETag"])
    except Exception as err:  # noqa: BLE001 - another breaker was first: the next PUT decides
        if _code(err) not in ("PreconditionFailed", "NoSuchKey"):
            raise describe(lock, err) from None
        return
    warnings.warn(
        f"tokengrad: broke the stale claim {lock} of pid {holder.pid}: {verdict.why}",
        RuntimeWarning,
        stacklevel=3,
    )


def _unguarded(lock: Url, body: bytes, fs) -> BucketClaim:
    warnings.warn(UNGUARDED.format(url=lock), RuntimeWarning, stacklevel=3)
    try:
        with fs.open_output_stream(lock.path) as out:
            out.write(body)
    except OSError as err:
        raise describe(lock, err) from None
    return BucketClaim(lock, lambda: fs.delete_file(lock.path))


def _s3_client():
    """A boto3 S3 client from the standard AWS settings (AWS_ENDPOINT_URL included), or None without
    boto3 (the `cloud` extra), which makes the claim unguarded."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        return None
    config = Config(connect_timeout=5, read_timeout=30, retries={"max_attempts": 2, "mode": "standard"})
    return boto3.client("s3", config=config)


def _code(err: BaseException) -> str | None:
    response = getattr(err, "response", None)
    return response.get("Error", {}).get("Code") if isinstance(response, dict) else None
