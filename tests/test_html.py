"""What notebooks show: the HTML forms carry the same figures as the text
forms, escaped."""
import re

import vramguard
from vramguard import Heap, Trace, format_summary
from vramguard.render.html import Report, memory_bar, summary_html, table

MiB = 1 << 20


def _cells(html):
    return [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<t[dh][^>]*>.*?</t[dh]>", html)]


def test_report_reads_as_text_and_renders_its_html():
    r = Report("a\nb", html="<b>x</b>")
    assert repr(r) == "a\nb" and r == "a\nb"
    assert r._repr_html_() == "<b>x</b>"
    assert Report("1 < 2")._repr_html_() == "<pre>1 &lt; 2</pre>"


def test_summary_html_has_the_text_figures():
    heap = Heap("1GiB", budget="512MiB")
    a = heap.malloc(100 * MiB)
    heap.malloc(1000)
    heap.free(a)
    stats = heap.stats()
    text = format_summary(stats)
    html = summary_html(stats, "<device 0>", text)
    cells = _cells(html)
    row = cells[cells.index("Allocated"):cells.index("Allocated") + 5]
    assert row == ["Allocated", "1.00 KiB", "100.00 MiB", "100.00 MiB", "100.00 MiB"]
    assert "&lt;device 0&gt;" in html and "<device 0>" not in html
    assert "Cached free in pieces" in html and "cache hits" not in html
    assert "cache hits" in summary_html(stats, "<device 0>", format_summary(stats, verbose=True))
    assert "of 512.00 MiB" in html  # the bar is drawn against the budget
    # the default is the arena: its rows are named as the text names them
    row = cells[cells.index("Mapped"):cells.index("Mapped") + 5]
    assert row == ["Mapped", "102.00 MiB", "102.00 MiB", "102.00 MiB", "0 bytes"]
    assert "Mapped memory" in text and "Reserved" not in cells and "Non-releasable" not in cells
    assert "allocated 1.00 KiB, mapped 102.00 MiB of 512.00 MiB" in html


def test_summary_html_of_segments_keeps_reserved_and_non_releasable():
    heap = Heap("1GiB", policy="segments")
    heap.malloc(1000)
    stats = heap.stats()
    cells = _cells(summary_html(stats, "d", format_summary(stats)))
    assert cells[cells.index("Reserved"):cells.index("Reserved") + 2] == ["Reserved", "2.00 MiB"]
    assert "Non-releasable" in cells and "Mapped" not in cells


def test_memory_bar_widths_are_shares_of_the_ceiling():
    html = memory_bar(256 * MiB, 512 * MiB, 1024 * MiB)
    assert "width:25.00%" in html and "width:25.00%;background:#f0a030" in html


def test_table_escapes_every_value():
    html = table(["<h>"], [["<v>"], [3]])
    assert _cells(html) == ["&lt;h&gt;", "&lt;v&gt;", "3"]


def test_replay_result_renders_its_verdict():
    t = Trace("two")
    t.alloc(300 * MiB)
    t.alloc(300 * MiB)
    fits = vramguard.replay(t, budget="1GiB")
    assert "FITS" in fits._repr_html_() and "DOES NOT FIT" not in fits._repr_html_()
    html = vramguard.replay(t, budget="512MiB")._repr_html_()
    assert "DOES NOT FIT" in html and "First OOM at op 1" in html
    assert "600.00 MiB" in _cells(html)


def test_summary_html_keeps_each_sentence_whole():
    """The text wraps its sentences at 80 columns; the HTML's notes are one
    div a sentence, never a sentence cut in two."""
    heap = Heap("1GiB", policy="segments")
    ps = [heap.malloc(512 << 10) for _ in range(64)]
    for p in ps[::2]:
        heap.free(p)
    stats = heap.stats()
    text = format_summary(stats)
    so_what = [line for line in text.splitlines() if "So what" in line]
    assert so_what and len(text.split("So what")[1].split("|\n|")) > 1     # wrapped in the text
    notes = re.findall(r"<div>(.*?)</div>", summary_html(stats, "vramguard memory summary", text))
    (whole,) = [n for n in notes if n.startswith("So what")]
    assert whole.endswith(".") and not any(n.startswith(("  ", "(")) for n in notes)
    rows = text.splitlines()
    first = next(i for i, line in enumerate(rows) if line.startswith("| So what"))
    end = next(i for i in range(first + 1, len(rows)) if not rows[i].startswith("|   "))
    assert " ".join(row[2:-2].strip() for row in rows[first:end]) == whole.replace("&#x27;", "'")
