"""The truth harness: every line of vramguard's out-of-memory report, its
summary and its recovery line that states a figure or names a change is
parsed and held against what the session measures itself (torch's own
counters, an allocation of the size it names, the advice applied), or is
listed as unchecked with the reason. Imported inside a scenario's process
on the phantom (test_truth_harness.py), where the session is live.

    facts = truth.at_failure()          # in the except block, the failed call's frames alive
    verdicts = truth.check_report(vramguard.last_oom(), facts, step=...)

A verdict is (line, True/False, what was measured); check() of a Verdicts
raises on the first false one, with every verdict so far.
"""
import re

import torch

import vramguard
from summary_rows import summary_rows

GRANULE = 2 << 20
_UNITS = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
SIZE = r"(\d[\d,]*(?:\.\d+)? (?:bytes|KiB|MiB|GiB|TiB))"


def size_of(text):
    number, unit = text.rsplit(" ", 1)
    return float(number.replace(",", "")) * _UNITS[unit]


def same_size(text, nbytes):
    """The printed size is nbytes as format_size prints it."""
    return text == vramguard.format_size(int(nbytes))


class Verdicts:
    def __init__(self):
        self.checked, self.unchecked = [], []

    def add(self, line, ok, measured):
        self.checked.append((line, bool(ok), measured))

    def skip(self, line, why):
        self.unchecked.append((line, why))

    def false(self):
        return [v for v in self.checked if not v[1]]

    def as_dict(self):
        return {"checked": self.checked, "unchecked": self.unchecked}


def at_failure():
    """What the session holds as the error is being handled (the failed
    call's frames still alive): torch's own counters."""
    stats = torch.cuda.memory_stats()
    return {"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved(),
            "num_ooms": stats["num_ooms"]}


