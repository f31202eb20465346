"""The zoo's entries driven by a library's own training loop or adapters
(bench/zoo_models.py: llama-1b-lora through peft, bert-trainer through HF
transformers' Trainer, lightning through lightning.Trainer, llama2-7b-qlora:
a 4-bit bitsandbytes load of a shapes-only checkpoint, peft's LoRA, HF
Trainer with the paged 8-bit AdamW), each at its
small size on a phantom T4 through bench/zoo_run.py, under PyTorch's
allocator and vramguard's: both fit, hold the same tensors (peak allocated
within 1%, but for PyTorch's unsplit blocks) and ran every step asked for.

For the two Trainer-driven entries "every step" is the Trainer's own count:
each step() call is exactly one of its optimizer steps, its optimizer state
lives on between calls, and close() ends its loop."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[2]
STEPS = 3
MiB = 1 << 20
NEEDS = {
    "llama-1b-lora": ("transformers", "peft"),
    "bert-trainer": ("transformers",),
    "lightning": ("lightning",),
    "llama2-7b-qlora": ("transformers", "peft", "bitsandbytes"),
}

# zoo_run.py's main, unchanged, with the step function it builds kept, so
# that the Trainer behind it can be asked afterwards how far it went.
DRIVE = textwrap.dedent("""
    import sys, threading
    sys.path.insert(0, %r)
    import zoo_models, zoo_run

    built, build = [], zoo_models.build
    zoo_models.build = lambda *a, **k: built.append(build(*a, **k)) or built[-1]
    zoo_run.main(sys.argv[1:])
    step, = built
    if hasattr(step, "optimizer_steps"):
        trainer = step.trainer
        optimizer = getattr(trainer, "optimizer", None) or trainer.optimizers[0]
        optimizer = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper
        print("optimizer steps", step.optimizer_steps(), "states", len(optimizer.state))
        folder = step.output_dir and step.output_dir.name
        step.close()
        # the loop's own thread (others may live on: tqdm's monitor, started by
        # transformers' loading bar, is a daemon of its own)
        print("loop threads after close", sum(t.name == "zoo-training-loop" for t in threading.enumerate()))
        print("output folder left", bool(folder) and __import__("os").path.exists(folder))
        try:
            step()
        except RuntimeError as exc:
            print("after close:", exc)
    # Past PyTorch's teardown, which aborts now and then while autograd's
    # device threads finish (zoo_run.py cannot: a dry run runs it as its
    # script, and writes its figures after it).
    sys.stdout.flush()
    sys.stderr.flush()
    import os
    os._exit(0)
""" % str(ROOT / "bench"))


def _phantom_env(gpu="T4"):
    from vramguard.phantom import gpu as _phantom

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("VRAMGUARD_", "VG_FAKECUDA_")) and k != "PYTORCH_CUDA_ALLOC_CONF"}
    env.update(_phantom.environ(gpu))
    return env


@pytest.mark.parametrize("model", sorted(NEEDS))
def test_zoo_entry_on_a_phantom_t4(model, tmp_path):
    for module in NEEDS[model]:
        pytest.importorskip(module, reason=f"{model} needs {module}")
    env = _phantom_env()
    # The two allocators side by side, a process each (the allocator is
    # chosen before CUDA starts).
    procs = {allocator: subprocess.Popen(
        [sys.executable, "-c", DRIVE, model, "--size", "small", "--allocator", allocator,
         "--steps", str(STEPS), "--json", str(tmp_path / f"{allocator}.json")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for allocator in ("native", "vramguard")}
    runs = {}
    for allocator, proc in procs.items():
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, (allocator, err[-3000:])
        run = runs[allocator] = json.loads((tmp_path / f"{allocator}.json").read_text())
        assert run["fits"], (allocator, run.get("oom"))
        assert run["device"] == "Tesla T4"
        assert run["steps"] == STEPS and len(run["step_seconds"]) == STEPS, run
        if model != "llama-1b-lora":
            lines = out.splitlines()
            # its optimizer stepped once per call, and has its state (AdamW's moments)
            assert lines[0].startswith(f"optimizer steps {STEPS} states "), (allocator, out)
            assert int(lines[0].split()[-1]) > 0, (allocator, out)
            assert lines[1:] == ["loop threads after close 0", "output folder left False",
                                 "after close: the training loop has ended"], out
    # The same tensors: the bytes requested at the peak within 0.01% (the
    # order of frees and allocations may differ by a few bytes between the
    # allocators' runs). Peak allocated: PyTorch's allocator counts a cached
    # block whole when it serves a request leaving 1 MiB or less over (it
    # does not split it), so it may count more, never less; at the small
    # size those remainders pass 1% (llama-1b-lora: 3 MiB of 133;
    # llama2-7b-qlora: 4.1 MiB of 174.5 for the same 182,887,224 bytes
    # requested), hence no closer bound on it.
    requested = [runs[a]["peak_requested_bytes"] for a in ("native", "vramguard")]
    assert min(requested) > 0 and max(requested) - min(requested) <= max(requested) // 10000, requested
    native, ours = runs["native"]["peak_allocated_bytes"], runs["vramguard"]["peak_allocated_bytes"]
    assert ours >= min(requested)
    assert 0 <= native - ours <= max(ours // 10, 16 * MiB), (native, ours)
