"""Findings as text (the terminal), JSON (CI and agents) and one self-contained HTML page.

print(as_text(findings, not_checked=skipped))     # skipped: engine.examine(...).not_checked
json.dumps(as_json(findings, runs, not_checked=skipped))
Path("report.html").write_text(as_html(findings, runs, not_checked=skipped))

Every format lists the detectors that could not run on a run and why ("truncation: not checked, the length
limit is unknown"), so a run that was not looked at does not read as a healthy one.
"""

from __future__ import annotations

import html

from tokengrad.doctor.finding import SEVERITIES, Finding, NotChecked, TokenEvidence
from tokengrad.doctor.links import DEFAULT_BASE, dashboard_query, dashboard_url
from tokengrad.read.display import visible_lines, visible_text
from tokengrad.read.token_text import readable_token

_MARK = {"critical": "CRIT", "warning": "WARN", "info": "info"}


def _steps(f: Finding) -> str:
    if f.first_step is None:
        return "run"
    return f"step {f.first_step}" if f.first_step == f.last_step else f"steps {f.first_step}-{f.last_step}"


def evidence_text(t: TokenEvidence) -> str:
    """A token's evidence text as read: whole characters from byte pieces that form them
    (tokengrad.read.token_text.readable_token; the culprits already name a split character whole), escapes
    for what a terminal or page would obey. A sample's text (no position) is decoded already."""
    return visible_text(readable_token(t.text) if t.position is not None else t.text)


def not_checked_lines(not_checked: list[NotChecked]) -> list[str]:
    """One line per detector that could not run: 'truncation: not checked, <reason>  [run]'."""
    return [f"skip {n}  [{n.run}]" for n in not_checked]


def as_text(
    findings: list[Finding], base: str = DEFAULT_BASE, tokens: int = 3, not_checked: list[NotChecked] = ()
) -> str:
    """One block per finding: severity, id, run, steps, confidence, message, top tokens, link; then the
    detectors that could not run, with the reason."""
    if not findings:
        return "\n".join(["no findings", *not_checked_lines(not_checked)])
    lines = []
    for f in findings:
        lines.append(f"{_MARK[f.severity]} {f.id}  {f.run}  {_steps(f)}  confidence {f.confidence:.2f}")
        lines.append(f"     {f.message}")
        for t in f.tokens[:tokens]:
            share = f"{100 * t.share:.1f} % of {t.share_of}" if t.share is not None else t.share_of
            where = f"sample {t.sample_id}" + (f" pos {t.position}" if t.position is not None else "")
            exact = "exact" if t.exact else "estimate"
            prob = f" p={t.prob:.3g}" if t.prob is not None else ""
            lines.append(f"     - step {t.step} {where} '{evidence_text(t)}'{prob}: {share} ({exact})")
        for a in f.actions[:2]:
            lines.append(f"     > {a.text} [{a.source}]")
        lines.append(f"     {dashboard_url(f, base)}")
    counts = {s: sum(f.severity == s for f in findings) for s in reversed(SEVERITIES)}
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items()))
    lines += not_checked_lines(not_checked)
    return visible_lines("\n".join(lines))  # run names and quoted text: escapes, never terminal codes


def as_json(
    findings: list[Finding], runs: list[str], base: str = DEFAULT_BASE, not_checked: list[NotChecked] = ()
) -> dict:
    return {
        "runs": runs,
        "counts": {s: sum(f.severity == s for f in findings) for s in SEVERITIES},
        "findings": [
            {**f.as_dict(), "dashboard": {"url": dashboard_url(f, base), "query": dashboard_query(f)}}
            for f in findings
        ],
        "not_checked": [n.as_dict() for n in not_checked],
    }


_CSS = (
    "body{font-family:system-ui,sans-serif;margin:2em;max-width:70em}"
    ".f{border-left:6px solid #999;padding:.4em 1em;margin:1em 0;background:#fafafa}"
    ".critical{border-color:#c62828}.warning{border-color:#ef6c00}.info{border-color:#1565c0}"
    "table{border-collapse:collapse;font-size:90%}td,th{padding:2px 8px;border-bottom:1px solid #ddd}"
    "code{background:#eee;padding:0 3px}"
)


def _html_tokens(f: Finding) -> str:
    if not f.tokens:
        return ""
    rows = "".join(
        f"<tr><td>{t.step}</td><td>{t.sample_id}</td><td>{'' if t.position is None else t.position}</td>"
        f"<td><code>{html.escape(evidence_text(t))}</code></td>"
        f"<td>{'' if t.prob is None else f'{t.prob:.3g}'}</td>"
        f"<td>{'' if t.share is None else f'{100 * t.share:.1f} %'}</td><td>{html.escape(t.share_of)}</td>"
        f"<td>{'exact' if t.exact else 'estimate'}</td></tr>"
        for t in f.tokens[:10]
    )
    head = "".join(f"<th>{h}</th>" for h in ("step", "sample", "pos", "token", "p", "share", "of", ""))
    head = f"<tr>{head}</tr>"
    return f"<table>{head}{rows}</table>"


def as_html(
    findings: list[Finding], runs: list[str], base: str = DEFAULT_BASE, not_checked: list[NotChecked] = ()
) -> str:
    """A self-contained page (no scripts, no external files): one box per finding, then the detectors
    that could not run."""
    blocks = []
    for f in findings:
        actions = "".join(
            f"<li>{html.escape(a.text)} <i>({html.escape(a.source)})</i></li>" for a in f.actions
        )
        blocks.append(
            f"<div class='f {f.severity}'><b>{f.severity}</b> <code>{html.escape(f.id)}</code> "
            f"{html.escape(visible_text(f.run))} · {_steps(f)} · confidence {f.confidence:.2f}"
            f"<p>{html.escape(visible_lines(f.message))}</p>{_html_tokens(f)}<ul>{actions}</ul>"
            f"<a href='{html.escape(dashboard_url(f, base))}'>open in the dashboard</a></div>"
        )
    counts = ", ".join(f"{sum(f.severity == s for f in findings)} {s}" for s in reversed(SEVERITIES))
    title = "tokengrad doctor: " + ", ".join(html.escape(visible_text(r)) for r in runs)
    body = "".join(blocks) or "<p>No findings.</p>"
    if not_checked:
        items = "".join(f"<li>{html.escape(str(n))} <i>({html.escape(n.run)})</i></li>" for n in not_checked)
        body += f"<h2>Not checked</h2><ul>{items}</ul>"
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title><style>{_CSS}</style>"
        f"</head><body><h1>{title}</h1><p>{counts}</p>{body}</body></html>"
    )
