"""Recovery from an out-of-memory error in the same notebook, and the cell
meter, in a real IPython kernel (nbclient) running the real PyTorch on the
fake CUDA: one 1 GiB device, vramguard installed with a 640 MiB budget.

Sizes are whole 2 MiB granules of at least 16 MiB, so every tensor has a
segment of its own size and the figures below are exact."""
import json
import os
import sys
import textwrap

import pytest

from fakegpu import run
from hookrun import SHARED_CACHE
from test_fakecuda_torch import preload

pytestmark = pytest.mark.torch

nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed (pip install -e '.[test]')")
nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (pip install -e '.[test]')")

MiB = 1 << 20

SETUP = """
import sys, torch, vramguard
MiB = 1 << 20
vramguard.install(budget="640MiB")

def step():
    a = torch.empty(400 * MiB, dtype=torch.uint8, device="cuda")
    b = torch.empty(400 * MiB, dtype=torch.uint8, device="cuda")  # 880 MiB live: over the budget
    return a, b
"""


def _kernel_manager(folder):
    """A kernel on this very interpreter (the one with torch and vramguard)."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    spec = folder / "vramguard-torch-tests"
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "vramguard torch tests", "language": "python",
    }))
    # The connection file in the test's folder, not a temporary file of the machine's that outlives the test.
    return KernelManager(kernel_name="vramguard-torch-tests",
                         kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(folder)]),
                         connection_file=str(folder / "connection.json"))


def run_cells(tmp_path, *cells, gpu_env=None):
    """Runs the cells in one fresh kernel on the fake CUDA, errors allowed;
    returns, per cell, {"out": stdout, "err": stderr, "errors": [ename],
    "results": [text/plain of execute_result], "displays": [text/plain of display_data]}.
    gpu_env: the fake's variables instead of one 1 GiB device (a phantom
    GPU's: vramguard.phantom.gpu.environ("T4"))."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(textwrap.dedent(c)) for c in cells])
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("VRAMGUARD_") and k != "PYTORCH_CUDA_ALLOC_CONF"}
    env.update(gpu_env or dict(LD_PRELOAD=preload(), VG_FAKECUDA_DEVICES="1", VG_FAKECUDA_MEM="1GiB"))
    env.update(XDG_CACHE_HOME=str(SHARED_CACHE), PYTHONUNBUFFERED="1")
    km = _kernel_manager(tmp_path / "kernels")
    client = nbclient.NotebookClient(nb, km=km, timeout=300,
                                     allow_errors=True, resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute(env=env)
    finally:
        km.shutdown_kernel(now=True)  # nbclient leaves a kernel it was given running
    return [_outputs(cell) for cell in nb.cells]


def _outputs(cell):
    seen = {"out": "", "err": "", "errors": [], "results": [], "displays": []}
    for output in cell.outputs:
        if output.output_type == "stream":
            seen["out" if output.name == "stdout" else "err"] += output.text
        elif output.output_type == "error":
            seen["errors"].append(output.ename)
        elif output.output_type == "execute_result":
            seen["results"].append(output.data.get("text/plain", ""))
        elif output.output_type == "display_data":
            seen["displays"].append(output.data.get("text/plain", ""))
    return seen


def values(text):
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and " " not in line.split("=")[0])


def test_an_oom_recovers_in_the_same_notebook(tmp_path):
    setup, kept, shown, oom, after = run_cells(
        tmp_path, SETUP,
        'x = torch.zeros(16 * MiB, dtype=torch.uint8, device="cuda")   # the user\'s: stays',
        """
        class Shown(list):  # a tensor's repr runs kernels, which the fake has not
            def __repr__(self):
                return "Shown(1 tensor)"
        Shown([torch.zeros(64 * MiB, dtype=torch.uint8, device="cuda")])  # Out and _ hold it
        """,
        "a, b = step()",
        """
        print("live=%d" % torch.cuda.memory_allocated())
        print("reserved=%d" % torch.cuda.memory_reserved())
        print("last_value=%r" % getattr(sys, "last_value", None))
        print("last_traceback=%r" % getattr(sys, "last_traceback", None))
        print("out_keys=%r" % sorted(Out))
        print("underscore=%r" % (_,))
        a = torch.empty(400 * MiB, dtype=torch.uint8, device="cuda")   # the size that failed
        print("allocated=%d" % torch.cuda.memory_allocated())
        """)
    assert setup["errors"] == [] and kept["errors"] == [] and shown["errors"] == []
    assert shown["results"] == ["Shown(1 tensor)"]
    assert oom["errors"] == ["OutOfMemoryError"]                       # the traceback, as IPython shows it
    report = "".join(oom["displays"]) + "".join(oom["out"].splitlines()[:-1])  # vramguard.last_oom(), shown
    assert "400.00 MiB" in report                                      # names the request
    assert oom["out"].rstrip().splitlines()[-1] == ("vramguard recovered 464.00 MiB; 16.00 MiB still live, "
                                                    "held by x (16.00 MiB)")
    assert after["errors"] == []
    v = values(after["out"])
    assert int(v["live"]) == 16 * MiB and int(v["reserved"]) == 16 * MiB
    assert v["last_value"] == "None" and v["last_traceback"] == "None"
    assert v["out_keys"] == "[]" and v["underscore"] == "''"
    assert int(v["allocated"]) == 416 * MiB


