"""Dashboard server memory while Live refresh follows a run that is being written (issue 36).

    python benchmarks/bench_live_refresh.py                      # 300 s on the Token inspector
    python benchmarks/bench_live_refresh.py --seconds 1800       # the issue's 30 minutes
    python benchmarks/bench_live_refresh.py --page overview --every 2
    python benchmarks/bench_live_refresh.py --smoke              # ~40 s: runs, prints every figure

Records --pre-steps steps of a small run (16 completions of 2,048 characters a step, so the samples table
grows by ~32 KB a step), serves it with `tokengrad dashboard` on 127.0.0.1, opens --page in Debian's
headless chromium (Playwright), switches Live refresh on at --every seconds and keeps recording a step every
--write-every seconds while it samples the Streamlit server's RSS. Every poll finds new files, so the app
reruns once per poll: refreshes = elapsed / --every.

Prints the RSS samples, then the slope after --warmup seconds (least squares, MB per refresh and MB per
minute) and the total growth from the first sample after warm-up to the last. Flat means the slope is
within noise (a few hundredths of a MB per refresh); it asserts nothing.
"""

from __future__ import annotations

import argparse
import random
import string
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from measure import SMOKE_HELP  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
PAGES = {"inspector": "/inspector", "overview": "/", "buckets": "/buckets"}


def record_step(rec, step: int, rng: random.Random, n: int = 16, t: int = 4) -> None:
    """One recorded step: n completions of t tokens over a 32-token vocabulary, 2,048-character texts."""
    import torch

    logits = torch.randn(n, t, 32, requires_grad=True)
    ids = torch.randint(0, 32, (n, t))
    with rec.step(step) as st:
        lp = torch.log_softmax(logits, -1).gather(2, ids[..., None]).squeeze(-1)
        groups = torch.arange(n) // 4
        st.track(lp, token_ids=ids, advantages=torch.linspace(-1, 1, n), logits=logits.detach(),
                 sample_ids=torch.arange(n), group_ids=groups)  # fmt: skip
        st.backward(-lp.mean())
        st.log(loss=0.1, reward_mean=0.5)
        texts = ["".join(rng.choices(string.ascii_letters, k=2048)) for _ in range(n)]
        st.samples(sample_ids=list(range(n)), group_ids=groups.tolist(), completions=texts)


class Writer(threading.Thread):
    """Records a step every `period` seconds into `run_dir`, continuing after step `first`."""

    def __init__(self, run_dir: Path, first: int, period: float):
        super().__init__(daemon=True)
        self.run_dir, self.step, self.period = run_dir, first, period
        self.stop = threading.Event()

    def run(self) -> None:
        from tokengrad import Recorder

        rng = random.Random(1)
        with Recorder(str(self.run_dir)) as rec:
            while not self.stop.is_set():
                record_step(rec, self.step, rng)
                self.step += 1
                self.stop.wait(self.period)


def streamlit_process(url: str) -> psutil.Process:
    """The process listening on the dashboard's port (the Streamlit server, a child of the CLI)."""
    port = int(url.rsplit(":", 1)[1])
    for proc in psutil.process_iter(["pid"]):
        try:
            if any(
                c.laddr.port == port and c.status == psutil.CONN_LISTEN for c in proc.net_connections("tcp")
            ):
                return proc
        except (psutil.AccessDenied, psutil.NoSuchProcess):
            continue
    raise RuntimeError(f"no process listens on {url}")


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (t, y) points; 0 for fewer than two."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mt = sum(t for t, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    return sum((t - mt) * (y - my) for t, y in points) / var if var else 0.0


def open_live(page, url: str, args) -> None:
    """Open the page on the run and switch Live refresh on at --every seconds."""
    page.goto(f"{url}{PAGES[args.page]}?runs=live", timeout=180_000)
    page.wait_for_selector("[data-testid=stPlotlyChart]", state="attached", timeout=180_000)
    page.get_by_text("Live refresh").click()
    page.wait_for_selector("text=every (s)", timeout=60_000)
    if args.every != 5:  # the slider's default
        slider = page.get_by_role("slider").last
        slider.focus()
        steps = (2, 5, 10, 30)
        key = "ArrowRight" if args.every > 5 else "ArrowLeft"
        for _ in range(abs(steps.index(args.every) - steps.index(5))):
            slider.press(key)


def measure(url: str, run_dir: Path, args) -> list[tuple[float, float]]:
    from playwright.sync_api import sync_playwright

    server = streamlit_process(url)
    samples: list[tuple[float, float]] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        open_live(page, url, args)
        rss = server.memory_info().rss / 2**20
        print(f"  page open, live refresh every {args.every} s: server RSS {rss:.0f} MB")
        writer = Writer(run_dir, args.pre_steps, args.write_every)
        writer.start()
        t0 = time.monotonic()
        try:
            while (elapsed := time.monotonic() - t0) < args.seconds:
                time.sleep(min(args.sample_every, max(0.1, args.seconds - elapsed)))
                rss, cpu = server.memory_info().rss / 2**20, sum(server.cpu_times()[:2])
                samples.append((time.monotonic() - t0, rss))
                # server CPU time rising by about a second a refresh shows that the page keeps refreshing
                print(
                    f"  t={samples[-1][0]:6.0f} s  steps {writer.step:5d}  server RSS {rss:7.1f} MB  "
                    f"CPU {cpu:6.1f} s",
                    flush=True,
                )
            if args.screenshot:
                page.screenshot(path=args.screenshot, full_page=True)
        finally:
            writer.stop.set()
            writer.join()
            browser.close()
    return samples


def report(samples: list[tuple[float, float]], args) -> None:
    after = [(t, m) for t, m in samples if t >= args.warmup] or samples[-2:]
    per_s = slope(after)
    print(f"live refresh, page {args.page}, a refresh every {args.every} s, {args.seconds:.0f} s measured")
    print(f"  RSS after warm-up ({after[0][0]:.0f} s)           {after[0][1]:.1f} MB")
    print(f"  RSS at the end                      {samples[-1][1]:.1f} MB")
    print(f"  growth after warm-up (total)        {after[-1][1] - after[0][1]:.1f} MB")
    print(f"  slope after warm-up per refresh     {per_s * args.every:.3f} MB")
    print(f"  slope after warm-up per minute      {per_s * 60:.2f} MB")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=300, help="how long live refresh runs (default 300)")
    ap.add_argument("--pre-steps", type=int, default=300, help="steps recorded before the page opens")
    ap.add_argument("--page", choices=sorted(PAGES), default="inspector")
    ap.add_argument("--every", type=int, choices=(2, 5, 10, 30), default=5, help="live refresh period (s)")
    ap.add_argument("--write-every", type=float, default=2.0, help="seconds between recorded steps")
    ap.add_argument("--warmup", type=float, default=60, help="seconds left out of the slope")
    ap.add_argument("--sample-every", type=float, default=15, help="seconds between RSS samples")
    ap.add_argument("--screenshot", help="save the page at the end to this PNG (to see what it showed)")
    ap.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = ap.parse_args(argv)
    if args.smoke:
        args.seconds, args.pre_steps, args.warmup, args.sample_every = 20, 5, 5, 4
    from tokengrad import Recorder
    from tokengrad.cli.dashboard import serving

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "live"
        rng = random.Random(0)
        with Recorder(str(run_dir)) as rec:
            for s in range(args.pre_steps):
                record_step(rec, s, rng)
        with serving(tmp, timeout=120) as url:
            samples = measure(url, run_dir, args)
    report(samples, args)


if __name__ == "__main__":
    main()
