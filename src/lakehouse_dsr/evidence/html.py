"""Self-contained HTML pages for people: the run report with its charts (`run_report_page`), and the
page frame, tables and bar charts the certificate page shares.

Inline CSS and hand-written SVG only: no script, no external resource (the page's content security
policy forbids loading any), every value escaped. Pages carry what the JSON they are made from
carries, which holds no subject identifier.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from html import escape

_CSS = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1d2330;background:#f6f7f9;margin:0}
main{max-width:980px;margin:0 auto;padding:28px 24px 48px}
h1{font-size:24px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px}
.sub{color:#5b6475;margin:0 0 18px}
.card{background:#fff;border:1px solid #dde1e8;border-radius:8px;padding:14px 18px;margin:12px 0}
table{border-collapse:collapse;width:100%;background:#fff;font-size:14px}
th,td{border-bottom:1px solid #e4e7ec;padding:6px 8px;text-align:left;vertical-align:top}
th{background:#eef1f5;font-weight:600}td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
.ok{color:#176b36;font-weight:600}.bad{color:#a4161a;font-weight:600}.warn{color:#8a5a00;font-weight:600}
.badge{display:inline-block;border-radius:12px;padding:2px 10px;font-size:13px;font-weight:600}
.badge.ok{background:#dcf5e4}.badge.bad{background:#fde2e1}.badge.warn{background:#fff1cc}
dl{display:grid;grid-template-columns:max-content 1fr;gap:4px 18px;margin:0}dt{color:#5b6475}dd{margin:0}
code{font:13px ui-monospace,SFMono-Regular,Menlo,monospace;word-break:break-all}
svg text{font:12px system-ui,sans-serif;fill:#1d2330}
"""
_POLICY = "default-src 'none'; style-src 'unsafe-inline'"


def esc(value: object) -> str:
    return escape(str(value), quote=True)


def page(title: str, subtitle: str, body: str) -> str:
    """A complete HTML document around `body` (already escaped HTML)."""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{_POLICY}">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1"><title>{esc(title)}</title>'
            f'<style>{_CSS}</style></head>\n<body><main><h1>{esc(title)}</h1><p class="sub">{esc(subtitle)}</p>\n'
            f"{body}\n</main></body></html>\n")