def test_without_recovery_the_traceback_keeps_the_memory(tmp_path):
    """The same cells with the handler taken away: the next allocation of
    the same size fails, because the stored traceback holds `a`."""
    _, oom, after = run_cells(
        tmp_path, SETUP + "get_ipython().set_custom_exc((), None)",
        "a, b = step()",
        """
        print("live=%d" % torch.cuda.memory_allocated())
        a = torch.empty(400 * MiB, dtype=torch.uint8, device="cuda")
        """)
    assert oom["errors"] == ["OutOfMemoryError"] and "recovered" not in oom["out"]
    assert values(after["out"])["live"] == str(400 * MiB)
    assert after["errors"] == ["OutOfMemoryError"]


HANDLER = """
calls = []
def mine(shell, etype, value, tb, tb_offset=None):
    calls.append(etype.__name__)
    if FAIL:
        raise KeyError("the earlier handler fails")
    shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
get_ipython().set_custom_exc((ValueError, RuntimeError), mine)
"""


def test_an_earlier_handler_is_still_called_and_installing_twice_registers_once(tmp_path):
    _, oom, value_error, check = run_cells(
        tmp_path, "FAIL = False\n" + HANDLER + SETUP + 'vramguard.install(budget="640MiB")',
        "a, b = step()",
        'raise ValueError("not memory")',
        """
        print("calls=%r" % calls)
        print("types=%r" % sorted(t.__name__ for t in get_ipython().custom_exceptions))
        """)
    assert oom["errors"] == ["OutOfMemoryError"]                     # shown once, by the earlier handler
    assert oom["out"].count("vramguard recovered") == 1              # one handler of ours
    assert oom["out"].rstrip().endswith("vramguard recovered 400.00 MiB; 0 bytes still live")
    assert value_error["errors"] == ["ValueError"] and "recovered" not in value_error["out"]
    v = values(check["out"])
    assert v["calls"] == "['OutOfMemoryError', 'ValueError']"
    assert v["types"] == "['KeyboardInterrupt', 'OutOfMemoryError', 'RuntimeError', 'ValueError']"


def test_an_earlier_handler_that_raises_does_not_break_the_shell(tmp_path):
    """IPython unregisters a handler that raises (and everything chained to
    it): vramguard's comes back alone, the traceback is still shown."""
    _, oom, value_error, oom_again, check = run_cells(
        tmp_path, "FAIL = True\n" + HANDLER + SETUP,
        "a, b = step()",
        'raise ValueError("not memory")',
        "a, b = step()",
        """
        print("calls=%r" % calls)
        print("types=%r" % [t.__name__ for t in get_ipython().custom_exceptions])
        print("live=%d" % torch.cuda.memory_allocated())
        """)
    assert "Custom TB Handler failed, unregistering" in oom["err"]
    assert oom["errors"] == ["OutOfMemoryError"]
    assert oom["out"].rstrip().endswith("vramguard recovered 400.00 MiB; 0 bytes still live")
    assert value_error["errors"] == ["ValueError"]
    assert oom_again["errors"] == ["OutOfMemoryError"]
    assert oom_again["out"].rstrip().endswith("vramguard recovered 400.00 MiB; 0 bytes still live")
    v = values(check["out"])
    assert v["calls"] == "['OutOfMemoryError']"
    assert v["types"] == "['OutOfMemoryError', 'KeyboardInterrupt']"
    assert v["live"] == "0"


def test_a_failing_report_falls_back_to_the_traceback(tmp_path):
    """When vramguard's own part fails (here the report), the traceback is
    shown as IPython shows it, one line says what failed, the handler stays
    registered and recover() still works."""
    _, oom, again = run_cells(
        tmp_path, SETUP + "vramguard.report.oom.last_oom = lambda: 1 / 0",
        "a, b = step()",
        """
        print("types=%r" % [t.__name__ for t in get_ipython().custom_exceptions])
        r = vramguard.recover()
        print("freed=%d" % r.freed)
        print("live=%d" % r.live)
        """)
    assert oom["errors"] == ["OutOfMemoryError"]
    assert ("vramguard: could not recover after the out-of-memory error (ZeroDivisionError('division by zero')); "
            "call vramguard.recover() to try again") in oom["err"]
    v = values(again["out"])
    assert v["types"] == "['OutOfMemoryError', 'KeyboardInterrupt']"
    assert v["freed"] == str(400 * MiB) and v["live"] == "0"


