"""`tokengrad doctor RUN [RUN ...]`: ranked findings with the tokens behind them.

tokengrad doctor sample_runs/*                         # text
tokengrad doctor runs/demo --json                      # for CI and agents
tokengrad doctor runs/demo --fail-on critical          # exit 1 when a critical finding exists
tokengrad doctor runs/demo --html report.html          # a self-contained page
tokengrad doctor --list                                # the detectors
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tokengrad.doctor.finding import SEVERITIES, rank_findings
from tokengrad.doctor.links import DEFAULT_BASE
from tokengrad.doctor.registry import DETECTORS
from tokengrad.doctor.report import as_html, as_json, as_text


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tokengrad doctor", description="Diagnose runs: findings with evidence.")
    p.add_argument("runs", nargs="*", help="run directories")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.add_argument(
        "--fail-on", choices=SEVERITIES[1:], help="exit 1 if a finding of this severity or worse exists"
    )
    p.add_argument("--html", metavar="REPORT.html", help="also write a self-contained HTML report")
    p.add_argument("--only", help="comma-separated detector names (default: all)")
    p.add_argument("--min-severity", choices=SEVERITIES, default="info", help="leave out findings below this")
    p.add_argument("--dashboard", default=DEFAULT_BASE, help="base URL of the dashboard for the links")
    p.add_argument("--list", action="store_true", help="list the detectors and exit")
    return p


def cli_doctor(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    from tokengrad.doctor.engine import examine, load_detectors  # after parsing: --help without pandas

    if args.list:
        load_detectors()
        print(DETECTORS.describe())
        return 0
    if not args.runs:
        raise ValueError("name at least one run directory (or --list)")
    only = [n.strip() for n in args.only.split(",") if n.strip()] if args.only else None
    findings, skipped = [], []
    for run in args.runs:
        result = examine(run, only=only)
        findings += [f for f in result.findings if f.at_least(args.min_severity)]
        skipped += result.not_checked

    findings = rank_findings(findings)
    if args.json:
        print(json.dumps(as_json(findings, args.runs, args.dashboard, skipped), indent=2))
    else:
        print(as_text(findings, args.dashboard, not_checked=skipped))
    if args.html:
        Path(args.html).write_text(as_html(findings, args.runs, args.dashboard, skipped))
    if args.fail_on and any(f.at_least(args.fail_on) for f in findings):
        return 1
    return 0
