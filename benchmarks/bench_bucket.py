"""A run that stands for 1 B token rows, read from local disk and from an S3-compatible server on 127.0.0.1.

    python benchmarks/bench_bucket.py              # 60 steps x 16.8 M tokens (a 7B run at cluster batch size)
    python benchmarks/bench_bucket.py --smoke      # tiny run: every figure printed, none meaningful

The run is stored as a budgeted run stores it (bench_scale.write_scaled_run): the exact per-step aggregates
(steps, layers, buckets, prob_bins, vocab) plus K = 65,536 token rows per step. It is uploaded to moto's
S3-compatible server (moto[server], the dev extra) started on 127.0.0.1, then timed, each cold:

* from local disk: the dashboard's first page (Overview: steps, layers, evals and their figures), the two
  word-cloud queries, and `tokengrad doctor` (every detector);
* from the bucket: the first page opened on `s3://...` with an empty cache (the local copy downloaded, then
  read), the same again with the copy kept (a listing, nothing changed), and the doctor.

Targets: first page <= 2 s and word cloud <= 1 s from local disk, first page <= 5 s from the bucket, doctor
<= 10 s. Nothing is asserted: the figures depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "benchmarks", ROOT / "tests"):
    if str(path) not in sys.path:  # run as a script from a checkout
        sys.path.insert(0, str(path))

from bench_scale import overview, timed, wordcloud, write_scaled_run  # noqa: E402
from measure import SMOKE_HELP, line, use_smoke, verdict  # noqa: E402

TARGETS_S = {"local": 2.0, "wordcloud": 1.0, "bucket": 5.0, "doctor": 10.0}
SMOKE_ARGS = {"steps": 4, "tokens_per_step": 20_000, "budget": 2048}


def serve_bucket(cache: Path) -> tuple[object, str]:
    """moto's server on 127.0.0.1, the AWS variables pointed at it, a bucket: (server, "s3://NAME")."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL=f"http://{host}:{port}",
        TOKENGRAD_CACHE=str(cache),
    )
    boto3.client("s3").create_bucket(Bucket="tgbench")
    return server, "s3://tgbench"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--tokens-per-step", type=int, default=2**24)  # 60 x 16.8 M = 1.01 B token rows
    ap.add_argument("--budget", type=int, default=65536)
    ap.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = ap.parse_args(argv)
    if use_smoke(args.smoke):
        vars(args).update(SMOKE_ARGS)
    import pyarrow.fs as pafs

    from tokengrad.doctor.engine import diagnose
    from tokengrad.read.remote import filesystem, parse_url

    work = Path(tempfile.mkdtemp())
    run_dir = work / "runs" / "scale1b"
    write_scaled_run(run_dir, args.steps, args.tokens_per_step, args.budget)
    size = sum(f.stat().st_size for f in run_dir.rglob("*.parquet")) / 2**20
    server, bucket = serve_bucket(work / "cache")
    url = f"{bucket}/runs/scale1b"
    t_up, _ = timed(
        lambda: pafs.copy_files(
            str(run_dir), parse_url(url).path, destination_filesystem=filesystem(parse_url(url))
        )
    )
    total = args.steps * args.tokens_per_step
    print(
        f"\nrun: {args.steps} steps x {args.tokens_per_step:,} tokens = {total / 1e9:.2f} B token rows, "
        "stored "
        f"as aggregates + {args.budget:,} rows per step = {args.steps * args.budget / 1e6:.1f} M rows, "
        f"{size:.0f} MB (uploaded to {url} in {t_up:.1f} s)"
    )
    try:
        t_local, _ = timed(lambda: overview(run_dir))
        t_wc, _ = timed(lambda: wordcloud(run_dir))
        t_doc_local, _ = timed(lambda: diagnose(run_dir))
        t_first, _ = timed(lambda: overview(url))  # empty cache: the copy is downloaded
        t_again, _ = timed(lambda: overview(url))  # the copy kept: one listing
        t_doc, _ = timed(lambda: diagnose(url))
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    line("query (cold)", "seconds", "target")
    line("first page, local disk", f"{t_local:.2f}", "<= 2", verdict(t_local, TARGETS_S["local"]))
    line("word cloud, local disk", f"{t_wc:.2f}", "<= 1", verdict(t_wc, TARGETS_S["wordcloud"]))
    line("doctor, local disk", f"{t_doc_local:.2f}", "<= 10", verdict(t_doc_local, TARGETS_S["doctor"]))
    line("first page, bucket, empty cache", f"{t_first:.2f}", "<= 5", verdict(t_first, TARGETS_S["bucket"]))
    line("first page, bucket, copy kept", f"{t_again:.2f}", "<= 5", verdict(t_again, TARGETS_S["bucket"]))
    line("doctor, bucket", f"{t_doc:.2f}", "<= 10", verdict(t_doc, TARGETS_S["doctor"]))
    line("ratio first page bucket / local", f"{t_first / t_local:.2f}")


if __name__ == "__main__":
    main()
