"""torch.distributed on phantom GPUs through the NCCL stand-in
(csrc/phantom/README.md, "NCCL"): examples/ddp_tiny.py under the real
torchrun, two ranks, each on a device of its own (VG_FAKECUDA_DEVICES=2),
backend nccl, three training steps; DDP, then FSDP2 (fully_shard); then
`python -m vramguard dryrun --nproc 2` on the FSDP2 run.

Each torchrun costs about 8 s on two cores (two PyTorch imports); the
module, about 27 s (the dry run: one more torchrun).
"""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# torch_version: runs in the CUDA 12 tier too (docs/development.md)
pytestmark = [pytest.mark.torch, pytest.mark.torch_version]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "ddp_tiny.py"


def _env():
    from vramguard.phantom import gpu as _phantom

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("VRAMGUARD_", "VG_FAKECUDA_", "VG_PHANTOM_")) and k != "PYTORCH_CUDA_ALLOC_CONF"}
    env.update(_phantom.environ("A100-40GB"))
    env["VG_FAKECUDA_DEVICES"] = "2"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python")] + [p for p in env.get("PYTHONPATH", "").split(
        os.pathsep) if p])
    return env


def _launcher(log_dir):
    """torchrun for two ranks, its logs in the test's folder (by default it
    makes a folder in the machine's /tmp and leaves it)."""
    torchrun = Path(sys.executable).parent / "torchrun"
    launcher = [str(torchrun)] if torchrun.exists() else [sys.executable, "-m", "torch.distributed.run"]
    return launcher + ["--standalone", "--nproc_per_node", "2", "--log-dir", str(log_dir / "torchrun")]


