"""vramguard in IPython and Jupyter: recovery from an out-of-memory error in
the same notebook, and a one-line memory meter after each cell.

install() calls on_install(): in IPython it registers, with
set_custom_exc, a handler for the out-of-memory error vramguard's allocator
raises. The handler shows the traceback as IPython would, prints the OOM
report, then recover()s (recover.py) and prints how much came back, so the
next cell can run without a restart.

The same handler takes KeyboardInterrupt (Ctrl-C, or the notebook's stop
button): IPython keeps the interrupted cell's traceback, and with it every
tensor its frames held; the handler shows the traceback as IPython would,
drops those frames (not Out or _: nothing asked for memory back) and says
what came back and what is still live, when the interrupted frames held
any of it.

A handler registered before is kept: its exceptions still go to it (an OOM
too, when it asked for that type), ours runs after it. IPython unregisters
a custom handler that raises; ours never raises (a failure prints one line
and falls back to IPython's own traceback), and when the earlier handler
raises and IPython unregisters both, ours is registered again, alone.
"""
import sys

from .._core import format_size
from ..report import oom as _oom
from ..torch import install as _install

HANDLER_MARK = "_vramguard_custom_tb"  # the shell attribute naming our CustomTB
METER_MARK = "_vramguard_meter"


def current_shell():
    """The running IPython shell, or None (IPython is never imported here)."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return None
    try:
        return ipython.get_ipython()
    except Exception:
        return None


def oom_types():
    """The exception type vramguard's allocator raises for an OOM:
    torch.OutOfMemoryError through the shim, else RuntimeError."""
    import torch

    from ..torch import install as _torch

    shim = (_torch.install_state.get("hooks") or {}).get("oom_shim")
    if shim is not None and shim.address and hasattr(torch, "OutOfMemoryError"):
        return (torch.OutOfMemoryError,)
    return (RuntimeError,)


def on_install():
    """Called by install(): register the OOM handler when running in IPython."""
    shell = current_shell()
    if shell is not None and hasattr(shell, "set_custom_exc"):
        register_oom_handler(shell)


def _after_install():
    on_install()


# install() (torch/install.py, a layer below, which does not import this
# module) calls what is in this list once it is done.
_install.on_install_hooks.append(_after_install)


def is_registered(shell):
    ours = getattr(shell, HANDLER_MARK, None)
    return ours is not None and getattr(shell, "CustomTB", None) is ours


def register_oom_handler(shell, types=None):
    """Register the handler in `shell`, chained to the one already there;
    registering again while ours is in place does nothing."""
    if is_registered(shell):
        return False
    types = tuple(types or oom_types() + (KeyboardInterrupt,))
    previous_types = tuple(getattr(shell, "custom_exceptions", ()) or ())
    previous = getattr(shell, "CustomTB", None) if previous_types else None
    handler = _make_handler(types, previous_types, previous)
    shell.set_custom_exc(previous_types + tuple(t for t in types if t not in previous_types), handler)
    setattr(shell, HANDLER_MARK, shell.CustomTB)
    return True


def _make_handler(types, previous_types, previous):
    from ..torch import install as _torch

    def vramguard_oom_handler(shell, etype, value, tb, tb_offset=None):
        shown = False
        try:
            if previous is not None and issubclass(etype, previous_types):
                shown = _call_previous(shell, previous, etype, value, tb, tb_offset, types)
            if not shown:
                shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
                shown = True
            if issubclass(etype, types) and _torch.is_oom(value):
                _report_and_recover(shell, value)
            elif issubclass(etype, KeyboardInterrupt) and issubclass(etype, types):
                _recover_after_interrupt(shell, value)
        except Exception as failure:  # IPython would unregister us, and the chain with us
            print(f"vramguard: the exception handler failed ({failure!r})", file=sys.stderr)
            if not shown:
                shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
        return []

    return vramguard_oom_handler


def _call_previous(shell, previous, etype, value, tb, tb_offset, types):
    """Runs the earlier handler; True when it showed the exception. When it
    raised, IPython printed that and unregistered every custom handler: ours
    comes back alone, and the traceback is shown by us."""
    try:
        previous(etype, value, tb, tb_offset=tb_offset)
        failed = False
    except Exception as exc:  # IPython's wrapper catches; a bare callable may not
        print(f"vramguard: the earlier exception handler failed: {exc!r}", file=sys.stderr)
        failed = True
    if not tuple(getattr(shell, "custom_exceptions", ()) or ()):
        failed = True
        setattr(shell, HANDLER_MARK, None)
        register_oom_handler(shell, types)
    return not failed


def _report_and_recover(shell, exc):
    """Prints the OOM report, recovers and prints the figures. Never raises:
    a failure here must not cost the user the shell's own traceback."""
    try:
        _show(_oom_report(exc))
        print(_recover_now(shell, exc))
    except Exception as failure:
        print(f"vramguard: could not recover after the out-of-memory error ({failure!r}); "
              "call vramguard.recover() to try again", file=sys.stderr)


