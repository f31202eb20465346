"""vramguard.last_oom(): the report of the last out-of-memory the installed
allocator raised, on any device, with advice ranked by what its numbers show.

The C core keeps the failure's record (what was asked for, the budget, the
device's answer) and the heap's state copied under its lock right after
(counters, fragmentation, live blocks by power of two). This module reads
that copy, adds what Python knows (the regions open at the failure, the
step boundaries and any leak, the lines holding memory when stacks are
recorded, a batch-size fit when one was noted) and builds the report.

Figures, one definition each (the summary's names):
  Live: allocated bytes (live blocks, as rounded by the allocator).
  Reserved: bytes held from the device. Cached: reserved - live.
  Cached free: reserved minus active bytes (a block freed but still in use
    by a stream is not free), in free blocks.
  Cached free in pieces: 1 - largest free block / cached free.
  Non-releasable memory: free blocks in segments that hold live blocks.
  Room: what more could have been reserved: the limit (the budget, else the
    device) minus reserved, no more than the device said was free.
  Short by: the request minus the most one request could have had (the
    largest free block, or the room).
  Activations: what the failing step added: the least that a scope open at
    the failure (the step under way, each region) had added since its start,
    plus the request: what batch size, autocast, checkpointing and
    accumulation act on. The least, because every such scope holds the
    failure, and a wider one holds what earlier code made too (a tensor from
    two cells before is not this step's activations).

Advice ranking: first what the numbers show to be the cause (a request
larger than the limit; a leak; free memory in pieces), the larger measured
saving or bound first; then what lowers the peak, a batch measured to fit
(or a noted fit) first, then in a fixed order. No advice states an estimated saving: a
figure is measured (a leak), a bound that holds ("up to"), or a batch
measured to fit. Where the failing call was (the backward pass, the
optimizer's step: oom_phase.py), what autocast it ran under
(torch/mode_watch.py) and the dtypes its frames held (oom_frames.py)
decide which advice applies; what does not is listed with the reason.
"""
import html
import sys

from .. import _core
from ..render.advice import fragmentation_so_what, non_releasable
from ..render import words
from .oom_card import autocast_advice_dtype, card_of
from .oom_measure import current_cell, ipython_shell
from .oom_frames import codes_of, failing_exception, frame_dtypes, holds_wide_floats, narrow_float_names
from .oom_phase import BACKWARD, OPTIMIZER, PHASE_WORDS, failing_phase
from ..torch.mode_watch import autocast_dtype_of, grad_off_of
from .oom_notes import (  # what the next report adds, noted by find_max_batch and the regions
    _built, _fit, _lock, _regions_at_oom, clear_batch_fit, lines_by_line, note_batch_fit, note_region_at_oom,
)
from .._units import format_size

__all__ = ["Advice", "OOMReport", "last_oom", "note_batch_fit", "clear_batch_fit"]

#: Region names that mean evaluation, where torch.no_grad() applies.
_EVAL_WORDS = ("eval", "valid", "test", "infer", "predict", "generat")


# ------------------------------------------------------------------ the report


class Advice:
    """One piece of advice: `key` names it (too_big, leak, empty_cache,
    arena, batch_size, autocast, checkpointing, accumulation, no_grad,
    optimizer), `saving` the bytes it frees as measured, at most with
    `up_to`, at least with `at_least` (None: no figure), `measured` whether
    what it names was measured to fit, `cause` whether the numbers show it
    to be the cause."""

    __slots__ = ("key", "title", "detail", "saving", "cause", "up_to", "at_least", "measured", "said")

    def __init__(self, key, title, detail, saving=None, cause=False, up_to=False, measured=False, at_least=False,
                 said=None):
        self.key, self.title, self.detail, self.saving, self.cause = key, title, detail, saving, cause
        # what the line says of `saving` when it is a fact, not a saving
        # (free memory in pieces: what a change frees depends on the tensors
        # between them too); it still ranks the advice
        self.said = said
        self.up_to = up_to  # the saving is an upper bound that holds, not an estimate
        self.at_least = at_least  # ... or a lower bound that holds
        self.measured = measured  # what it names was measured to fit

    def __repr__(self):
        saving = format_size(int(self.saving)) if self.saving is not None else None
        return f"Advice({self.key!r}, saving={saving}, cause={self.cause})"


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