def test_the_meter_prints_a_line_after_each_cell(tmp_path):
    cells = run_cells(
        tmp_path, SETUP + "vramguard.meter()",
        'y = torch.empty(32 * MiB, dtype=torch.uint8, device="cuda")',
        't = torch.empty(100 * MiB, dtype=torch.uint8, device="cuda"); del t',
        "del y",
        "vramguard.meter(False)",
        'print("quiet")',
        "print(torch.cuda.max_memory_allocated() // MiB)")
    assert [c["out"] for c in cells[1:]] == [
        "this cell: +32.00 MiB live, peak 32.00 MiB / 640.00 MiB, cache 0 bytes\n",
        "this cell: +0 bytes live, peak 132.00 MiB / 640.00 MiB, cache 100.00 MiB\n",
        "this cell: -32.00 MiB live, peak 32.00 MiB / 640.00 MiB, cache 132.00 MiB\n",
        "",
        "quiet\n",
        "132\n",  # the meter's peaks are its own: PyTorch's stays the session's
    ]


def test_meter_outside_ipython_says_where_it_works():
    out = run("""
        vramguard.install()
        out["error"] = error(vramguard.meter)
    """)
    assert out["error"] == ["VramguardError", "vramguard.meter() prints after each cell of IPython or Jupyter; "
                            "elsewhere print vramguard.summary() where you want the figures"]


def test_recover_in_a_script_drops_the_last_exception():
    out = run("""
        import sys
        vramguard.install()
        def fail():
            a = torch.empty(100 * MiB, dtype=torch.uint8, device="cuda")
            raise RuntimeError("something else went wrong")
        try:
            fail()
        except RuntimeError as exc:
            sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, exc.__traceback__
        out["before"] = torch.cuda.memory_allocated()
        r = vramguard.recover()
        out["figures"] = r.as_dict()
        out["text"] = str(r)
        out["last_value"] = repr(sys.last_value)
        out["reserved"] = torch.cuda.memory_reserved()
    """, devices=1, mem="1GiB")
    assert out["before"] == 100 * MiB
    assert out["figures"] == {"freed": 100 * MiB, "released": 100 * MiB, "live": 0, "cached": 0, "workspaces": 0,
                              "devices": [{"device": 0, "live": 0, "cached": 0, "holders": [], "unnamed": 0}]}
    assert out["text"] == "vramguard recovered 100.00 MiB; 0 bytes still live"
    assert out["last_value"] == "None" and out["reserved"] == 0


def test_recover_in_an_except_block_frees_the_failed_call_s_tensors():
    """recover() with no argument, in the except block as the docs show it:
    the exception being handled holds the failed call's frames, and their
    tensors; they are freed, and the cache they leave given back."""
    out = run("""
        vramguard.install(budget="256MiB")
        def step():
            x = torch.empty(200 * MiB, dtype=torch.uint8, device="cuda")
            torch.empty(200 * MiB, dtype=torch.uint8, device="cuda")
        try:
            step()
        except torch.OutOfMemoryError:
            out["before"] = torch.cuda.memory_allocated()
            r = vramguard.recover()
            out["freed"], out["text"] = r.freed, str(r)
            out["after"] = torch.cuda.memory_allocated()
    """, devices=1, mem="1GiB")
    assert out["before"] == 200 * MiB and out["freed"] == 200 * MiB and out["after"] == 0
    assert out["text"] == "vramguard recovered 200.00 MiB; 0 bytes still live"