def table(headers: list[str], rows: Iterable[list[object]], numeric: Iterable[int] = ()) -> str:
    """An HTML table; cells are escaped, except `Markup` ones. Columns in `numeric` align right."""
    right = set(numeric)

    def cell(tag: str, i: int, value: object) -> str:
        text = value if isinstance(value, Markup) else esc(value)
        return f'<{tag}{" class=n" if i in right else ""}>{text}</{tag}>'

    head = "".join(cell("th", i, h) for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(cell("td", i, v) for i, v in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


class Markup(str):
    """HTML built here from escaped parts: `table` inserts it as is."""


def fact_list(facts: Iterable[tuple[str, object]]) -> Markup:
    """Name / value pairs as a definition list; values are escaped unless `Markup`."""
    items = "".join(f"<dt>{esc(k)}</dt><dd>{v if isinstance(v, Markup) else esc(v)}</dd>" for k, v in facts)
    return Markup(f'<dl style="margin-top:10px">{items}</dl>')


def code(text: str) -> Markup:
    return Markup(f"<code>{esc(text)}</code>")


def badge(text: str, kind: str) -> Markup:
    return Markup(f'<span class="badge {esc(kind)}">{esc(text)}</span>')


def bar_chart(title: str, values: dict[str, float], label: Callable[[float], str] = lambda v: f"{v:,.0f}") -> str:
    """A horizontal bar chart as inline SVG: one bar per entry, the longest for the largest value.
    `label` formats the value printed after each bar."""
    if not values:
        return f'<div class="card"><strong>{esc(title)}</strong><p class="sub">nothing to show</p></div>'
    name_w, bar_w, row_h = 230, 520, 24
    top = max(max(values.values()), 0) or 1
    bars = []
    for i, (name, value) in enumerate(values.items()):
        y = 8 + i * row_h
        width = max(value, 0) / top * bar_w
        bars.append(f'<text x="{name_w - 8}" y="{y + 15}" text-anchor="end">{esc(_clip(name))}</text>'
                    f'<rect x="{name_w}" y="{y + 3}" width="{width:.1f}" height="{row_h - 8}" rx="3" fill="#3b6fd8">'
                    f"<title>{esc(name)}: {esc(label(value))}</title></rect>"
                    f'<text x="{name_w + width + 6:.1f}" y="{y + 15}">{esc(label(value))}</text>')
    height = 16 + len(values) * row_h
    return (f'<div class="card"><strong>{esc(title)}</strong>'
            f'<svg role="img" aria-label="{esc(title)}" width="100%" '
            f'viewBox="0 0 {name_w + bar_w + 110} {height}">{"".join(bars)}</svg></div>')


def _clip(name: str, most: int = 32) -> str:
    return name if len(name) <= most else name[: most - 1] + "…"


def human_bytes(n: float) -> str:
    if abs(n) < 1000:
        return f"{n:,.0f} B"
    for unit in ("kB", "MB"):
        n /= 1000
        if abs(n) < 1000:
            return f"{n:,.1f} {unit}"
    return f"{n / 1000:,.1f} GB"


def run_report_page(report: dict) -> str:
    """The run report (`RunReport.as_dict()`) as a page: summary, three charts (seconds per stage,
    rows erased or redacted per table, bytes rewritten per table), the per-table figures and the
    requests with their outcome."""
    summary, per_table = report["summary"], report.get("per_table", {})
    failed = summary["failed"] or report.get("held") or report.get("collateral_failures")
    facts = [("run", report["run_id"]), ("started", report["started_at"][:19].replace("T", " ") + " UTC"),
             ("requests", f"{summary['requests']} ({summary['completed']} completed, {summary['failed']} open with "
                          f"a reason, {summary['awaiting_purge']} awaiting the batched purge, "
                          f"{summary.get('held', 0)} under a legal hold)"),
             ("seconds in all", f"{summary['seconds_total']:.1f}")]
    if report.get("export"):
        facts.append(("access packages", f"{report['export']['packages']} ({report['export']['format']})"))
    verdict = badge("needs attention" if failed else "all proven", "bad" if failed else "ok")
    body = [f'<div class="card">{verdict}{fact_list(facts)}</div>']
    for name, reason in {**report.get("held", {}), **report.get("collateral_failures", {})}.items():
        body.append(f'<p class="bad">{esc(name)}: {esc(reason)}</p>')
    body.append("<h2>Charts</h2>")
    body.append(bar_chart("Seconds per stage", report.get("seconds", {}), lambda v: f"{v:,.2f} s"))
    body.append(bar_chart("Rows erased or redacted per table", {t: f["rows"] for t, f in per_table.items()}))
    body.append(bar_chart("Bytes rewritten per table (erase and purge)",
                          {t: f["bytes_rewritten"] for t, f in per_table.items()}, human_bytes))
    if per_table:
        body.append("<h2>Tables</h2>")
        body.append(table(["table", "action", "rows erased/redacted", "files rewritten", "bytes rewritten",
                           "snapshots expired", "verified"],
                          ([t, f["action"], f"{f['rows']:,}", f"{f['files_rewritten']:,}",
                            human_bytes(f["bytes_rewritten"]), f"{f['snapshots_expired']:,}", _verified(f["verified"])]
                           for t, f in per_table.items()),
                          numeric=(2, 3, 4, 5)))
    body += _lifecycle(report)
    if report.get("requests"):
        body.append("<h2>Requests</h2>")
        body.append(table(["request", "outcome", "reason"],
                          ([r["request_id"], badge(r["status"], _STATUS_KIND.get(r["status"], "warn")),
                            r["reason"] or ""] for r in report["requests"])))
    return page(f"Run {report['run_id']}", "lakehouse-dsr run report (no subject identifiers)", "\n".join(body))


def _lifecycle(report: dict) -> list[str]:
    """The page's sections on people erased before who came back, and on the retention rules enforced."""
    parts: list[str] = []
    if report.get("resurrections"):
        parts.append("<h2>People erased before who came back</h2>")
        parts.append(table(["table", "rows", "completed requests", "files", "added by", "files read"],
                           ([t, f"{r['rows']:,}", f"{r['requests']:,}", f"{r['files']:,}",
                             ", ".join(f"{c.get('operation', '?')} {c.get('snapshot_id', c.get('sequence_number'))}"
                                       for c in r["commits"]) or "(files)",
                             f"{r['files_read']:,}" + (" (whole table)" if r["whole_table"] else "")]
                            for t, r in report["resurrections"].items()), numeric=(1, 2, 3, 5)))
    retention = report.get("retention")
    if retention:
        parts.append("<h2>Retention</h2>")
        rows = [[t, rule["rule"], rule["cutoff"], f"{rule['rows_past']:,}",
                 # (a report leaves out the fields a rule did not set: nothing committed, nothing written)
                 "metadata only" if rule.get("metadata_only") else f"{rule.get('data_files_added', 0):,} files written",
                 "" if rule["rows_left"] is None else f"{rule['rows_left']:,}",
                 badge("proven" if e["passed"] else "rows left", "ok" if e["passed"] else "bad")]
                for t, e in retention["tables"].items() for rule in e["rules"]]
        parts.append(table(["table", "rule", "cutoff", "rows past", "rewrite", "rows left", "proof"], rows,
                           numeric=(3, 5)))
        parts += [f'<p class="warn">{esc(t)} not expired: {esc(why)}</p>' for t, why in retention["skipped"].items()]
        parts += [f'<p class="warn">{esc(t)} {esc(e["blocked"])}</p>' for t, e in retention["tables"].items()
                  if e.get("blocked")]
        parts += [f"<p>{esc(t)}: {esc(ref)} pinned {r['rows_past']:,} row(s) past a rule: {esc(r['outcome'])}</p>"
                  for t, e in retention["tables"].items() for ref, r in e.get("refs", {}).items()
                  if r["rows_past"] and r["outcome"] != "blocked"]
    return parts


_STATUS_KIND = {"completed": "ok", "failed": "bad", "erased": "warn", "held": "warn"}


def _verified(state: str) -> Markup:
    return badge(state, {"yes": "ok", "live only": "warn"}.get(state, "bad"))