class OOMReport:
    """What was asked for, what was live (by size class, by region, by
    line), what was cached and in how many pieces, the budget, and advice.
    str() is the text; a notebook shows it as HTML."""

    def __init__(self, record, regions=(), lines=None, steps=None, fit=None, dtypes=None, failed_batches=(),
                 fitted_batches=(), phase=None, autocast_dtype=None, card=None, grad_off=None):
        """dtypes: {dtype name: bytes} of the failing frames' CUDA tensors
        (oom_frames.frame_dtypes), None when unknown; failed_batches and
        fitted_batches: batch sizes measured to run out of memory and to fit
        (find_max_batch); phase: where the failing call was (oom_phase),
        None when not known; autocast_dtype: the dtype of the CUDA autocast
        region the error left (torch/mode_watch.py), None when none was
        seen; card: (name, compute capability) the advice is for, None when
        not known."""
        r = record
        self.seq = r["seq"]
        self.device = r["device"]
        self.requested = r["requested"]
        self.rounded = r["rounded"]
        self.budget = r["budget"]
        self.device_total = r["device_total"]
        self.device_free = r["device_free"]
        self.budget_refused = r["budget_refused"]
        self.limit = self.budget or self.device_total
        self.limit_name = "the budget" if self.budget else "the device"
        self.live = r["allocated"]
        self.reserved = r["reserved"]
        self.cached = max(self.reserved - self.live, 0)
        self.free_bytes = r["free_bytes"]
        self.largest_free_block = r["largest_free_block"]
        self.free_blocks = r["free_blocks"]
        self.segments = r["segments"]
        self.stats = dict(r["stats"])
        self.stats["fragmentation.external"] = (1 - self.largest_free_block / self.free_bytes) if self.free_bytes else 0.0
        self.stats["fragmentation.unused"] = (1 - self.live / self.reserved) if self.reserved else 0.0
        self.arena = bool(r["arena"])
        self.non_releasable = non_releasable(self.stats, self.arena)
        self.live_blocks = sum(row[2] for row in r["live_by_class"])
        self.live_by_class = sorted(r["live_by_class"], key=lambda row: -row[3])
        self.live_by_region = [(name, self.live - entry, peak) for name, entry, peak in regions]
        self.live_by_line = lines
        self.steps = steps
        self.fit = fit
        self.failed_batches = tuple(failed_batches)
        self.dtypes = dtypes
        self.wide_floats = holds_wide_floats(dtypes)
        self.fitted_batches = tuple(fitted_batches)
        self.phase = phase
        self.autocast_dtype = autocast_dtype
        self.grad_off = grad_off
        self.card = card
        self.not_advised = []  # [(what, why)]: advice left out, and why
        self.cell = current_cell(ipython_shell())  # the IPython cell running as the report is made, or None
        room = max(self.limit - self.reserved, 0)
        if self.device_total and not self.budget_refused:
            room = min(room, self.device_free)
        self.room = room
        # The allocator's own figure, the message's "largest block that could
        # be allocated now": the largest free block, or the room and what a
        # retry releases (idle segments; under the arena, free pages).
        self.available = r["largest_allocatable"]
        self.short_by = max(self.rounded - self.available, 0)
        self.activations = self._activations()
        self.advice = rank(self._advice())

    # -------------------------------------------------------------- figures

    def _scopes(self):
        """[(name, bytes added since it began)] of the scopes open at the
        failure: the step under way, then each region."""
        scopes = [("the step under way", max(self.live - self.steps[1], 0))] if self.steps is not None else []
        return scopes + [(f"region {name!r}", max(added, 0)) for name, added, _ in self.live_by_region]

    def _failing_scope(self):
        """The scope that added the least: the tightest around the failure."""
        scopes = self._scopes()
        return min(scopes, key=lambda scope: scope[1]) if scopes else None

    def _activations(self):
        scope = self._failing_scope()
        return scope[1] + self.rounded if scope is not None else None

    @property
    def leak(self):
        return self.steps[4] if self.steps is not None else None

    @property
    def fragmentation_is_cause(self):
        """The request would have fit had the cached free bytes been one piece."""
        return self.free_bytes + self.room >= self.rounded > self.available

    @property
    def too_big(self):
        return bool(self.limit) and self.rounded > self.limit

    # -------------------------------------------------------------- advice

    def _advice(self):
        """Advice states no estimated saving: a figure is one the allocator
        measured (a leak's bytes), a bound that holds ("up to": what the
        free pieces hold, what a region added), or a batch measured to fit;
        anything else has no figure, and what does not apply to this
        failure (its phase, its dtypes) is listed in not_advised."""
        out = []
        if self.too_big:
            # The request's dtype is not known: 16 bits only from what the
            # frames showed (a uint8 tensor gains nothing from autocast).
            precision = (f" The failing frames hold {self._dtype_text()} tensors: {self._autocast_call()} would keep "
                         f"32-bit float results in 16 bits." if self._autocast_applies() else "")
            out.append(Advice(
                "too_big", f"One tensor is larger than {self.limit_name}",
                f"The request ({format_size(self.rounded)}) alone is more than {self.limit_name} "
                f"({format_size(self.limit)}): no cache setting fits it. Make that tensor smaller: a smaller batch or "
                f"sequence length, or the operation in chunks.{precision}",
                None, cause=True))
        leak = self.leak
        if leak is not None:
            # What accumulated since the first boundary that shows it: the
            # leak holds that at least (what it held at that boundary too).
            out.append(Advice(
                "leak", f"Fix the leak: +{format_size(leak.bytes_per_step)} per step",
                leak.headline() + " Usual causes: " + "; ".join(leak.CAUSES) + ".",
                leak.accumulated, cause=True, at_least=True))
        if self.fragmentation_is_cause:
            pieces = self.free_bytes - self.largest_free_block
            out.append(Advice(
                "empty_cache", "Free dead tensors, then empty_cache()",
                f"{format_size(self.free_bytes)} was cached free in {words.count(self.free_blocks, 'piece')} between live tensors, "
                f"the largest {format_size(self.largest_free_block)}: enough in total for "
                f"{format_size(self.rounded)}, not in one piece. empty_cache() alone does not help (vramguard "
                "releases wholly free segments before an OOM); it does once the tensors between the pieces are "
                "gone: drop what the failed step holds (vramguard.recover(), or del and gc.collect()) and what is "
                "no longer needed, then vramguard.empty_cache(), so the next try reserves whole segments. Creating "
                "long-lived tensors (weights, optimizer state) first keeps the pieces from forming.",
                pieces, cause=True, said=f"{format_size(pieces)} cached free outside the largest free block"))
            if self.segments and not self.arena:
                out.append(Advice(
                    "arena", "Use the arena: install(arena=True)",
                    "The arena maps device pages into one address range, so free pieces join up whatever lies "
                    f"between them: of the {format_size(pieces)} cached free outside the largest block, the whole "
                    "2 MiB pages become usable.",
                    pieces, cause=True, said=f"{format_size(pieces)} cached free outside the largest free block"))
        out.extend(self._peak_advice())
        return out

    def _largest_batch(self, fixed, per_sample):
        """The largest batch the fit allows, below every batch measured to
        fail: never advise a batch already seen to run out of memory."""
        largest = int((self.limit - fixed) // per_sample) if self.limit > fixed else 0
        if self.failed_batches:
            largest = min(largest, min(self.failed_batches) - 1)
        return largest

    def _peak_advice(self):
        if self.too_big:
            # One tensor over the limit: advice 1 says what shrinks it; no
            # change to the rest can make it fit, and none is listed as left out.
            kept = [a for a in self._peak_advice_all() if a.key == "no_grad" and a.cause]
            self.not_advised.clear()
            return kept
        return self._peak_advice_all()

    def _not_advised(self, what, why):
        if (what, why) not in self.not_advised:
            self.not_advised.append((what, why))

    def _peak_advice_all(self):
        if self.phase == OPTIMIZER:
            return self._optimizer_advice()
        act = self.activations
        scope = self._failing_scope()
        act_text = (f"{scope[0]} had added {format_size(act)} (with the request)" if act is not None
                    else "vramguard.step() after each training step measures what a step adds")
        out = [self._batch_advice(act_text)]
        autocast = self._autocast_advice()
        if autocast is not None:
            out.append(autocast)
        out.append(Advice(
            "checkpointing", "Gradient checkpointing",
            "torch.utils.checkpoint (model.gradient_checkpointing_enable() in transformers) keeps only the inputs "
            "of each checkpointed block for backward and runs the block's forward again there to recompute the "
            "rest; how much it frees depends on the model.", None))
        out.append(Advice(
            "accumulation", "Gradient accumulation",
            "Half the batch per forward, two forwards per optimizer step (loss / 2, optimizer.step() every 2): "
            "the same effective batch, each forward's activations those of half the samples.", None))
        no_grad = self._no_grad_advice(act)
        if no_grad is not None:
            out.append(no_grad)
        return out

    def _batch_advice(self, act_text):
        if self.fit is None:
            return Advice(
                "batch_size", "Lower the batch size",
                f"Activations grow with the batch; {act_text}. vramguard.find_max_batch() measures the largest "
                "batch that fits.", None)
        fixed, per_sample, batch = self.fit
        by_fit = self._largest_batch(fixed, per_sample)
        failed = (f"; batch {min(self.failed_batches):,} was measured to run out of memory"
                  if self.failed_batches else "")
        in_use = f"; the batch in use was {batch:,}" if batch is not None else ""
        measured = [b for b in self.fitted_batches if b <= by_fit]
        if measured:
            largest = max(measured)
            return Advice(
                "batch_size", f"Lower the batch size to {largest:,} at most",
                f"Batch {largest:,} was measured to fit in this step (find_max_batch){failed}{in_use}. The "
                f"search's fit, memory = {format_size(int(fixed))} + {format_size(int(per_sample))} x batch, is "
                "the line through the batches that fitted.", None, measured=True)
        return Advice(
            "batch_size", f"Lower the batch size to {by_fit:,} at most",
            f"The fit noted for this step, memory = {format_size(int(fixed))} + {format_size(int(per_sample))} x "
            f"batch, says a batch of {by_fit:,} fits in {self.limit_name} ({format_size(self.limit)}){failed}"
            f"{in_use}; no batch was measured here: vramguard.find_max_batch() measures it.", None)

    def _autocast_applies(self):
        return self.autocast_dtype is None and self.wide_floats

    def _autocast_call(self):
        dtype = autocast_advice_dtype(self.card) or "float16"
        return f"torch.autocast('cuda', dtype=torch.{dtype})"

    def _autocast_advice(self):
        what = "Mixed precision (torch.autocast)"
        if self.autocast_dtype is not None:
            self._not_advised(what, f"the failing call already ran under torch.autocast ({self.autocast_dtype})")
            return None
        narrow = narrow_float_names(self.dtypes)
        if narrow:
            self._not_advised(what, f"the failing frames already hold {' and '.join(narrow[:2])} tensors: the "
                                    "program computes in 16 bits there")
            return None
        if not self.wide_floats:
            why = ("the failing frames' tensors are not mostly 32-bit floats" if self.dtypes else
                   "vramguard saw no tensor in the failing call's function frames, so it does not know their "
                   "dtypes (autocast changes only 32-bit floats; a training step in a function lets it see them)")
            self._not_advised(what, why)
            return None
        dtype = autocast_advice_dtype(self.card) or "float16"
        if self.card is None:
            card = "(bfloat16 instead on a card of compute capability 8.0 or more)"
        elif dtype == "float16":
            card = (f"({self.card[0]}, compute capability {self.card[1][0]}.{self.card[1][1]}, has no bfloat16 "
                    "tensor cores; with float16, scale the loss: torch.amp.GradScaler)")
        else:
            card = f"({self.card[0]}, compute capability {self.card[1][0]}.{self.card[1][1]}, runs bfloat16)"
        return Advice(
            "autocast", "Mixed precision: torch.autocast",
            f"The failing frames hold {self._dtype_text()} tensors: under {self._autocast_call()} {card} matrix "
            "products and convolutions compute in 16 bits and keep 16-bit results for backward; what it frees "
            "depends on the model, and the cast copies of the weights take memory too.", None)

    def _no_grad_advice(self, act):
        what = "torch.no_grad() for evaluation"
        if self.grad_off is not None:
            self._not_advised(what, f"the failing call already ran under {self.grad_off}")
            return None
        if self.phase == BACKWARD:
            self._not_advised(what, "the failure came in the backward pass, which needs the activations "
                                    "torch.no_grad() would not keep")
            return None
        in_eval = any(any(w in name.lower() for w in _EVAL_WORDS) for name, _, _ in self.live_by_region)
        if in_eval:
            return Advice(
                "no_grad", what,
                "The failure came inside an evaluation region: without torch.no_grad() (or "
                "torch.inference_mode()) every activation is kept for a backward that never comes.",
                act, cause=True, up_to=True)
        return Advice(
            "no_grad", what,
            "If this ran in evaluation: torch.no_grad() (or torch.inference_mode()) keeps no activations for "
            "backward.", None)

    def _optimizer_advice(self):
        self._not_advised("A smaller batch, torch.autocast, gradient checkpointing or accumulation",
                          "the failure came in the optimizer's step, after backward had freed the activations "
                          "they act on")
        return [Advice(
            "optimizer", "Smaller optimizer state",
            "The failure came in the optimizer's step: what it holds is the parameters, their gradients and "
            "the optimizer's state, which Adam and AdamW create at the first step, two values per parameter. "
            "bitsandbytes' 8-bit optimizers (bitsandbytes.optim.AdamW8bit) keep each of those values in one byte; "
            "foreach=False updates one parameter at a time instead of all of them at once.", None)]

    def _dtype_text(self):
        names = sorted(self.dtypes, key=lambda name: -self.dtypes[name])
        return " and ".join(name.replace("torch.", "") for name in names[:2])

    # -------------------------------------------------------------- text

    def headline(self):
        who = self.limit_name if self.budget_refused or not self.budget else "the device"
        return (f"Out of memory on device {self.device}: asked for {format_size(self.requested)}"
                f" ({format_size(self.rounded)} as a block); {who} said no.")

    def _sections(self):
        """[(title, [lines])], shared by the text and the HTML."""
        limit = (f"{_budget_text(self.budget)} on {words.a(format_size(self.device_total) + ' device')}" if self.budget
                 else f"no budget: the {format_size(self.device_total)} device")
        facts = [
            f"Short by: {format_size(self.short_by)} (the most one request could have had: "
            f"{format_size(self.available)})",
            f"Budget: {limit}; room to reserve more: {format_size(self.room)}"
            + (f"; {format_size(self.device_free)} free on the device" if self.device_total else ""),
        ]
        if self.phase is not None:
            facts.append(f"Where: {PHASE_WORDS[self.phase]}")
        live = [f"Live: {format_size(self.live)} in {_blocks(self.live_blocks)}"]
        for lower, upper, blocks, nbytes in self.live_by_class[:_CLASSES_SHOWN]:
            span = f"{format_size(lower)} to {format_size(upper)}" if upper else f"{format_size(lower)} and more"
            live.append(f"  by size class, {span}: {format_size(nbytes)} in {_blocks(blocks)}")
        rest = self.live_by_class[_CLASSES_SHOWN:]
        if rest:  # every live byte is in some line: the smaller classes in one
            live.append(f"  by size class, {words.count(len(rest), 'other class', 'other classes')}: "
                        f"{format_size(sum(row[3] for row in rest))} in {_blocks(sum(row[2] for row in rest))}")
        for name, added, peak in self.live_by_region:
            live.append(f"  by region, {name}: +{format_size(max(added, 0))} since it began (its peak "
                        f"{format_size(peak)})")
        if self.live_by_line:
            for label, nbytes, blocks in self.live_by_line:
                live.append(f"  by line, {label}: {format_size(nbytes)} in {_blocks(blocks)}")
        else:
            live.append("  by line: vramguard.record(stacks=True) shows which lines")
        if self.steps is not None:
            steps, boundary, _, _, _ = self.steps
            live.append(f"  at the last step boundary (step {steps}): {format_size(boundary)}")
        held = (f"mapped in {words.count(self.segments, 'range')}" if self.arena
                else f"reserved in {words.count(self.segments, 'segment')}")  # the error message's words
        cached = [
            f"Cached (reserved but not allocated): {format_size(self.cached)} of {format_size(self.reserved)} "
            f"{held}",
            f"Cached free: {format_size(self.free_bytes)} in {_blocks(self.free_blocks)}, largest free block "
            f"{format_size(self.largest_free_block)}",
            f"Cached free in pieces (1 - largest free block / cached free): {_pct(self.stats['fragmentation.external'])}",
            f"Reserved but not allocated (1 - allocated / reserved): {_pct(self.stats['fragmentation.unused'])}",
            f"Non-releasable memory: {format_size(self.non_releasable)}",
            fragmentation_so_what(self.stats),
        ]
        return [("", facts), ("What was live", live), ("What was cached", cached)]

    def _advice_lines(self):
        out = []
        for advice in self.advice:
            # No "enough alone": what a change frees can merge with free
            # neighbours, so only a run says whether the request then fits.
            if advice.said is not None:
                saves = advice.said
            elif advice.measured:
                saves = "measured to fit"
            elif advice.saving is None:
                saves = "no estimate"
            elif advice.up_to:
                saves = f"saves up to {format_size(int(advice.saving))}"
            elif advice.at_least:
                saves = f"frees at least {format_size(int(advice.saving))}"
            else:
                saves = f"frees {format_size(int(advice.saving))}"
            out.append((advice.title, saves, advice.detail))
        return out

    def __str__(self):
        out = [self.headline()]
        for title, lines in self._sections():
            if title:
                out.append(title + ":")
            out += lines
        out.append(f"Advice, most useful first (short by {format_size(self.short_by)}):")
        for n, (title, saves, detail) in enumerate(self._advice_lines(), 1):
            out.append(f"  {n}. {title} ({saves})")
            out.append(f"     {detail}")
        if self.not_advised:
            out.append("Not advised here:")
            out += [f"  {what}: {why}." for what, why in self.not_advised]
        out.append(self.measure_line())
        return "\n".join(out)

    def measure_remedies(self, cell=None, out=None, steps=None, timeout=None):
        """Measures the standard remedies on this session's cells (up to
        `cell`, default the one this report was made in) on a phantom of
        this card, in a CPU subprocess: the table and the cheapest change
        that fits, shown in the cell as they come (oom_measure.py). `steps`
        and `timeout` stop each run early, as the dry run's do. Returns a
        MeasuredRemedies."""
        from .oom_measure import measure_remedies

        return measure_remedies(self, cell, out, steps=steps, timeout=timeout)

    def measure_line(self):
        """The call or the dry-run command that measures the remedies on
        this program."""
        from .oom_dryrun import command_line

        if self.cell is not None:  # an IPython session: its own cells, no path needed
            return ("Measure the remedies on this session's cells, without a GPU: "
                    "vramguard.last_oom().measure_remedies()")

        name = None
        torch = sys.modules.get("torch")  # an out-of-memory came from it: it is imported
        try:
            name = torch.cuda.get_device_name(self.device) if torch is not None else None
        except Exception:  # the device cannot say: the total names the card
            pass
        return command_line(name, self.device_total)

    def __repr__(self):
        return str(self)

    def _repr_html_(self):
        e = html.escape
        parts = [f"<p><b>{e(self.headline())}</b></p>"]
        for title, lines in self._sections():
            if title:
                parts.append(f"<p><b>{e(title)}</b></p>")
            parts.append("<ul>" + "".join(f"<li>{e(line.strip())}</li>" for line in lines) + "</ul>")
        parts.append(f"<p><b>Advice, most useful first</b> (short by {e(format_size(self.short_by))})</p><ol>")
        for title, saves, detail in self._advice_lines():
            parts.append(f"<li><b>{e(title)}</b> ({e(saves)})<br>{e(detail)}</li>")
        parts.append("</ol>")
        if self.not_advised:
            parts.append("<p><b>Not advised here</b></p><ul>"
                         + "".join(f"<li>{e(what)}: {e(why)}.</li>" for what, why in self.not_advised) + "</ul>")
        parts.append(f"<p>{e(self.measure_line())}</p>")
        return "".join(parts)


_FIXED_ORDER = ("optimizer", "batch_size", "autocast", "checkpointing", "accumulation", "no_grad")


def rank(advice):
    """Causes first (a request over the limit before all, then the larger
    saving); then what lowers the peak: a noted batch fit first, then the
    larger saving, those without an estimate last, ties in a fixed order."""
    def key(a):
        fixed = _FIXED_ORDER.index(a.key) if a.key in _FIXED_ORDER else -1
        if a.cause:
            return (0, a.key != "too_big", -(a.saving or 0), fixed)
        fit_first = a.key == "batch_size" and a.title.startswith("Lower the batch size to")
        return (1, not fit_first, a.saving is None, -(a.saving or 0), fixed)

    return sorted(advice, key=key)


# ------------------------------------------------------------------ last_oom()


def _regions_for(record):
    from . import regions as _regions

    with _lock:
        noted = [(name, entry, peak) for device, name, entry, peak in _regions_at_oom.get(record["seq"], ())
                 if device == record["device"]]
    if noted:
        return noted[::-1]  # noted as they were left: innermost first
    return _regions.open_regions(record["device"])


def _fit_for(exc):
    """(fit, failed batches, fitted batches) when the noted fit was measured
    on the step that failed (its code is in the failure's traceback), or
    noted with no step; (None, (), ()) otherwise."""
    with _lock:
        fit, scoped, code = _fit["value"], _fit["scoped"], _fit["step"]
        failed, fitted = _fit["failed"], _fit["fitted"]
    if fit is None or (scoped and (code is None or code not in codes_of(exc))):
        return None, (), ()
    return fit, failed, fitted


def last_oom(exc=None):
    """The report of the last out-of-memory the installed allocator raised
    (any device), or None when there was none. The same object until the
    next one (what it shows by line is read the first time).

    exc: the out-of-memory error, when the caller has it (default: the one
    being handled, else the last uncaught one): its frames tell which step
    failed and the dtypes of its tensors."""
    from . import regions as _regions

    record = _core.last_oom()
    if record is None:
        return None
    with _lock:
        if _built["seq"] == record["seq"] and _built["report"] is not None:
            return _built["report"]
    failing = failing_exception(exc)
    if failing is not None and f"Tried to allocate {format_size(record['requested'])}" not in str(failing):
        failing = None  # another out-of-memory's exception: its frames say nothing of this one
    fit, failed, fitted = _fit_for(failing)
    report = OOMReport(record, _regions_for(record), lines_by_line(record["device"]),
                       _regions.step_figures(record["device"]), fit, frame_dtypes(failing), failed, fitted,
                       failing_phase(failing), autocast_dtype_of(failing), card_of(record), grad_off_of(failing))
    with _lock:
        _built["seq"], _built["report"] = record["seq"], report
    return report
