"""`dryrun --world-size N`: one process as rank R of N on PyTorch's fake
process group (vramguard.dryrun.features.fake_world). The environment torchrun would
give the rank, any backend and rendezvous the script names served by the
fake group, what it cannot serve named in the report, and rank 0's figures
equal to a real two-rank run's (bench/zoo_world.py --check)."""
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from test_dryrun import _env

# torch_version: runs in the CUDA 12 tier too (docs/development.md)
pytestmark = [pytest.mark.torch, pytest.mark.torch_version]

ROOT = Path(__file__).resolve().parents[2]


def _dryrun(tmp_path, code, *flags, expect=0):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(code))
    cmd = [sys.executable, "-m", "vramguard", "dryrun", "--json", "--no-snapshot", "--memory", "4GiB",
           "--allocator", "vramguard", "--out", str(tmp_path / "out"), *flags, str(script)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=_env(), timeout=300)
    assert proc.returncode == expect, proc.stdout + proc.stderr
    return json.loads(proc.stdout), proc.stderr


def _report(result):
    from vramguard.dryrun import format_report

    return format_report(result)


def test_the_rank_sees_torchruns_environment_and_a_fake_group_whatever_it_asks_for(tmp_path):
    result, stderr = _dryrun(tmp_path, """
        import os, torch, torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        env = {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")}
        print("ENV", env, torch.cuda.device_count())
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl", init_method="tcp://10.9.9.9:23456", rank=0, world_size=2)
        sub = dist.new_group([0, 13], backend="nccl")
        mesh = init_device_mesh("cuda", (5, 4), mesh_dim_names=("dp", "tp"))
        x = torch.ones(1 << 20, device="cuda")
        dist.all_reduce(x)
        print("GROUP", dist.get_rank(), dist.get_world_size(), dist.get_backend(), mesh["tp"].size())
    """, "--world-size", "20", "--rank", "13", "--gpus-per-node", "8")
    log = Path(result["vramguard"]["log"]).read_text()
    assert "ENV {'RANK': '13', 'WORLD_SIZE': '20', 'LOCAL_RANK': '5', 'LOCAL_WORLD_SIZE': '8', 'GROUP_RANK': '1'} 8" in log
    assert "GROUP 13 20 fake 4" in log  # the script's rank=0, world_size=2 and tcp:// gave way
    assert result["world_size"] == 20 and result["rank"] == 13
    run = result["vramguard"]
    assert run["fits"] is True and run["peak_allocated_bytes"] == 4 << 20
    assert run["fake_world"]["unserved"] == {} and run["fake_world"]["collectives"] >= 1
    text = _report(result)
    assert "One process ran as rank 13 of 20 (--world-size) on PyTorch's fake process group" in text
    assert "Memory NCCL itself takes on each card" in text
    assert "Not served by the fake group" not in text


def test_what_the_fake_group_cannot_serve_is_named(tmp_path):
    result, _ = _dryrun(tmp_path, """
        import torch, torch.distributed as dist
        dist.init_process_group("nccl")
        torch.cuda.set_device(0)
        objs = [None] * dist.get_world_size()
        try:
            dist.all_gather_object(objs, {"tokens": 3})
        except Exception as exc:
            print("all_gather_object failed:", type(exc).__name__)
        x = torch.zeros(8, device="cuda")
        dist.send(x, dst=1)
        dist.send(x, dst=1)
        counts = torch.ones(4, dtype=torch.long, device="cuda")
        out = torch.empty(8, device="cuda")
        dist.all_to_all_single(out, torch.ones(8, device="cuda"), [2, 2, 2, 2], [2, 2, 2, 2])
        n = int(counts.sum().item())
    """, "--world-size", "4")
    fw = result["vramguard"]["fake_world"]
    assert fw["unserved"] == {"all_gather_object": 1, "send": 2}
    assert fw["all_to_all_with_splits"] == 1
    assert fw["reads_after_first_collective"] >= 1
    text = _report(result)
    assert "Not served by the fake group: all_gather_object (1 call): the objects arrive as zeros" in text
    assert "Not served by the fake group: point-to-point send (2 calls)" in text
    assert "all_to_all_single with split sizes ran 1 time:" in text
    assert "after its first collective" in text


