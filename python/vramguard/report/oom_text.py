"""The out-of-memory report (oom.py's OOMReport) as text and as HTML: the
headline, the sections of what was live and what was cached, the ranked
advice with what each saves, and what was not advised. One set of lines
serves both, so the two cannot say different things."""
import html

from .. import _core
from .._units import format_size
from ..render import words
from ..render.advice import fragmentation_so_what
from .oom_phase import PHASE_WORDS

__all__ = ["advice_lines", "headline", "report_html", "report_text", "sections"]

#: Size classes shown one a line, the largest by bytes; the rest in one line.
_CLASSES_SHOWN = 5


def _budget_text(budget):
    if budget == _core.BUDGET_NOTHING:  # what a memory fraction of 0 sets (heap.h)
        return "a budget of 0 bytes (torch.cuda.set_per_process_memory_fraction(0))"
    return f"{format_size(budget)} budget"


def _blocks(n):
    return words.count(n, "block")


def _pct(x):
    return f"{x:.1%}"


def headline(report):
    r = report
    who = r.limit_name if r.budget_refused or not r.budget else "the device"
    return (f"Out of memory on device {r.device}: asked for {format_size(r.requested)}"
            f" ({format_size(r.rounded)} as a block); {who} said no.")


def sections(report):
    """[(title, [lines])], shared by the text and the HTML."""
    return [("", _facts(report)), ("What was live", _live_lines(report)), ("What was cached", _cached_lines(report))]


def _facts(r):
    limit = (f"{_budget_text(r.budget)} on {words.a(format_size(r.device_total) + ' device')}" if r.budget
             else f"no budget: the {format_size(r.device_total)} device")
    facts = [
        f"Short by: {format_size(r.short_by)} (the most one request could have had: "
        f"{format_size(r.available)})",
        f"Budget: {limit}; room to reserve more: {format_size(r.room)}"
        + (f"; {format_size(r.device_free)} free on the device" if r.device_total else ""),
    ]
    if r.phase is not None:
        facts.append(f"Where: {PHASE_WORDS[r.phase]}")
    return facts


def _live_lines(r):
    live = [f"Live: {format_size(r.live)} in {_blocks(r.live_blocks)}"]
    live += _class_lines(r.live_by_class)
    for name, added, peak in r.live_by_region:
        live.append(f"  by region, {name}: +{format_size(max(added, 0))} since it began (its peak "
                    f"{format_size(peak)})")
    if r.live_by_line:
        for label, nbytes, blocks in r.live_by_line:
            live.append(f"  by line, {label}: {format_size(nbytes)} in {_blocks(blocks)}")
    else:
        live.append("  by line: vramguard.record(stacks=True) shows which lines")
    if r.steps is not None:
        steps, boundary, _, _, _ = r.steps
        live.append(f"  at the last step boundary (step {steps}): {format_size(boundary)}")
    return live


def _class_lines(live_by_class):
    """The largest size classes one a line (the rows sorted by bytes)."""
    out = []
    for lower, upper, blocks, nbytes in live_by_class[:_CLASSES_SHOWN]:
        span = f"{format_size(lower)} to {format_size(upper)}" if upper else f"{format_size(lower)} and more"
        out.append(f"  by size class, {span}: {format_size(nbytes)} in {_blocks(blocks)}")
    rest = live_by_class[_CLASSES_SHOWN:]
    if rest:  # every live byte is in some line: the smaller classes in one
        out.append(f"  by size class, {words.count(len(rest), 'other class', 'other classes')}: "
                   f"{format_size(sum(row[3] for row in rest))} in {_blocks(sum(row[2] for row in rest))}")
    return out


def _cached_lines(r):
    held = (f"mapped in {words.count(r.segments, 'range')}" if r.arena
            else f"reserved in {words.count(r.segments, 'segment')}")  # the error message's words
    return [
        f"Cached (reserved but not allocated): {format_size(r.cached)} of {format_size(r.reserved)} "
        f"{held}",
        f"Cached free: {format_size(r.free_bytes)} in {_blocks(r.free_blocks)}, largest free block "
        f"{format_size(r.largest_free_block)}",
        f"Cached free in pieces (1 - largest free block / cached free): {_pct(r.stats['fragmentation.external'])}",
        f"Reserved but not allocated (1 - allocated / reserved): {_pct(r.stats['fragmentation.unused'])}",
        f"Non-releasable memory: {format_size(r.non_releasable)}",
        fragmentation_so_what(r.stats),
    ]


def advice_lines(advice):
    """[(title, what it saves, detail)] of ranked Advice."""
    return [(a.title, _saves(a), a.detail) for a in advice]


def _saves(advice):
    # No "enough alone": what a change frees can merge with free
    # neighbours, so only a run says whether the request then fits.
    if advice.said is not None:
        return advice.said
    if advice.measured:
        return "measured to fit"
    if advice.saving is None:
        return "no estimate"
    if advice.up_to:
        return f"saves up to {format_size(int(advice.saving))}"
    if advice.at_least:
        return f"frees at least {format_size(int(advice.saving))}"
    return f"frees {format_size(int(advice.saving))}"


def report_text(report):
    """str(report)."""
    out = [report.headline()]
    for title, lines in sections(report):
        if title:
            out.append(title + ":")
        out += lines
    out.append(f"Advice, most useful first (short by {format_size(report.short_by)}):")
    for n, (title, saves, detail) in enumerate(advice_lines(report.advice), 1):
        out.append(f"  {n}. {title} ({saves})")
        out.append(f"     {detail}")
    if report.not_advised:
        out.append("Not advised here:")
        out += [f"  {what}: {why}." for what, why in report.not_advised]
    out.append(report.measure_line())
    return "\n".join(out)


def report_html(report):
    """What a notebook shows of the report."""
    e = html.escape
    parts = [f"<p><b>{e(report.headline())}</b></p>"]
    for title, lines in sections(report):
        if title:
            parts.append(f"<p><b>{e(title)}</b></p>")
        parts.append("<ul>" + "".join(f"<li>{e(line.strip())}</li>" for line in lines) + "</ul>")
    parts.append(f"<p><b>Advice, most useful first</b> (short by {e(format_size(report.short_by))})</p><ol>")
    for title, saves, detail in advice_lines(report.advice):
        parts.append(f"<li><b>{e(title)}</b> ({e(saves)})<br>{e(detail)}</li>")
    parts.append("</ol>")
    if report.not_advised:
        parts.append("<p><b>Not advised here</b></p><ul>"
                     + "".join(f"<li>{e(what)}: {e(why)}.</li>" for what, why in report.not_advised) + "</ul>")
    parts.append(f"<p>{e(report.measure_line())}</p>")
    return "".join(parts)
