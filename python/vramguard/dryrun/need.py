"""Each allocator's need: the smallest device a dry run's script runs on.

Peak reserved is what a cache with room keeps, not what it needs: an
allocator on a large device holds on to freed blocks it would give back on
a small one. The need comes from the run's own recording (its memory
snapshot), replayed under the allocator's policy (vramguard.trace.replay:
min_budget, the smallest budget with no out-of-memory), plus what the
device held outside the allocator at the run's peak (the CUDA context, the
libraries' own memory), rounded up to the 16 MiB steps --min-memory's real
search takes. On the zoo the replay's answer is within 1% of that search.

Measured only from a complete recording of a run that reached its end: with
--no-snapshot there is none, a history ring that overflowed lost the start,
and a run that ran out of memory or failed recorded only part of the
program. `measure_need` says which in `need_unmeasured`.
"""
import os

__all__ = ["HISTORY_ENTRIES", "REPLAY_POLICY", "measure_need"]

HISTORY_ENTRIES = 200_000  # PyTorch's history ring in a dry run's child: bounded, as vramguard's is

#: The replay policy that stands for each allocator (bench/zoo.py's); vramguard's
#: arena is its default, segments when the run said so.
REPLAY_POLICY = {"native": "torch", "expandable": "torch-expandable", "vramguard": "arena"}


def _rounded(nbytes, granule):
    return -(-int(nbytes) // granule) * granule


def _one(snapshot, figures, context, policy, granule, history_entries):
    """(need bytes, None) for one recording, or (None, why not)."""
    from ..trace.importer import load_trace
    from ..trace.replay import min_budget

    if not snapshot or not os.path.isfile(snapshot):
        return None, "no recording (the snapshot was not written)"
    try:
        trace = load_trace(snapshot)
    except (OSError, ValueError) as exc:
        return None, f"its recording could not be read ({exc})"
    meta = trace.meta
    if meta.get("dropped_events"):
        return None, "the recording's ring overflowed (its start was lost)"
    if history_entries and (meta.get("source_events") or 0) >= history_entries:
        return None, "PyTorch's memory history overflowed (its start was lost)"
    # what the device held beside the allocator's reserve at its fullest: never less than the context
    outside = int(figures.get("device_peak_bytes") or 0) - int(figures.get("peak_reserved_bytes") or 0)
    outside = max(outside, context)
    try:
        budget = min_budget(trace, policy=policy, outside=outside)
    except (ValueError, RuntimeError) as exc:
        return None, f"the replay failed ({exc})"
    return _rounded(budget + outside, granule), None


def measure_need(run, snapshots, granule, history_entries):
    """Sets run["need_bytes"] (the largest of its ranks' needs; None when not
    measured), run["need_unmeasured"] (why not, else None) and
    run["need_policy"]. `snapshots`: the recording of each rank (one path
    for a single process). A run that ran out of memory needs more than
    its device: need_above_device is True then."""
    allocator = run.get("allocator")
    policy = "segments" if run.get("heap_policy") == "segments" else REPLAY_POLICY.get(allocator)
    run.update(need_bytes=None, need_policy=policy, need_above_device=False, need_unmeasured=None)
    # Nothing on the GPU and no failure: CUDA started by vramguard's install() is no use of it.
    unused = run.get("used_gpu") is False or run.get("used_cuda") is False
    if unused and run.get("fits") is None and not run.get("error") and not run.get("exit_status"):
        run["need_unmeasured"] = "the program never used the GPU"
        return run
    if run.get("fits") is False:
        run["need_above_device"] = True
        run["need_unmeasured"] = "it ran out of memory: it needs more than this device"
        return run
    if run.get("fits") is not True:
        run["need_unmeasured"] = "the script failed before its end"
        return run
    if policy is None:
        run["need_unmeasured"] = f"no replay policy for {allocator!r}"
        return run
    ranks = run.get("ranks") or [run]
    needs = []
    for snapshot, rank in zip(snapshots, ranks):
        need, why = _one(snapshot, rank, int(run.get("context_bytes") or 0), policy, granule, history_entries)
        if need is None:
            run["need_unmeasured"] = why
            return run
        needs.append(need)
    if not needs:
        run["need_unmeasured"] = "no recording (--no-snapshot)"
        return run
    run["need_bytes"] = max(needs)
    return run
