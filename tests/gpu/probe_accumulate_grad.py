"""Is a failed make_graphed_callables the allocator's doing? The same
program under PyTorch's own allocator and under vramguard's, one process
each: an eager backward on the default stream first (its AccumulateGrad
nodes stay with the parameters), then make_graphed_callables on the same
model, and the same with the eager pass on a copy of the model.

    python tests/gpu/probe_accumulate_grad.py          # prints one line per allocator and case
"""
import copy
import os
import subprocess
import sys


def case(same_model):
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)).cuda()
    x = torch.randn(32, 256, device="cuda", requires_grad=True)
    reference = model if same_model else copy.deepcopy(model)
    eager = reference(x.detach().clone().requires_grad_()).sum()
    eager.backward()
    del eager
    model.zero_grad(set_to_none=True)
    try:
        graphed = torch.cuda.make_graphed_callables(model, (x,))
        graphed(x).sum().backward()
        torch.cuda.synchronize()
        return "captured"
    except Exception as exc:  # the outcome is what is reported
        return "failed: " + str(exc).splitlines()[0][:120]


def child(allocator, same_model):
    if allocator != "native":
        import vramguard

        vramguard.install(arena=allocator == "vramguard")
    print(case(same_model == "same"))


if __name__ == "__main__":
    if len(sys.argv) == 3:
        child(*sys.argv[1:])
        sys.exit(0)
    for allocator in ("native", "vramguard", "vramguard-segments"):
        for same in ("same", "copy"):
            out = subprocess.run([sys.executable, __file__, allocator, same], capture_output=True, text=True,
                                 env=dict(os.environ, PYTHONWARNINGS="ignore"), timeout=120)
            line = (out.stdout.strip().splitlines() or ["exit %d: %s" % (out.returncode, out.stderr.strip()[-200:])])[-1]
            where = "the same model" if same == "same" else "a copy"
            print(f"{allocator:19} eager pass on {where:14}: {line}")
