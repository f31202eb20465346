"""The out-of-memory report's advice (oom.py's OOMReport): what to change,
built from the report's figures, and ranked.

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
from .._units import format_size
from ..render import words
from .oom_card import autocast_advice_dtype
from .oom_frames import narrow_float_names
from .oom_phase import BACKWARD, OPTIMIZER

__all__ = ["Advice", "advise", "rank"]

#: Region names that mean evaluation, where torch.no_grad() applies.
_EVAL_WORDS = ("eval", "valid", "test", "infer", "predict", "generat")

_FIXED_ORDER = ("optimizer", "batch_size", "autocast", "checkpointing", "accumulation", "no_grad")


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


def advise(report):
    """(the advice, ranked; [(what, why)] of the advice left out) for an
    OOMReport's figures."""
    adviser = _Adviser(report)
    return rank(adviser.advice()), adviser.not_advised


class _Adviser:
    """The advice for one report. Advice states no estimated saving: a
    figure is one the allocator measured (a leak's bytes), a bound that
    holds ("up to": what the free pieces hold, what a region added), or a
    batch measured to fit; anything else has no figure, and what does not
    apply to this failure (its phase, its dtypes) is listed in not_advised."""

    def __init__(self, report):
        self.report = report
        self.not_advised = []  # [(what, why)]: advice left out, and why

    def advice(self):
        return self._cause_advice() + self._peak_advice()

    def _not_advised(self, what, why):
        if (what, why) not in self.not_advised:
            self.not_advised.append((what, why))

    # -------------------------------------------------------------- causes

    def _cause_advice(self):
        """What the numbers show to be the cause."""
        out = []
        if self.report.too_big:
            out.append(self._too_big_advice())
        if self.report.leak is not None:
            out.append(self._leak_advice(self.report.leak))
        if self.report.fragmentation_is_cause:
            out.extend(self._pieces_advice())
        return out

    def _too_big_advice(self):
        r = self.report
        # The request's dtype is not known: 16 bits only from what the
        # frames showed (a uint8 tensor gains nothing from autocast).
        precision = (f" The failing frames hold {self._dtype_text()} tensors: {self._autocast_call()} would keep "
                     f"32-bit float results in 16 bits." if self._autocast_applies() else "")
        return Advice(
            "too_big", f"One tensor is larger than {r.limit_name}",
            f"The request ({format_size(r.rounded)}) alone is more than {r.limit_name} "
            f"({format_size(r.limit)}): no cache setting fits it. Make that tensor smaller: a smaller batch or "
            f"sequence length, or the operation in chunks.{precision}",
            None, cause=True)

    @staticmethod
    def _leak_advice(leak):
        # What accumulated since the first boundary that shows it: the
        # leak holds that at least (what it held at that boundary too).
        return Advice(
            "leak", f"Fix the leak: +{format_size(leak.bytes_per_step)} per step",
            leak.headline() + " Usual causes: " + "; ".join(leak.CAUSES) + ".",
            leak.accumulated, cause=True, at_least=True)

    def _pieces_advice(self):
        """Free memory in pieces: the request would have fit in one."""
        r = self.report
        pieces = r.free_bytes - r.largest_free_block
        said = f"{format_size(pieces)} cached free outside the largest free block"
        out = [Advice(
            "empty_cache", "Free dead tensors, then empty_cache()",
            f"{format_size(r.free_bytes)} was cached free in {words.count(r.free_blocks, 'piece')} between live tensors, "
            f"the largest {format_size(r.largest_free_block)}: enough in total for "
            f"{format_size(r.rounded)}, not in one piece. empty_cache() alone does not help (vramguard "
            "releases wholly free segments before an OOM); it does once the tensors between the pieces are "
            "gone: drop what the failed step holds (vramguard.recover(), or del and gc.collect()) and what is "
            "no longer needed, then vramguard.empty_cache(), so the next try reserves whole segments. Creating "
            "long-lived tensors (weights, optimizer state) first keeps the pieces from forming.",
            pieces, cause=True, said=said)]
        if r.segments and not r.arena:
            out.append(Advice(
                "arena", "Use the arena: install(arena=True)",
                "The arena maps device pages into one address range, so free pieces join up whatever lies "
                f"between them: of the {format_size(pieces)} cached free outside the largest block, the whole "
                "2 MiB pages become usable.",
                pieces, cause=True, said=said))
        return out

    # -------------------------------------------------------------- what lowers the peak

    def _peak_advice(self):
        if self.report.too_big:
            # One tensor over the limit: advice 1 says what shrinks it; no
            # change to the rest can make it fit, and none is listed as left out.
            kept = [a for a in self._peak_advice_all() if a.key == "no_grad" and a.cause]
            self.not_advised.clear()
            return kept
        return self._peak_advice_all()

    def _peak_advice_all(self):
        r = self.report
        if r.phase == OPTIMIZER:
            return self._optimizer_advice()
        act = r.activations
        scope = r.failing_scope()
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

    def _largest_batch(self, fixed, per_sample):
        """The largest batch the fit allows, below every batch measured to
        fail: never advise a batch already seen to run out of memory."""
        r = self.report
        largest = int((r.limit - fixed) // per_sample) if r.limit > fixed else 0
        if r.failed_batches:
            largest = min(largest, min(r.failed_batches) - 1)
        return largest

    def _batch_advice(self, act_text):
        r = self.report
        if r.fit is None:
            return Advice(
                "batch_size", "Lower the batch size",
                f"Activations grow with the batch; {act_text}. vramguard.find_max_batch() measures the largest "
                "batch that fits.", None)
        fixed, per_sample, batch = r.fit
        by_fit = self._largest_batch(fixed, per_sample)
        failed = (f"; batch {min(r.failed_batches):,} was measured to run out of memory"
                  if r.failed_batches else "")
        in_use = f"; the batch in use was {batch:,}" if batch is not None else ""
        measured = [b for b in r.fitted_batches if b <= by_fit]
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
            f"batch, says a batch of {by_fit:,} fits in {r.limit_name} ({format_size(r.limit)}){failed}"
            f"{in_use}; no batch was measured here: vramguard.find_max_batch() measures it.", None)

    # -------------------------------------------------------------- autocast

    def _autocast_applies(self):
        return self.report.autocast_dtype is None and self.report.wide_floats

    def _autocast_call(self):
        dtype = autocast_advice_dtype(self.report.card) or "float16"
        return f"torch.autocast('cuda', dtype=torch.{dtype})"

    def _autocast_advice(self):
        if not self._autocast_fits_the_frames():
            return None
        return Advice(
            "autocast", "Mixed precision: torch.autocast",
            f"The failing frames hold {self._dtype_text()} tensors: under {self._autocast_call()} "
            f"{self._autocast_card_text()} matrix "
            "products and convolutions compute in 16 bits and keep 16-bit results for backward; what it frees "
            "depends on the model, and the cast copies of the weights take memory too.", None)

    def _autocast_fits_the_frames(self):
        """Whether autocast is advice here; when not, why goes to not_advised."""
        r = self.report
        what = "Mixed precision (torch.autocast)"
        if r.autocast_dtype is not None:
            self._not_advised(what, f"the failing call already ran under torch.autocast ({r.autocast_dtype})")
            return False
        narrow = narrow_float_names(r.dtypes)
        if narrow:
            self._not_advised(what, f"the failing frames already hold {' and '.join(narrow[:2])} tensors: the "
                                    "program computes in 16 bits there")
            return False
        if not r.wide_floats:
            why = ("the failing frames' tensors are not mostly 32-bit floats" if r.dtypes else
                   "vramguard saw no tensor in the failing call's function frames, so it does not know their "
                   "dtypes (autocast changes only 32-bit floats; a training step in a function lets it see them)")
            self._not_advised(what, why)
            return False
        return True

    def _autocast_card_text(self):
        """What the card says of the 16-bit dtype, in parentheses."""
        card = self.report.card
        dtype = autocast_advice_dtype(card) or "float16"
        if card is None:
            return "(bfloat16 instead on a card of compute capability 8.0 or more)"
        if dtype == "float16":
            return (f"({card[0]}, compute capability {card[1][0]}.{card[1][1]}, has no bfloat16 "
                    "tensor cores; with float16, scale the loss: torch.amp.GradScaler)")
        return f"({card[0]}, compute capability {card[1][0]}.{card[1][1]}, runs bfloat16)"

    def _dtype_text(self):
        dtypes = self.report.dtypes
        names = sorted(dtypes, key=lambda name: -dtypes[name])
        return " and ".join(name.replace("torch.", "") for name in names[:2])

    # -------------------------------------------------------------- no_grad, the optimizer

    def _no_grad_advice(self, act):
        r = self.report
        what = "torch.no_grad() for evaluation"
        if r.grad_off is not None:
            self._not_advised(what, f"the failing call already ran under {r.grad_off}")
            return None
        if r.phase == BACKWARD:
            self._not_advised(what, "the failure came in the backward pass, which needs the activations "
                                    "torch.no_grad() would not keep")
            return None
        in_eval = any(any(w in name.lower() for w in _EVAL_WORDS) for name, _, _ in r.live_by_region)
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
