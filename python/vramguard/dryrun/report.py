"""The dry run's report, as text and as HTML, from one table model
(table.columns) and the same lines (verdict.py, notes.py, the features')."""
from .._core import format_size
from ..render.text_table import text_table
from .contract import runs_of
from .features import FEATURES
from .notes import card_lines, feature_lines, margin_lines, need_lines, note_lines
from .table import columns
from .verdict import verdict_lines

__all__ = ["format_report", "partial_table", "report_html"]


def _table(result):
    return text_table(*columns(result), left=(0, -1))


def _feature_tables(result):
    return [line for feature in FEATURES for line in feature.tables(result)]


def format_report(result):
    """The text report: one row per allocator, the verdict, the notes."""
    lines = [f"vramguard dryrun: {result.get('script')} on a phantom {result['gpu']} "
             f"({format_size(result['device_bytes'])}, of which the CUDA context holds "
             f"{format_size(result.get('context_bytes', 0))})"]
    lines += card_lines(result)
    lines += _table(result)
    lines += verdict_lines(result)
    lines += feature_lines(result)
    lines += need_lines(result)
    lines += _feature_tables(result)
    lines += margin_lines(result)
    lines += note_lines(result)
    rss = result.get("host_peak_rss_bytes")
    if rss:
        lines.append(f"Host memory: peak RSS {format_size(rss)} (the largest run's).")
    if result.get("out_dir"):
        snapshots = any(r.get("snapshot") for r in runs_of(result).values())
        lines.append(("Snapshots and logs (memory snapshots open at pytorch.org/memory_viz): " if snapshots
                      else "Logs and figures (no memory snapshots): ") + result["out_dir"])
    return "\n".join(lines)


def partial_table(result):
    """The table of the runs `result` holds so far (a dry run cut short)."""
    return _table(result)


def report_html(result):
    from html import escape

    from ..render.html import table, verdict_badge

    headers, rows = columns(result)
    fits = result.get("fits")
    caption = (f"{result.get('script')} on a phantom {result['gpu']} ({format_size(result['device_bytes'])})")
    lines = (card_lines(result) + verdict_lines(result) + feature_lines(result) + need_lines(result)
             + margin_lines(result) + note_lines(result))
    body = "".join(f"<div>{escape(line)}</div>" for line in lines)
    tables = _feature_tables(result)
    if tables:  # a table of its own, in the text's columns
        body += f"<pre>{escape(chr(10).join(tables))}</pre>"
    where = (f"<div style='font-size:11px;color:#555'>snapshots and logs: {escape(result['out_dir'])}</div>"
             if result.get("out_dir") else "")
    badge = verdict_badge(bool(fits)) if fits is not None else ""
    return f"<div><b>vramguard dryrun</b> {badge}" + table(headers, rows, caption) + body + where + "</div>"
