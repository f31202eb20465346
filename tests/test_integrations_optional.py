"""vramguard.integrations without the libraries: importing vramguard imports
neither transformers nor lightning, a callback whose library is missing
says what to install, and the HF callback's logging follows the
TrainerCallback protocol (here over a stand-in base class and a simulated
heap; tests/torch/test_integrations.py runs both callbacks in the real
libraries)."""
import subprocess
import sys
import textwrap
import types

import pytest

import vramguard
from vramguard import integrations


def run(code):
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_importing_vramguard_imports_neither_library():
    out = run("""
        import sys, vramguard, vramguard.integrations
        from vramguard.integrations import *
        print(sorted(m for m in ("transformers", "lightning", "pytorch_lightning") if m in sys.modules))
    """)
    assert out.strip() == "[]"


def test_a_missing_library_is_named_with_what_to_install():
    out = run("""
        import sys
        for name in ("transformers", "lightning", "pytorch_lightning"):
            sys.modules[name] = None   # import fails, installed or not
        import vramguard.integrations as integrations
        for name in ("HFCallback", "LightningCallback"):
            try:
                getattr(integrations, name)
            except ImportError as e:
                print(e)
    """)
    assert out.splitlines() == [
        "vramguard.integrations.HFCallback needs transformers, which is not installed (pip install transformers)",
        "vramguard.integrations.LightningCallback needs Lightning, which is not installed (pip install lightning)",
    ]


def test_unknown_name():
    with pytest.raises(AttributeError, match="no attribute 'Callback'"):
        integrations.Callback


def test_step_figures_from_stats():
    heap = vramguard.Heap("1GiB")
    heap.malloc(1000)
    figures = integrations.step_figures(stats=heap.stats())
    assert figures == {
        "vramguard/allocated_bytes": 1024, "vramguard/reserved_bytes": 2 << 20,
        "vramguard/peak_allocated_bytes": 1024, "vramguard/peak_reserved_bytes": 2 << 20,
        "vramguard/ooms": 0, "vramguard/cached_free_in_pieces": 0.0,
        "vramguard/reserved_unallocated": 1 - 1024 / (2 << 20),
    }
    assert list(integrations.step_figures(prefix="mem.", stats=heap.stats()))[0] == "mem.allocated_bytes"


@pytest.fixture
def hf_callback(monkeypatch):
    """HFCallback over a stand-in transformers module, reading a simulated heap."""
    stand_in = types.ModuleType("transformers")
    stand_in.TrainerCallback = type("TrainerCallback", (), {})
    monkeypatch.setitem(sys.modules, "transformers", stand_in)
    monkeypatch.delitem(integrations._built, "HFCallback", raising=False)
    heap = vramguard.Heap("1GiB")
    monkeypatch.setattr(vramguard.torch.install, "stats", lambda device=None: heap.stats())
    yield integrations.HFCallback, heap
    integrations._built.pop("HFCallback", None)


def test_hf_callback_adds_the_figures_of_the_last_step_to_the_logs(hf_callback):
    HFCallback, heap = hf_callback
    callback = HFCallback()
    state = types.SimpleNamespace(global_step=1, log_history=[])
    heap.malloc(1000)
    callback.on_step_end(None, state, None)
    heap.malloc(5000)  # after the step's end: not in this step's figures
    logs = {"loss": 0.5}
    state.log_history.append({**logs, "step": 1})  # as Trainer.log() stores it before on_log
    callback.on_log(None, state, None, logs=logs)
    assert logs["vramguard/allocated_bytes"] == 1024
    assert state.log_history[-1]["vramguard/allocated_bytes"] == 1024
    assert state.log_history[-1]["loss"] == 0.5


def test_hf_callback_before_any_step_adds_nothing(hf_callback):
    HFCallback, _ = hf_callback
    logs = {"loss": 0.5}
    HFCallback().on_log(None, types.SimpleNamespace(global_step=0, log_history=[]), None, logs=logs)
    assert logs == {"loss": 0.5}


def test_hf_callback_refuses_to_train_before_install(hf_callback):
    HFCallback, _ = hf_callback
    if vramguard.is_installed():
        pytest.skip("the allocator is installed in this process")
    with pytest.raises(vramguard.VramguardError, match=r"call vramguard.install\(\) first"):
        HFCallback().on_train_begin(None, None, None)
