"""Background writer throughput: token rows/s of RunWriter committing tokens_table bundles.

    python benchmarks/bench_writer.py            # 400 steps of 8x256 tokens
    python benchmarks/bench_writer.py --quick    # 60 steps
    python benchmarks/bench_writer.py --smoke    # 3 steps of 8x16 tokens: runs, prints every figure

Target: >= 1 M token rows/s (also run as the "writer" section of bench_recorder.py).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "benchmarks"):  # run as a script from a checkout
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from measure import SMOKE_HELP, line, use_smoke, verdict  # noqa: E402

from tokengrad.record.store.rows import TOKEN_VALUE_COLUMNS, CapturedBatch, TokenDecoder, tokens_table  # noqa: E402
from tokengrad.record.store.writer import RunWriter  # noqa: E402

N, T, G = 8, 256, 4  # sequences, tokens per sequence, group size (as bench_recorder.py)
V = 49_152  # SmolLM2 vocabulary
TARGET_ROWS_S = 1e6


def use_smoke_sizes() -> None:
    """8 x 16 tokens a step (--smoke)."""
    global T
    T = 16


def _synthetic_batches(k: int, vocab: int) -> list[CapturedBatch]:
    rng = np.random.default_rng(0)
    out = []
    for _ in range(k):
        values = {c: rng.standard_normal((N, T), dtype=np.float32) for c in TOKEN_VALUE_COLUMNS}
        out.append(
            CapturedBatch(
                pass_id=0,
                update_id=0,
                token_ids=rng.integers(0, vocab, (N, T)),
                mask=np.ones((N, T), bool),
                in_loss=np.ones((N, T), bool),
                sample_ids=np.arange(N),
                group_ids=np.arange(N) // G,
                values=values,
                clipped=rng.random((N, T)) < 0.1,
            )
        )
    return out


def bench_writer(steps: int, tmp: Path) -> dict:
    """Token rows/s of RunWriter committing tokens_table bundles of 8x256 captured tokens per step."""
    from tokengrad.train.models import make_tiny_tokenizer

    out = {}
    for label, decoder, vocab in (
        ("no tokenizer", TokenDecoder(None), V),
        ("byte tokenizer", TokenDecoder(make_tiny_tokenizer()), 256),
    ):
        batches = _synthetic_batches(4, vocab)
        writer = RunWriter(tmp / f"writer-{vocab}", compact_every=64)
        t = time.perf_counter()
        for s in range(steps):
            writer.submit({"tokens": lambda s=s: tokens_table(s, 0, [batches[s % 4]], decoder)})
        writer.flush()
        elapsed = time.perf_counter() - t
        t = time.perf_counter()
        writer.close()
        rows = writer.rows_written.get("tokens", 0)
        out[label] = {"rows": rows, "rows_s": rows / elapsed, "close_s": time.perf_counter() - t}
    t = time.perf_counter()
    for s in range(steps):
        tokens_table(s, 0, [batches[s % 4]], TokenDecoder(None))
    out["build only"] = {"rows": steps * N * T, "rows_s": steps * N * T / (time.perf_counter() - t)}
    return out


def report_writer(r: dict) -> None:
    print(f"\nbackground writer, tokens table, {N}x{T} tokens per step")
    for label in ("no tokenizer", "byte tokenizer"):
        x = r[label]
        line(
            f"{label}: {x['rows']:,} rows committed",
            f"{x['rows_s'] / 1e6:.2f} M rows/s",
            f">= {TARGET_ROWS_S / 1e6:.0f} M/s",
            verdict(x["rows_s"], TARGET_ROWS_S, True),
        )
        line("  close (final compaction)", f"{x['close_s'] * 1e3:.0f} ms")
    line("tokens_table build only (no Parquet)", f"{r['build only']['rows_s'] / 1e6:.2f} M rows/s")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer steps")
    ap.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = ap.parse_args(argv)
    if use_smoke(args.smoke):
        use_smoke_sizes()
    with tempfile.TemporaryDirectory() as tmp:
        report_writer(bench_writer(3 if args.smoke else 60 if args.quick else 400, Path(tmp)))


if __name__ == "__main__":
    main()