def _recover_after_interrupt(shell, exc):
    """Drops the interrupted frames and prints the figures when they held
    GPU memory. Never raises (as _report_and_recover)."""
    try:
        from .recover import recover

        recovered = recover(exc=exc, shell=shell, outputs=False)
        if recovered.freed > recovered.workspaces:  # the frames held some: say so, else stay quiet
            print(f"After the interrupt, {recovered}")
    except Exception as failure:
        print(f"vramguard: could not free what the interrupted cell held ({failure!r}); "
              "call vramguard.recover() to try again", file=sys.stderr)


def _oom_report(exc):
    last_oom = getattr(_oom, "last_oom", None)
    report = last_oom() if callable(last_oom) else None
    return report if report is not None else str(exc)


def _show(report):
    """HTML in a notebook when the report has it; text elsewhere."""
    if isinstance(report, str) and not hasattr(report, "_repr_html_"):
        print(report)
        return
    from IPython.display import display

    display(report)


def _recover_now(shell, exc):
    from .recover import recover

    return recover(exc=exc, shell=shell)


# ------------------------------------------------------------------ meter


class CellMeter:
    """pre_run_cell / post_run_cell: one line per cell with what the cell
    added to the live memory, its own peak (a probe like a region's, so the
    peaks PyTorch reports are left alone) against the budget or the device,
    and the cache. Reads the current device."""

    def __init__(self, shell):
        self.shell = shell
        self.probe = None

    def _device(self):
        import torch

        return torch.cuda.current_device()

    def begin(self, *args):
        from ..report.peak_probe import PeakProbe

        self._close()
        try:
            self.probe = PeakProbe(self._device())
        except Exception:
            self.probe = None

    def _close(self):
        probe, self.probe = self.probe, None
        return probe.close() if probe is not None else None

    def stop(self):
        """The meter is replaced or turned off: its probe stops following
        the heap (an open one would stay among the device's open frames)."""
        try:
            self._close()
        except Exception as failure:  # turning the meter off must not fail on it
            print(f"vramguard meter: {failure!r}", file=sys.stderr)

    def end(self, *args):
        try:
            print(self.line())
        except Exception as failure:
            print(f"vramguard meter: {failure!r}", file=sys.stderr)

    def line(self):
        from ..torch import install as _torch

        start = self.probe.live_at_start if self.probe is not None else None
        closed = self._close()
        s = _torch.stats(self._device())
        live, reserved = s["allocated_bytes.all.current"], s["reserved_bytes.all.current"]
        peak = closed[0] if closed is not None else s["allocated_bytes.all.peak"]
        ceiling = s["budget_bytes"] or s["device_total_bytes"]
        delta = live - (live if start is None else start)
        sign = "-" if delta < 0 else "+"
        return (f"this cell: {sign}{format_size(abs(delta))} live, peak {format_size(peak)}"
                f" / {format_size(ceiling)}, cache {format_size(reserved - live)}")


def meter(on=True):
    """Print a line after each cell: "this cell: +1.20 GiB live, peak
    13.10 GiB / 14.35 GiB, cache 800.00 MiB": the peak is the cell's own,
    and the peaks PyTorch reports are left as they are. meter(False) turns
    it off."""
    from ..torch import install as _torch

    shell = current_shell()
    if shell is None:
        raise _torch.VramguardError(
            "vramguard.meter() prints after each cell of IPython or Jupyter; elsewhere print "
            "vramguard.summary() where you want the figures")
    current = getattr(shell, METER_MARK, None)
    if current is not None:
        for event, callback in (("pre_run_cell", current.begin), ("post_run_cell", current.end)):
            if callback in shell.events.callbacks[event]:
                shell.events.unregister(event, callback)
        current.stop()
        setattr(shell, METER_MARK, None)
    if not on:
        return None
    _torch.require_installed()
    cell_meter = CellMeter(shell)
    cell_meter.begin()  # the cell that turns it on is measured from here
    shell.events.register("pre_run_cell", cell_meter.begin)
    shell.events.register("post_run_cell", cell_meter.end)
    setattr(shell, METER_MARK, cell_meter)
    return None