def _torchrun(log_dir, *args):
    """The ranks' `ddp_tiny` lines, by rank, after torchrun succeeded."""
    proc = subprocess.run(_launcher(log_dir) + [str(EXAMPLE), *args],
                          env=_env(), capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    ranks = {}
    # Found anywhere in the output, not line by line: the ranks write to one
    # pipe, and a line may follow another's without its newline.
    for found in re.finditer(r"ddp_tiny (\{[^{}]*\})", proc.stdout):
        r = json.loads(found.group(1))
        ranks[r["rank"]] = r
    assert sorted(ranks) == [0, 1], out[-4000:]
    assert out.count("NCCL is vramguard's stand-in") == 2, out[-4000:]  # once per rank
    for rank, r in ranks.items():
        assert r["world"] == 2 and r["device"] == rank and r["steps"] == 3
    return ranks


def test_the_stand_in_exports_what_pytorch_imports_from_nccl():
    """Every nccl* symbol libtorch_cuda.so takes from libnccl.so.2 is
    defined by the stand-in, unversioned as in the real library."""
    import torch
    from vramguard.phantom import gpu as _phantom

    if shutil.which("nm") is None:
        pytest.skip("no nm (binutils)")
    lib = Path(torch.__file__).parent / "lib" / "libtorch_cuda.so"
    stand_in = next(p for p in _phantom.preload().split() if Path(p).name.startswith("libnccl.so."))

    def symbols(*args):
        out = subprocess.run(["nm", "-D", *args], capture_output=True, text=True, check=True).stdout
        return {line.split()[-1] for line in out.splitlines() if line.split()}

    wanted = {s for s in symbols("--undefined-only", str(lib)) if s.startswith("nccl")}
    defined = symbols("--defined-only", stand_in)
    assert wanted and not wanted - defined, sorted(wanted - defined)
    assert not [s for s in defined if "@" in s]


def test_ddp_on_two_phantom_ranks(tmp_path):
    """DDP's gradient buckets are on each rank's device: after wrapping, the
    parameters and a bucket as large as them; at the peak, more than the
    parameters and their gradients."""
    for rank, r in _torchrun(tmp_path).items():
        assert r["mode"] == "ddp" and r["shard_bytes"] == r["param_bytes"]
        assert r["allocated_after_wrap"] >= 2 * r["param_bytes"], r
        assert r["max_allocated"] > 2 * r["param_bytes"], r
        assert r["max_reserved"] >= r["max_allocated"]


def test_fsdp2_on_two_phantom_ranks(tmp_path):
    """fully_shard on two ranks: each holds about half the parameters, as
    its DTensors' shards and as device memory after sharding."""
    for rank, r in _torchrun(tmp_path, "--fsdp").items():
        half = r["param_bytes"] / 2
        assert r["mode"] == "fsdp"
        assert abs(r["shard_bytes"] - half) <= 0.03 * half, r
        assert abs(r["allocated_after_wrap"] - half) <= 0.03 * half, r
        assert r["max_allocated"] < 4 * r["param_bytes"], r


def test_dryrun_nproc_gives_each_rank_its_figures(tmp_path):
    """`python -m vramguard dryrun --nproc 2` runs the script under torchrun,
    a phantom device per rank: the run's figures are its largest rank's,
    and each rank's are in `ranks` and in the report's notes."""
    from vramguard.dryrun import format_report

    env = {k: v for k, v in _env().items() if k not in ("LD_PRELOAD", "VG_FAKECUDA_DEVICES")}
    # the needs replayed, not checked: a check is two torchrun runs more per allocator, and
    # test_needs_checked.py checks them
    proc = subprocess.run([sys.executable, "-m", "vramguard", "dryrun", "--gpu", "A100-40GB", "--nproc", "2",
                           "--allocator", "native,vramguard", "--no-check-needs", "--json", "--quiet",
                           "--out", str(tmp_path / "out"), str(EXAMPLE), "--fsdp"],
                          env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout)
    assert result["nproc"] == 2 and result["fits"] is True, proc.stderr[-4000:]
    for allocator in ("native", "vramguard"):
        run = result[allocator]
        # vramguard in every rank ends as PyTorch's allocator does: the
        # NCCL process group's teardown asks it for nothing it refuses
        assert run["error"] is None and run["exit_status"] == 0, (allocator, run["error"])
        assert [r["rank"] for r in run["ranks"]] == [0, 1]
        assert all(r["fits"] and r["peak_allocated_bytes"] > 0 for r in run["ranks"])
        assert run["peak_allocated_bytes"] == max(r["peak_allocated_bytes"] for r in run["ranks"])
        assert sorted(p.name for p in Path(result["out_dir"]).glob(f"{allocator}.rank*.json")) == [
            f"{allocator}.rank0.json", f"{allocator}.rank1.json"]
        assert f"{allocator}, per rank (peak allocated / reserved): rank 0 " in format_report(result)
        # the need: each rank's recording replayed, the largest rank's
        assert run["need_unmeasured"] is None and run["need_bytes"] >= run["peak_allocated_bytes"], run
        assert run["need_bytes"] % (16 << 20) == 0
    assert Path(result["out_dir"]).parent == tmp_path / "out"  # the dry run's own folder in --out
    assert list((Path(result["out_dir"]) / "torchrun").iterdir())  # torchrun's logs with the run's, not in /tmp
    # the same program allocates the same under both; the arena reserves less
    assert result["vramguard"]["peak_allocated_bytes"] == result["native"]["peak_allocated_bytes"]
    assert result["vramguard"]["peak_reserved_bytes"] <= result["native"]["peak_reserved_bytes"]


def test_install_makes_nccl_the_process_group_that_needs_no_snapshot():
    """PyTorch's nccl2 process group asks the allocator for a snapshot when
    destroyed, which PyTorch refuses for a pluggable allocator (the process
    aborts): install() selects the legacy group, registered or not yet, and
    leaves a user's own TORCH_DIST_USE_NCCL2 alone."""
    import torch.distributed.distributed_c10d as c10d

    if not hasattr(c10d, "_create_nccl2_process_group"):
        pytest.skip(f"PyTorch {torch_version()} has no nccl2 process group")
    code = """
import os, sys, torch
import torch.distributed.distributed_c10d as c10d
if sys.argv[1] == "registered":
    c10d.Backend._ensure_backend_registered("nccl")
from vramguard.torch import nccl
said = nccl.use_legacy_process_group()
c10d.Backend._ensure_backend_registered("nccl")
print(said is not None, os.environ.get("TORCH_DIST_USE_NCCL2"), c10d.Backend._plugins["NCCL"].creator_fn.__name__)
"""
    env = {k: v for k, v in _env().items() if k != "TORCH_DIST_USE_NCCL2"}
    for case in ("registered", "later"):
        out = subprocess.run([sys.executable, "-c", code, case], env=env, capture_output=True, text=True,
                             timeout=120)
        assert out.stdout.split() == ["True", "0", "_create_nccl_process_group"], out.stderr[-2000:]
    out = subprocess.run([sys.executable, "-c", code, "later"], env=dict(env, TORCH_DIST_USE_NCCL2="1"),
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["False", "1", "_create_nccl2_process_group"], out.stderr[-2000:]


def torch_version():
    import torch

    return torch.__version__


COLLECTIVE_RANK = """
import json, os, sys, time
import torch, torch.distributed as dist
import vramguard

vramguard.install(arena=False)
rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(rank)
dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
dist.barrier()
MiB = 1 << 20
def allocated():
    return vramguard.stats(rank)["allocated_bytes.all.current"]
before = vramguard.stats(rank)
x = torch.ones(MiB, device="cuda")           # 4 MiB, on the current stream
with_x = allocated()
work = dist.all_reduce(x, async_op=True)     # on the process group's NCCL stream
del x                                        # dropped while the collective may still read it
held = allocated() - with_x
work.wait()
torch.cuda.synchronize()
del work
released = None
for _ in range(100):                         # the group lets go when its work is done
    if allocated() <= with_x - 4 * MiB:
        released = True
        break
    time.sleep(0.05)
after = vramguard.stats(rank)
out = {"held": held, "released": released,
       "record_stream": after["num_record_stream"] - before["num_record_stream"], "rank": rank}
sys.stdout.write("collective " + json.dumps(out) + "\\n")
sys.stdout.flush()
dist.destroy_process_group()
"""


def test_a_collectives_buffer_is_kept_until_its_work_is_done(tmp_path):
    """A tensor all-reduced asynchronously and dropped before the work is
    waited for: its block must not be reused while the NCCL stream may
    read it. PyTorch (2.10 and later) no longer calls record_stream for
    collectives: the process group keeps the tensor itself until the work
    is done, so vramguard sees the block live, then freed. (vramguard's
    record_stream, for Tensor.record_stream and older PyTorch, is
    tested in test_hooks.py and test_graph_pools.py.)"""
    script = tmp_path / "rank.py"
    script.write_text(COLLECTIVE_RANK)
    proc = subprocess.run(_launcher(tmp_path) + [str(script)],
                          env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    found = [json.loads(m.group(1)) for m in re.finditer(r"collective (\{[^{}]*\})", proc.stdout)]
    assert sorted(r["rank"] for r in found) == [0, 1], proc.stdout[-2000:]
    for r in found:
        assert r["held"] == 0, r            # still allocated after del: the group holds it
        assert r["released"] is True, r     # and freed once the work is done
        assert r["record_stream"] == 0, r


PLAIN_DDP = """
import os
import torch
import torch.distributed as dist
from torch import nn

rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(rank)
dist.init_process_group("nccl")
model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 8)).cuda()
ddp = nn.parallel.DistributedDataParallel(model, device_ids=[rank])   # PyTorch's defaults
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
for _ in range(3):
    loss = ddp(torch.randn(32, 1024, device="cuda")).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
dist.destroy_process_group()
"""


def test_dryrun_runs_a_ddp_script_with_pytorchs_defaults(tmp_path):
    """A DDP script as users write it (init_sync and the bucket rebuild on,
    both of which read device values back, zeros on a phantom): the dry
    run's ranks give DDP init_sync=False and find_unused_parameters=True,
    it runs to its end, and the report says what was changed."""
    from vramguard.dryrun import format_report

    script = tmp_path / "plain_ddp.py"
    script.write_text(PLAIN_DDP)
    env = {k: v for k, v in _env().items() if k not in ("LD_PRELOAD", "VG_FAKECUDA_DEVICES")}
    proc = subprocess.run([sys.executable, "-m", "vramguard", "dryrun", "--gpu", "A100-40GB", "--nproc", "2",
                           "--allocator", "vramguard", "--json", "--quiet", "--no-snapshot",
                           "--out", str(tmp_path / "out"), str(script)],
                          env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout)
    run = result["vramguard"]
    assert run["fits"] is True and run["error"] is None, run
    assert run["ddp_adjusted"] == 1
    assert all(r["fits"] for r in run["ranks"])
    assert "the dry run gave its 1 DDP module init_sync=False and find_unused_parameters=True" in \
        format_report(result)
    # PyTorch's warning that no parameter was unused is of the dry run's doing: not in the script's output
    log = Path(run["log"]).read_text()
    assert "find_unused_parameters=True was specified" not in log + proc.stderr
