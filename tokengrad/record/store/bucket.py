"""A run recorded into a bucket: `Recorder("s3://bucket/prefix/run")`.

The writer commits into a local *staging folder*, `$TOKENGRAD_CACHE/staging/SCHEME/BUCKET/PREFIX` (default
~/.cache/tokengrad/staging/...), exactly as into a local run directory, and a background uploader
(tokengrad.record.store.upload) copies each committed file to the bucket, so the training thread never waits
on the network. Opening checks the bucket (one line naming the URL and the cause when it is missing, the
credentials are refused or the endpoint cannot be reached), claims the rank in the bucket
(tokengrad.record.store.bucket_claim), and brings into the staging folder the rank's files and meta.json that
the bucket has and the folder lacks: a run resumed on another machine continues from the bucket, and one
resumed on the same machine uploads what a kill left local. Closing waits up to `Output(upload_wait=...)`
seconds for the upload and names what stayed local and where.
"""

from __future__ import annotations

import os
import time
import warnings

from tokengrad import schema
from tokengrad.read import remote
from tokengrad.record.store import bucket_claim
from tokengrad.record.store.upload import Uploader, owned

__all__ = ["BucketRun"]


class BucketRun:
    """The bucket side of one rank's recording: claim, resume, uploader (module doc)."""

    def __init__(self, url: remote.Url):
        self.url = url
        self.staging = remote.cache_path(url, "staging")  # as claim.local_dir names it
        self.uploader: Uploader | None = None
        self.claim: bucket_claim.BucketClaim | None = None
        self._closing_since: float | None = None

    @classmethod
    def at(cls, target: str | os.PathLike) -> "BucketRun | None":
        """The bucket run `target` names, None for a local path (a RemoteError for a bad URL)."""
        url = remote.parse_url(target)
        return None if url is None else cls(url)

    def open(self, rank: int) -> None:
        fs = remote.filesystem(self.url)
        present = remote.listing(fs, self.url)  # a missing bucket, refused credentials: raised here
        self.claim = bucket_claim.take(self.url, rank, fs)
        try:
            for rel, info in sorted(present.items()):
                wanted = owned(rel, rank) or rel == schema.META_FILE
                if wanted and not (self.staging / rel).exists():
                    remote.download(fs, self.url, rel, info, self.staging)
            self.uploader = Uploader(fs, self.url, self.staging, rank, present)
        except BaseException as err:
            self.claim.release()
            if isinstance(err, (OSError, ValueError)) and not isinstance(err, remote.RemoteError):
                raise remote.describe(self.url, err) from None
            raise

    def drain(self, timeout: float) -> int:
        """Wait (at most `timeout` s) for what is committed so far to be uploaded; how many files are not."""
        self._closing_since = time.monotonic()
        return self.uploader.drain(timeout) if self.uploader else 0

    def status(self, not_uploaded: int) -> dict:
        """What the rank status file says of the upload."""
        return {"url": str(self.url), "files_not_uploaded": not_uploaded, "staging": str(self.staging)}

    def close(self, timeout: float) -> int:
        """Upload the last files (the status, meta.json) within what is left of `timeout` since drain(),
        stop the uploader, release the claim; warns with what stayed local. Returns that count."""
        if self.uploader is None:
            return 0
        spent = time.monotonic() - (self._closing_since or time.monotonic())
        left = self.uploader.drain(max(0.0, timeout - spent))
        self.uploader.stop()
        if left:
            warnings.warn(
                f"tokengrad: {left} files of {self.url} were not uploaded ({self.uploader.last_error}); "
                f"they stay in {self.staging} and are uploaded when a Recorder opens {self.url} on this "
                "machine again",
                RuntimeWarning,
                stacklevel=3,
            )
        self.uploader = None
        self.claim.release()
        return left
