"""recover()'s parts that need no GPU: which references it drops and which
it must leave alone (the kernel tests are in tests/torch/test_recover_kernel.py)."""
import sys
import weakref

import pytest

import vramguard
from vramguard.notebook import recover as _recover


class Held:
    pass


def _raise_in_function():
    activation = Held()  # noqa: F841  what the frame holds
    raise RuntimeError("out of memory")


def _caught(fn, *args):
    try:
        fn(*args)
    except RuntimeError as exc:
        return exc
    raise AssertionError("did not raise")


def test_a_functions_locals_and_their_snapshot_are_dropped():
    exc = _caught(_raise_in_function)
    frame = exc.__traceback__.tb_next.tb_frame
    snapshot = frame.f_locals  # what a traceback formatter reads
    alive = weakref.ref(snapshot["activation"])
    _recover.clear_exception_frames(exc)
    assert alive() is None


def test_namespaces_are_never_emptied():
    """exec() with its own locals (IPython.embed's cells run so) and a
    module's globals are the namespaces themselves, not snapshots."""
    namespace = {"kept": Held()}
    exc = _caught(exec, "kept2 = 1\nraise RuntimeError('out of memory')", {}, namespace)
    _recover.clear_exception_frames(exc)
    assert sorted(namespace) == ["kept", "kept2"]
    module_globals = {"__name__": "cell"}
    exc = _caught(exec, "x = 1\nraise RuntimeError('out of memory')", module_globals)
    _recover.clear_exception_frames(exc)
    assert module_globals["x"] == 1


def test_chained_exceptions_are_cleared_too():
    def outer():
        try:
            _raise_in_function()
        except RuntimeError as inner:
            raise ValueError("while handling") from inner

    try:
        outer()
    except ValueError as exc:
        tb = exc.__cause__.__traceback__
        while tb.tb_next is not None:
            tb = tb.tb_next
        inner_frame = tb.tb_frame
        alive = weakref.ref(inner_frame.f_locals["activation"])
        _recover.clear_exception_frames(exc)
    assert alive() is None


def test_the_last_exception_is_forgotten(monkeypatch):
    exc = _caught(_raise_in_function)
    alive = weakref.ref(exc.__traceback__.tb_next.tb_frame.f_locals["activation"])
    for name, value in (("last_type", type(exc)), ("last_value", exc), ("last_traceback", exc.__traceback__)):
        monkeypatch.setattr(sys, name, value, raising=False)
    del exc
    _recover.drop_last_exception()
    assert sys.last_type is None and sys.last_value is None and sys.last_traceback is None
    assert alive() is None