def test_the_recovery_line_names_what_holds_the_memory_per_device():
    """What is still live: the variables holding the most, per device (the
    meter shows one device at a time), and PyTorch's own cuBLAS workspaces
    said apart, released as PyTorch's own leak check releases them."""
    out = run("""
        vramguard.install()
        a = torch.ones(64, 64, device="cuda")
        b = a @ a                                             # cuBLAS makes its workspace
        out["with_workspace"] = torch.cuda.memory_allocated()
        del a, b
        out["after_del"] = torch.cuda.memory_allocated()
        r = vramguard.recover()
        out["workspaces"] = [r.workspaces, r.live]
        out["released"] = r.released
        out["alone"] = str(r)
        import __main__
        __main__.weights = {"w": torch.empty(64 * MiB, dtype=torch.uint8, device="cuda:0")}
        __main__.x = torch.empty(16 * MiB, dtype=torch.uint8, device="cuda:0")
        __main__.y = torch.empty(48 * MiB, dtype=torch.uint8, device="cuda:1")
        out["two"] = str(vramguard.recover())
        del __main__.weights, __main__.y
        out["one"] = str(vramguard.recover())
    """, devices=2, mem="1GiB,1GiB", TORCH_CUBLAS_WORKSPACE_CACHE="1")  # kept, as PyTorch 2.8 keeps it
    assert out["after_del"] > 0                               # the workspace outlives the tensors
    assert out["workspaces"] == [out["after_del"], 0]
    # the segments a and b left cached went back to the device too: more than the tensors freed, said
    assert out["released"] > out["after_del"]
    assert out["alone"] == (f"vramguard recovered {out['after_del'] / MiB:.2f} MiB ({out['after_del'] / MiB:.2f} MiB "
                            "of it PyTorch's own cuBLAS workspaces, which it makes again at the next matrix multiply), "
                            f"and gave {out['released'] / MiB:.2f} MiB of cached memory back to the device; "
                            "0 bytes still live")
    assert out["two"] == ("vramguard recovered 0 bytes; 80.00 MiB still live on GPU 0, held by weights (64.00 MiB), "
                          "x (16.00 MiB); 48.00 MiB still live on GPU 1, held by y (48.00 MiB)")
    # weights and y were deleted before: their 112 MiB of cache went back to the devices, said
    assert out["one"] == ("vramguard recovered 0 bytes, and gave 112.00 MiB of cached memory back to the devices; "
                          "16.00 MiB still live on GPU 0, held by x (16.00 MiB)")


def test_an_interrupted_cell_gives_back_what_its_frames_held(tmp_path):
    """Ctrl-C (SIGINT, as the notebook's stop button sends it) in the middle
    of a step: IPython would keep the traceback, and `a` with it; the handler
    drops the interrupted frames and says so, Out and _ stay as they were."""
    setup, kept, interrupted, after = run_cells(
        tmp_path, SETUP + "import os, signal, time",
        'x = torch.zeros(16 * MiB, dtype=torch.uint8, device="cuda")',
        """
        def long_step():
            a = torch.empty(400 * MiB, dtype=torch.uint8, device="cuda")
            os.kill(os.getpid(), signal.SIGINT)   # what an interrupt sends the kernel
            time.sleep(30)
        long_step()
        """,
        """
        print("live=%d" % torch.cuda.memory_allocated())
        print("reserved=%d" % torch.cuda.memory_reserved())
        a = torch.empty(600 * MiB, dtype=torch.uint8, device="cuda")   # fits only if `a` was freed
        print("allocated=%d" % torch.cuda.memory_allocated())
        """)
    assert setup["errors"] == [] and kept["errors"] == []
    assert interrupted["errors"] == ["KeyboardInterrupt"]              # the traceback, as IPython shows it
    assert interrupted["out"].rstrip().splitlines()[-1] == (
        "After the interrupt, vramguard recovered 400.00 MiB; 16.00 MiB still live, held by x (16.00 MiB)")
    assert after["errors"] == []
    v = values(after["out"])
    assert int(v["live"]) == 16 * MiB and int(v["reserved"]) == 16 * MiB
    assert int(v["allocated"]) == 616 * MiB


def test_an_interrupt_that_held_no_memory_prints_nothing(tmp_path):
    _, interrupted, check = run_cells(
        tmp_path, SETUP + "import os, signal, time",
        "os.kill(os.getpid(), signal.SIGINT); time.sleep(30)",
        'print("types=%r" % sorted(t.__name__ for t in get_ipython().custom_exceptions))')
    assert interrupted["errors"] == ["KeyboardInterrupt"]
    assert "vramguard" not in interrupted["out"] and "vramguard" not in interrupted["err"]
    assert values(check["out"])["types"] == "['KeyboardInterrupt', 'OutOfMemoryError']"


def test_holders_are_modules_optimizers_and_containers_and_the_rest_is_said():
    out = run("""
        import __main__
        vramguard.install()
        __main__.model = torch.nn.Linear(1024, 1024, bias=False).cuda()           # 4 MiB of weights
        __main__.opt = torch.optim.SGD(__main__.model.parameters(), lr=0.1, momentum=0.9)
        __main__.model.weight.grad = torch.zeros_like(__main__.model.weight)     # 4 MiB, the model's too
        __main__.opt.step()                                                        # momentum: 4 MiB
        __main__.batches = [torch.empty(2 * MiB, dtype=torch.uint8, device="cuda") for _ in range(3)]
        class Box:
            pass
        __main__.box = Box()
        __main__.box.t = torch.empty(8 * MiB, dtype=torch.uint8, device="cuda")   # in an object: not named
        __main__.numbers = list(range(10 ** 6))                                     # no tensor, looked at briefly
        out["text"] = str(vramguard.recover())
    """, devices=1, mem="1GiB")
    assert out["text"] == ("vramguard recovered 0 bytes; 26.00 MiB still live, held by model (8.00 MiB), "
                           "batches (6.00 MiB), opt (4.00 MiB), and 8.00 MiB by objects vramguard cannot name")