@pytest.mark.parametrize("flags, message", [
    (["--world-size", "4", "--nproc", "2"], "--world-size and --nproc cannot be combined"),
    (["--world-size", "4", "--rank", "4"], "--rank must be from 0 to 3"),
    (["--rank", "1"], "--rank needs --world-size"),
    (["--world-size", "1"], "--world-size must be from 2 to"),
    (["--world-size", "8", "--gpus-per-node", "17"], "--gpus-per-node must be from 1 to 16"),
])
def test_bad_world_arguments_get_one_line(tmp_path, flags, message):
    script = tmp_path / "s.py"
    script.write_text("pass\n")
    proc = subprocess.run([sys.executable, "-m", "vramguard", "dryrun", *flags, str(script)], capture_output=True,
                          text=True, cwd=tmp_path, env=_env(), timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr


def test_the_python_api_names_its_own_arguments(tmp_path):
    from vramguard.dryrun import DryRunInputError, dryrun

    script = tmp_path / "s.py"
    script.write_text("pass\n")
    with pytest.raises(DryRunInputError, match=r"^rank= must be from 0 to 7"):
        dryrun(str(script), world_size=8, rank=9)


def test_one_rank_of_two_measures_what_two_ranks_do(tmp_path):
    """bench/zoo_world.py --check: FSDP2 of the zoo's decoder (small size) under
    vramguard, rank 0's peaks and shares equal under --world-size 2 and --nproc 2."""
    pytest.importorskip("transformers")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "zoo_world.py"), "--out", str(tmp_path),
                           "--size", "small", "--nproc", "2", "--modes", "fsdp", "--allocators", "vramguard",
                           "--no-large", "--check"],
                          capture_output=True, text=True, timeout=900, cwd=ROOT, env=_env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (row,) = json.loads((tmp_path / "world.json").read_text())["agreement"]
    world, exact = row["world"]["runs"]["vramguard"], row["exact"]["runs"]["vramguard"]
    assert world["peak_allocated_bytes"] == exact["ranks"][0]["peak_allocated_bytes"] > 0
    assert world["program"][0]["shard_bytes"] * 2 == world["program"][0]["param_bytes"]
    assert "| FSDP | 2 | vramguard |" in (tmp_path / "world.md").read_text()


def test_ddp_trains_on_the_fake_group_with_the_memory_of_the_real_one(tmp_path):
    """DDP's gradient buckets come back through a hook a fake group cannot
    complete: the dry run's returns each bucket as it is. A 64 MiB Linear:
    its parameters, DDP's bucket and the gradient (192 MiB, with what this
    PyTorch keeps besides: cuBLAS's workspace on 2.10), the bytes each of
    two real ranks holds under --nproc 2 (bench/zoo_world.py compares the
    zoo's decoder)."""
    code = """
        import os, torch, torch.distributed as dist
        local = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        model = torch.nn.Linear(4096, 4096, bias=False).cuda()
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
        HOOK
        for _ in range(2):
            ddp(torch.randn(8, 4096, device="cuda")).sum().backward()
        print("allocated", torch.cuda.memory_allocated())
    """
    exact, _ = _dryrun(tmp_path, code.replace("HOOK", "pass"), "--nproc", "2")
    ranks = set(re.findall(r"allocated (\d+)", Path(exact["vramguard"]["log"]).read_text()))
    # a hook of the script's own (this one would fail anywhere) is kept out on the fake group
    result, _ = _dryrun(tmp_path, code.replace("HOOK", "ddp.register_comm_hook(None, lambda state, bucket: None)"),
                        "--world-size", "2")
    run = result["vramguard"]
    assert run["fits"] is True and run["error"] is None
    allocated = re.findall(r"allocated (\d+)", Path(run["log"]).read_text())
    assert len(ranks) == 1 and allocated == list(ranks) and int(allocated[0]) >= 192 << 20
    fw = run["fake_world"]
    assert fw["ddp_served"] == 1 and fw["ddp_hooks_kept_out"] == 1
    assert ("the dry run's hook returned each bucket as it is, the tensors a real all-reduce returns "
            "(1 DDP module); 1 communication hook the script registered did not run") in _report(result)
