"""Every way a dry run's child can end leaves its figures (run.py), and
the child's signal handlers (SIGTERM: --timeout; SIGINT: the dry run's
Ctrl-C).

A script ends normally, or raises, and the child writes its figures after
it. But a script can also end the process where no Python after it runs:

- os._exit(n) (a script skipping a slow teardown, a launcher's worker);
- exit(n) from C (bitsandbytes' way when it cannot load), which runs C's
  exit handlers but not Python's;
- SIGTERM (torchrun ending the other ranks when one fails, `timeout`);
- SIGKILL, or a crash by a signal, where nothing of the process runs.

The first three each get a hook here that writes the figures, with how
the run ended and the user's line it ended at, before the process goes:
os._exit is wrapped, exit() calls back through the phantom's C handler
(vg_fakecuda_call_at_exit: C, so that a process forked from this one, or
one whose interpreter has finalized, never calls into Python), SIGTERM
gets a handler where the script set none. For the last, the child also
writes its figures as the run goes (after optimizer steps, at most twice a
second): a kill leaves the last step's. Writing them from a timer thread
instead would cover a kill between steps too, but a thread that may hold
PyTorch's allocator lock when the script forks a DataLoader worker can
deadlock that worker; the hooks cost nothing until the run ends.
"""
import ctypes
import os
import signal
import sys
import threading
import traceback

__all__ = ["Endings"]

_AT_EXIT = ctypes.CFUNCTYPE(None, ctypes.c_int)


class Endings:
    """Calls `write(ended, status, frames)` once when the process ends by
    os._exit, by exit() from C or by SIGTERM: `ended` says how ("os._exit(3)",
    "exit(1) from C", "SIGTERM"), `status` is the exit status it gives,
    `frames` the (filename, line) pairs of the ending call's stack,
    innermost first. Only in this process (not in one forked from it), and
    only while armed."""

    def __init__(self, write):
        self.write = write
        self.pid = os.getpid()
        self.real_exit = os._exit
        self.armed = False
        self.written = False
        self.lock = threading.Lock()
        self.callback = _AT_EXIT(self._c_exit)  # kept alive: C holds its address
        self.phantom = ctypes.CDLL(None)
        self.sigterm_was = None

    def arm(self):
        self.armed = True
        os._exit = self._os_exit
        self.rearm()
        torch = sys.modules.get("torch")
        lazy = getattr(getattr(torch, "cuda", None), "_lazy_call", None)
        if lazy is not None and not torch.cuda.is_initialized():
            lazy(self.rearm)  # once CUDA has started: see rearm
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            self.sigterm_was = signal.signal(signal.SIGTERM, self._sigterm)

    def rearm(self):
        """The C handler registered again: exit() runs the latest first,
        before the C++ destructors of PyTorch's CUDA state made since, which
        the figures read (registered only before, it would read them
        destroyed, and crash)."""
        arm_c = getattr(self.phantom, "vg_fakecuda_call_at_exit", None)
        if self.armed and arm_c is not None:
            arm_c.restype = None
            arm_c(self.callback)

    def disarm(self):
        """Before the child's own end: its own os._exit is no script's."""
        self.armed = False
        if os._exit is self._os_exit:
            os._exit = self.real_exit
        arm_c = getattr(self.phantom, "vg_fakecuda_call_at_exit", None)
        if arm_c is not None:
            arm_c.restype = None
            arm_c(_AT_EXIT())  # a null pointer: C calls nothing
        if self.sigterm_was is not None and signal.getsignal(signal.SIGTERM) == self._sigterm:
            signal.signal(signal.SIGTERM, self.sigterm_was)

    def _once(self, ended, status):
        if not self.armed or os.getpid() != self.pid:
            return
        with self.lock:
            if self.written:
                return
            self.written = True
        frames = [(fs.filename, fs.lineno) for fs in traceback.extract_stack()][::-1]
        try:
            self.write(ended, status, frames)
        except BaseException as exc:  # the process is ending: say why the figures are missing, go on
            try:
                print(f"vramguard dryrun: the figures were not written at {ended}: {exc}", file=sys.stderr)
            except BaseException:
                pass

    def _os_exit(self, status):
        code = _status(status)
        self._once(f"os._exit({status})", code)
        self.real_exit(status)

    def _c_exit(self, status):
        self._once(f"exit({status}) from C", status & 0xFF)

    def _sigterm(self, signum, frame):
        self._once("SIGTERM", 128 + signal.SIGTERM)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)  # ended by the signal, as without this handler


def _status(status):
    try:
        return int(status) & 0xFF
    except (TypeError, ValueError):
        return 1


# ------------------------------------------------------------------ signals


class Terminated(BaseException):
    """SIGTERM while the script ran (the dry run's --timeout): the run ends
    there, and its figures so far are written."""


def exit_code(code):
    if code is None:
        return 0
    if isinstance(code, bool):
        return int(code)
    if isinstance(code, int):
        return code & 0xFF
    return 1


#: Whether a SIGINT came: the dry run cancelling this run (on_sigint), not
#: the script raising KeyboardInterrupt itself.
_sigint_received = False


def on_sigterm(signum, frame):
    """The dry run's --timeout: the script stops where it is, as at
    --steps, and the figures so far are written. Once, then ignored: the
    figures are being written."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated()


def on_sigint(signum, frame):
    """Python's own SIGINT handler (KeyboardInterrupt), and a note that a
    SIGINT came: the dry run cancelling this run, not the script raising
    KeyboardInterrupt itself. A script's own handler replaces this."""
    global _sigint_received
    _sigint_received = True
    raise KeyboardInterrupt


def sigint_received():
    return _sigint_received
