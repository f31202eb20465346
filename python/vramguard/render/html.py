"""What a notebook shows for vramguard's reports (`_repr_html_`): the
same figures as the text forms, as tables, with the verdict up front. Every
value is escaped; nothing here reads the allocator, it only lays out what
the caller computed."""
from html import escape

from .._core import format_size

__all__ = ["Report", "table", "memory_bar", "summary_html", "replay_html"]

_STYLE = ("font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12px;"
          "border-collapse:collapse;margin:4px 0")
_CELL = "padding:2px 8px;border-bottom:1px solid #ddd;text-align:right"
_HEAD = "padding:2px 8px;border-bottom:2px solid #888;text-align:right"
_GOOD, _BAD = "#1a7f37", "#cf222e"


class Report(str):
    """Text that a notebook cell shows as itself (not as a quoted string),
    and as `html` where the front end renders HTML."""

    def __new__(cls, text, html=None):
        obj = super().__new__(cls, text)
        obj._html = html
        return obj

    def __repr__(self):
        return str(self)

    def _repr_html_(self):
        return self._html if self._html is not None else f"<pre>{escape(str(self))}</pre>"


def _cell(value, tag="td", style=_CELL, first=False):
    align = ";text-align:left" if first else ""
    return f"<{tag} style='{style}{align}'>{escape(str(value))}</{tag}>"


def table(headers, rows, caption=None):
    """An HTML table; each row a sequence of values shown as their str()."""
    head = "".join(_cell(h, "th", _HEAD, i == 0) for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(_cell(v, first=i == 0) for i, v in enumerate(row)) + "</tr>"
                   for row in rows)
    cap = f"<caption style='text-align:left;font-weight:bold'>{escape(caption)}</caption>" if caption else ""
    return f"<table style='{_STYLE}'>{cap}<tr>{head}</tr>{body}</table>"


def memory_bar(allocated, reserved, ceiling, label=None):
    """A bar: allocated inside reserved, against the ceiling (the budget or
    the device's total), each named with its size."""
    ceiling = max(ceiling, reserved, allocated, 1)
    a, r = 100 * allocated / ceiling, 100 * max(reserved - allocated, 0) / ceiling
    caption = label or (f"allocated {format_size(allocated)}, reserved {format_size(reserved)} "
                        f"of {format_size(ceiling)}")
    return ("<div style='width:420px;height:14px;background:#eee;border:1px solid #bbb;display:flex'>"
            f"<div style='width:{a:.2f}%;background:#2f6fde'></div>"
            f"<div style='width:{r:.2f}%;background:#f0a030'></div></div>"
            f"<div style='font-size:11px;color:#555'>{escape(caption)}</div>")


_SUMMARY_ROWS = [
    ("Allocated", "allocated_bytes"),
    ("Requested", "requested_bytes"),
    ("Active", "active_bytes"),
    ("Reserved", "reserved_bytes"),
    ("Non-releasable", "inactive_split_bytes"),
]


def _text_notes(text, title):
    """The fragmentation and counter lines of the summary's text, so that
    the two forms never disagree: one note per sentence, the rows the text
    wrapped to fit its 80 columns (indented) joined again."""
    notes = []
    for line in text.splitlines():
        if not line.startswith("| ") or line.startswith("| Metric") or "|" in line[2:-1]:
            continue
        content = line[2:-1].rstrip()
        if not content.strip() or title in content:
            continue
        if content.startswith("  ") and notes:
            notes[-1] += " " + content.strip()
        else:
            notes.append(content.strip())
    return notes


def summary_html(stats, title, text):
    """The summary's table: one row per quantity (all pools) with current,
    peak and totals, a bar of allocated and reserved against the budget,
    then the fragmentation lines and the counters as the text says them."""
    # In arena mode, the text's words: reserved memory is mapped pages, and
    # no free block is stranded, so there is no non-releasable row.
    arena = stats.get("arena", False)
    rows = []
    for label, key in _SUMMARY_ROWS:
        if arena and key == "inactive_split_bytes":
            continue
        if arena and key == "reserved_bytes":
            label = "Mapped"
        values = [stats.get(f"{key}.all.{part}", 0) for part in ("current", "peak", "allocated", "freed")]
        rows.append([label] + [format_size(max(v, 0)) for v in values])
    ceiling = stats.get("budget_bytes") or stats.get("device_total_bytes") or 0
    allocated, reserved = stats.get("allocated_bytes.all.current", 0), stats.get("reserved_bytes.all.current", 0)
    bar = memory_bar(allocated, reserved, ceiling,
                     f"allocated {format_size(allocated)}, mapped {format_size(reserved)} of {format_size(ceiling)}"
                     if arena else None)
    notes = "".join(f"<div>{escape(line)}</div>" for line in _text_notes(text, title))
    return (f"<div><b>{escape(title)}</b>{bar}"
            + table(["Memory", "Current", "Peak", "Total allocated", "Total freed"], rows)
            + f"<div style='font-size:12px'>{notes}</div></div>")


def verdict_badge(fits):
    colour, word = (_GOOD, "FITS") if fits else (_BAD, "DOES NOT FIT")
    return f"<span style='color:white;background:{colour};padding:1px 6px;border-radius:3px'>{word}</span>"


def replay_html(result):
    """A ReplayResult: the verdict, its peaks, and where the first OOM was."""
    rows = [
        ["Peak live (the physical limit)", format_size(result.peak_requested_bytes)],
        ["Peak allocated", format_size(result.peak_allocated_bytes)],
        ["Peak reserved", f"{format_size(result.peak_reserved_bytes)} ({result.reserve_overhead:+.1%} over live)"],
        ["Budget", result.budget_label],
        ["Ops replayed", f"{result.events:,}"],
    ]
    oom = ""
    if result.first_oom_at is not None:
        oom = f"<div>First OOM at {escape(str(result.first_oom_at))}</div>"
    return (f"<div><b>{escape(result.trace)}</b> under policy <code>{escape(result.policy)}</code>: "
            f"{verdict_badge(result.fits)}" + table(["", ""], rows) + oom + "</div>")
