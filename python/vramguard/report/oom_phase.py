"""Where in a training step the failing call was, for the out-of-memory
report (oom.py): in the backward pass, in an optimizer's step, in a
module's forward, or not known, read from the frames of the error's
traceback (the code the call ran through, never a guess from sizes).

Advice depends on it: torch.no_grad() is for a forward that needs no
backward, so it is no advice for a failure inside loss.backward(); and
by an optimizer's step backward has freed the activations, so what acts on
activations (a smaller batch, autocast, checkpointing) does not lower that
step's memory.
"""
import os

from .oom_frames import tracebacks

__all__ = ["BACKWARD", "OPTIMIZER", "FORWARD", "failing_phase", "PHASE_WORDS"]

BACKWARD, OPTIMIZER, FORWARD = "backward", "optimizer", "forward"

#: How the report names each phase.
PHASE_WORDS = {
    BACKWARD: "in the backward pass (loss.backward())",
    OPTIMIZER: "in the optimizer's step (optimizer.step())",
    FORWARD: "in a module's forward",
}

_SEP = os.sep
# (path part, function names or None for any): the frames that mean a phase.
_BACKWARD_FRAMES = (
    (f"{_SEP}torch{_SEP}autograd{_SEP}", ("backward", "grad", "_engine_run_backward")),
    (f"{_SEP}torch{_SEP}_tensor.py", ("backward",)),
)
_OPTIMIZER_FRAMES = (
    (f"{_SEP}torch{_SEP}optim{_SEP}", None),
    (f"{_SEP}bitsandbytes{_SEP}optim{_SEP}", None),
)
_FORWARD_FRAMES = ((f"{_SEP}torch{_SEP}nn{_SEP}modules{_SEP}module.py", ("_call_impl", "_wrapped_call_impl")),)


def _matches(code, frames):
    return any(part in code.co_filename and (names is None or code.co_name in names) for part, names in frames)


def _phase_of(code):
    if _matches(code, _BACKWARD_FRAMES):
        return BACKWARD
    if _matches(code, _OPTIMIZER_FRAMES):
        return OPTIMIZER
    if _matches(code, _FORWARD_FRAMES):
        return FORWARD
    return None


def failing_phase(exc):
    """BACKWARD, OPTIMIZER or FORWARD: the innermost of them among the
    frames of `exc`'s traceback and of the errors it was raised from (an
    optimizer's closure that runs backward failed in backward), or None
    when none is there or `exc` is None. An error being handled when `exc`
    was raised (__context__) is another call's: not read."""
    if exc is None:
        return None
    phase = None
    for tb in tracebacks(exc, context=False):  # outermost frame first
        phase = _phase_of(tb.tb_frame.f_code) or phase
    return phase