def test_without_torch_nothing_is_a_cuda_tensor(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert not _recover.holds_cuda([object()])
    assert _recover.drop_ipython_outputs(None) == 0


def test_recover_needs_vramguard_installed():
    with pytest.raises(vramguard.VramguardError, match="vramguard is not installed: call vramguard.install"):
        vramguard.recover()


def test_meter_needs_ipython():
    with pytest.raises(vramguard.VramguardError, match=r"vramguard.meter\(\) prints after each cell of IPython"):
        vramguard.meter()


def test_recovered_figures_read_as_text():
    r = _recover.Recovered(freed=464 << 20, released=464 << 20, live=16 << 20, cached=0)
    assert str(r) == "vramguard recovered 464.00 MiB; 16.00 MiB still live"
    r = _recover.Recovered(freed=3 << 30, released=0, live=2 << 30, cached=4 << 20)
    assert str(r) == ("vramguard recovered 3.00 GiB; 2.00 GiB still live, 4.00 MiB cached in segments "
                      "that live blocks share")
    assert repr(r) == "Recovered(freed=3.00 GiB, released=0 bytes, live=2.00 GiB, cached=4.00 MiB)"
    # the cache given back is said where it is more than the tensors freed (a failed step's segments)
    r = _recover.Recovered(freed=0, released=15 << 30, live=6 << 30, cached=0)
    assert str(r) == ("vramguard recovered 0 bytes, and gave 15.00 GiB of cached memory back to the device; "
                      "6.00 GiB still live")
    r = _recover.Recovered(freed=1 << 30, released=3 << 30, live=0, cached=0)
    assert str(r) == ("vramguard recovered 1.00 GiB, and gave 3.00 GiB of cached memory back to the device; "
                      "0 bytes still live")
    two = [_recover.DeviceLeft(0, 0, 0), _recover.DeviceLeft(1, 0, 0)]
    r = _recover.Recovered(freed=0, released=1 << 30, live=0, cached=0, devices=two)
    assert str(r) == "vramguard recovered 0 bytes, and gave 1.00 GiB of cached memory back to the devices; " \
                     "0 bytes still live"


def test_recovered_names_the_holders_per_device():
    Left, MiB, GiB = _recover.DeviceLeft, 1 << 20, 1 << 30
    one = _recover.Recovered(freed=0, released=0, live=6 * GiB, cached=0,
                             devices=[Left(0, 6 * GiB, 0, [("x", 6 * GiB)])])
    assert str(one) == "vramguard recovered 0 bytes; 6.00 GiB still live, held by x (6.00 GiB)"
    many = _recover.Recovered(freed=MiB, released=0, live=7 * GiB, cached=0, devices=[
        Left(0, 7 * GiB, 0, [("x", 4 * GiB), ("model", 2 * GiB), ("opt", GiB - 10 * MiB)], 10 * MiB)])
    assert str(many) == ("vramguard recovered 1.00 MiB; 7.00 GiB still live, held by x (4.00 GiB), model "
                         "(2.00 GiB), opt (1014.00 MiB), and 10.00 MiB by objects vramguard cannot name")
    small = _recover.Recovered(freed=0, released=0, live=MiB, cached=0,
                               devices=[Left(0, MiB, 0, [("x", MiB - 512)], 512)])
    assert str(small) == "vramguard recovered 0 bytes; 1.00 MiB still live, held by x (1023.50 KiB)"
    two = _recover.Recovered(freed=0, released=0, live=4 * GiB, cached=0, devices=[
        Left(0, GiB, 0, [("a", GiB)]), Left(1, 3 * GiB, 0, [("b", 3 * GiB)])])
    assert str(two) == ("vramguard recovered 0 bytes; 1.00 GiB still live on GPU 0, held by a (1.00 GiB); "
                        "3.00 GiB still live on GPU 1, held by b (3.00 GiB)")
    none = _recover.Recovered(freed=0, released=0, live=0, cached=0, devices=[Left(0, 0, 0), Left(1, 0, 0)])
    assert str(none) == "vramguard recovered 0 bytes; 0 bytes still live"
    torch_own = _recover.Recovered(freed=(16 << 20) + (256 << 10), released=0, live=0, cached=0,
                                   workspaces=(16 << 20) + (256 << 10), devices=[Left(0, 0, 0)])
    assert str(torch_own) == ("vramguard recovered 16.25 MiB (16.25 MiB of it PyTorch's own cuBLAS workspaces, "
                              "which it makes again at the next matrix multiply); 0 bytes still live")


def test_with_no_variable_found_the_lines_hold_it(monkeypatch):
    """Nothing in the namespace holds CUDA memory (it sits in objects, or in
    a script's functions): with stacks recorded, the lines that made it."""
    from vramguard.report import oom_notes
    MiB = 1 << 20
    monkeypatch.setattr(oom_notes, "lines_by_line", lambda device, top=5: [
        ("train.py:82 step", 96 * MiB, 12), ("model.py:10 forward", 40 * MiB, 1)][:top])
    stats = {0: {"allocated_bytes.all.current": 136 * MiB, "reserved_bytes.all.current": 140 * MiB},
             1: {"allocated_bytes.all.current": 0, "reserved_bytes.all.current": 0}}
    left = _recover._left_on([0, 1], stats.__getitem__, {"n": 3, "_": None})
    r = _recover.Recovered(freed=0, released=0, live=136 * MiB, cached=4 * MiB, devices=left)
    assert str(r) == ("vramguard recovered 0 bytes; 136.00 MiB still live on GPU 0, held by line train.py:82 step "
                      "(96.00 MiB), line model.py:10 forward (40.00 MiB), 4.00 MiB cached in segments that live "
                      "blocks share")
    monkeypatch.setattr(oom_notes, "lines_by_line", lambda device, top=5: None)
    (alone,) = _recover._left_on([0], stats.__getitem__, {})
    assert alone.text() == "136.00 MiB still live, 4.00 MiB cached in segments that live blocks share"