def _allocates(nbytes):
    try:
        t = torch.empty(int(nbytes), dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError:
        return False
    del t
    return True


def _largest_is_served(v, line, nbytes):
    """A request of the printed size is served, one granule more is not."""
    served, more = _allocates(nbytes), _allocates(nbytes + GRANULE)
    v.add(line, served and not more, {"served": served, "one_granule_more_served": more})


# ------------------------------------------------------------------ report


def _check_facts(v, report, facts, lines):
    for line in lines:
        m = re.match(rf"Short by: {SIZE} \(the most one request could have had: {SIZE}\)$", line)
        if m:
            short, most = size_of(m.group(1)), size_of(m.group(2))
            v.add(line + " [short by]", same_size(m.group(1), max(report.rounded - most, 0)),
                  {"request": report.rounded})
            _largest_is_served(v, line, report.available)
            continue
        m = re.match(rf"Live: {SIZE} in (\d[\d,]*) blocks?$", line)
        if m:
            v.add(line, same_size(m.group(1), facts["allocated"]), {"torch_allocated": facts["allocated"]})
            continue
        m = re.match(rf"Cached \(reserved but not allocated\): {SIZE} of {SIZE} (?:reserved|mapped) in", line)
        if m:
            cached = facts["reserved"] - facts["allocated"]
            v.add(line, same_size(m.group(1), cached) and same_size(m.group(2), facts["reserved"]),
                  {"torch_reserved": facts["reserved"], "torch_cached": cached})
            continue
        m = re.match(rf"  \d+\. .* \({SIZE} cached free outside the largest free block\)$", line)
        if m and not report.arena:  # the segments' free blocks as the heap lists them
            free = [b["size"] for seg in vramguard._core.device_heap(report.device).segments()
                    for b in seg["blocks"] if b["state"] == "free"]
            v.add(line, same_size(m.group(1), sum(free) - max(free)), {"free_blocks": len(free)})
            continue
        if m:
            v.skip(line, "under the arena a free block spans unmapped pages: the heap's list does not say "
                         "which are mapped")
            continue
        if line.startswith("Where: "):
            v.skip(line, "read from the traceback's frames: test_oom_report_torch holds each phase against "
                         "the call that failed")
            continue
        if line.startswith(("Budget:", "  by ", "Cached free", "Reserved but", "So what", "What was")):
            v.skip(line, "the allocator's own bookkeeping at the failure, which torch's counters read too: "
                         "exact bytes after known sequences are test_oom_report.py's")


def _check_non_releasable(v, lines):
    for line in lines:
        m = re.match(rf"Non-releasable memory: {SIZE}$", line)
        if m:
            left = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
            v.add(line, same_size(m.group(1), left), {"cached_after_empty_cache": left})


def _check_advice(v, report, lines, step):
    for line in lines:
        m = re.match(r"  \d+\. (.*) \((.*)\)$", line)
        if not m:
            continue
        title, saves = m.group(1), m.group(2)
        if "enough alone" in saves or "saves about" in saves:
            v.add(line, False, "an estimated saving")
            continue
        b = re.match(r"Lower the batch size to ([\d,]+) at most", title)
        if b and saves == "measured to fit":
            batch = int(b.group(1).replace(",", ""))
            try:
                step(batch)
                ok = True
            except torch.OutOfMemoryError:
                ok = False
            v.add(line, ok, {"ran_batch": batch, "fits": ok})
            continue
        if saves.endswith("cached free outside the largest free block"):
            continue  # held at the failure, by _check_facts
        if saves == "no estimate":
            v.skip(line, "no figure: the dry run's remedies (measure_remedies) measure what it frees")
            continue
        if saves.startswith("frees at least"):
            v.skip(line, "a lower bound: a scenario that knows the leak drops it and measures what comes back")
        elif saves.startswith("saves up to"):
            v.skip(line, "an upper bound: holding it needs the change applied (the free pieces joined); not here")
        else:
            v.skip(line, "a figure of a kind the harness has no check for yet")


def check_report(report, facts, step=None):
    """Verdicts on the report's lines; `step(batch)` runs the failing step
    at a batch the report names. Frees what it allocates; empties the cache
    (to hold non-releasable memory against what empty_cache leaves)."""
    v = Verdicts()
    lines = str(report).splitlines()
    if facts["allocated"] == report.live:
        _check_facts(v, report, facts, lines)
        torch.cuda.empty_cache()
        _check_non_releasable(v, lines)
    else:
        # the failing op's own temporaries were freed as the error left it:
        # the state the report describes is gone before any code can look
        why = (f"memory was freed between the failure and the except block ({facts['allocated']:,} bytes "
               f"allocated there, {report.live:,} at the failure): the failure's state cannot be measured")
        for line in lines:
            if re.match(r"(Short by|Live|Cached|Non-releasable|Budget|  by |Reserved but|So what)", line):
                v.skip(line, why)
    # advice is applied as a user would: once the failed call's frames are gone
    vramguard.recover()
    _check_advice(v, report, lines, step)
    for line in lines:
        if "saves about" in line or "enough alone" in line:
            v.add(line, False, "an estimated saving")
    return v


# ------------------------------------------------------------------ summary and recovery


def check_summary(v, text, search_ooms=0):
    """The summary's figures: the largest block served, the OOM count and
    the search's share of it, torch's own."""
    stats = torch.cuda.memory_stats()
    for row in summary_rows(text):
        m = re.match(rf"Largest block that could be allocated now: {SIZE}", row)
        if m:
            fits = vramguard._core.device_heap(torch.cuda.current_device()).largest_allocatable()
            v.add(row + " [printed]", same_size(m.group(1), fits), {"heap": fits})
            _largest_is_served(v, row, fits)
            continue
        m = re.match(r"So far: ([\d,]+) out-of-memory errors?(?: \((.*)\))?", row)
        if m:
            n = int(m.group(1).replace(",", ""))
            said = m.group(2) or ""
            k = re.search(r"of which ([\d,]+) (?:was|were)", said)
            searched = n if said.startswith(("all", "a find_max_batch")) else int(k.group(1)) if k else 0
            v.add(row, n == stats["num_ooms"] and searched == search_ooms,
                  {"num_ooms": stats["num_ooms"], "search_ooms": search_ooms})


def check_recovered(v, text, before, after):
    """"vramguard recovered X[, and gave Y of cached memory back ...]; Z
    still live" against torch's counters before and after recover()."""
    m = re.match(rf"vramguard recovered {SIZE}(?: \(.*?\))?(?:, and gave {SIZE} of cached memory back to the "
                 rf"devices?)?; {SIZE} still live", text)
    if not m:
        v.add(text, False, "not the recovery line's form")
        return
    freed, released, live = m.group(1), m.group(2), m.group(3)
    ok = (same_size(freed, before["allocated"] - after["allocated"]) and same_size(live, after["allocated"])
          and (released is None or same_size(released, before["reserved"] - after["reserved"])))
    v.add(text, ok, {"before": before, "after": after})


def training_verdicts(loss_of, opt, batch):
    """Verdicts of a training step that runs out of memory at `batch`:
    loss_of(batch) is its forward and loss, then backward and `opt`'s step;
    the report is checked in the except block (the advised batch run as
    that step), then the summary."""
    def step(b):
        loss_of(b).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    v = Verdicts()
    try:
        step(batch)
    except torch.OutOfMemoryError:
        v = check_report(vramguard.last_oom(), at_failure(), step)
    check_summary(v, str(vramguard.summary()))
    return v
