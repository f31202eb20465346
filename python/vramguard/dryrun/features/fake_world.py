"""One rank of a job of any size: `dryrun --world-size N [--rank R]`.

Under data-parallel sharding (DDP, FSDP2, ZeRO-style) every rank of a job
holds the same shapes, so one process answers for all of them. The script
runs once per allocator as rank R of N on one phantom GPU: the environment
torchrun would give it (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
GROUP_RANK for nodes of --gpus-per-node phantom GPUs), and every process
group it makes served by PyTorch's fake process group (`FakeStore` and the
"fake" backend of torch.testing._internal.distributed.fake_pg): the
collectives complete at once and move nothing, sharding computes the 1/N
shapes it would on the cluster.

What the fake group cannot serve is counted and named in the report, never
silently wrong: the object collectives (their pickles arrive as zeros),
point-to-point transfers (shapes that come from a peer: pipeline stages),
all_to_all_single with split sizes (usually computed from values exchanged
first: a mixture of experts' token counts), and device values read back
after the first collective (a result the program may decide on).

The parent side (world_env, check_world, world_notes) and the child side
(FakeWorld) live here together: one concern, two processes.
"""
import functools
import os
import threading

from ..contract import WORLD_ENV
from .base import Feature

__all__ = ["FakeWorld", "WORLD_ENV", "check_world", "world_env", "world_notes"]

#: Set by the parent for --world-size runs: "RANK/WORLD_SIZE".
#: The phantom's most devices in one process (csrc/phantom/core.h VGFC_MAX_DEVICES).
MAX_GPUS_PER_NODE = 16
#: A world larger than this is refused: a typo, not a job.
MAX_WORLD_SIZE = 1 << 20

#: Calls whose results a fake group cannot give, by the reason.
UNSERVED = {
    "all_gather_object": "object", "gather_object": "object", "broadcast_object_list": "object",
    "scatter_object_list": "object", "send_object_list": "object", "recv_object_list": "object",
    "send": "p2p", "recv": "p2p", "isend": "p2p", "irecv": "p2p", "batch_isend_irecv": "p2p",
}
#: Collectives counted, to know when the first one ran.
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
               "broadcast", "reduce", "all_to_all", "all_to_all_single", "barrier", "gather", "scatter")


# ------------------------------------------------------------------ the parent

def check_world(world_size, rank, gpus_per_node, nproc, arg):
    """The three numbers checked; a ValueError naming the argument (`arg`
    turns "world_size" into "--world-size" for the command line) otherwise."""
    def bad(name, text):
        return ValueError(f"{arg(name)} {text}")

    for name, value in (("world_size", world_size), ("rank", rank), ("gpus_per_node", gpus_per_node)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise bad(name, f"must be a whole number, got {value!r}")
    if world_size is None:
        if rank is not None:
            raise bad("rank", f"needs {arg('world_size')}")
        return
    if nproc != 1:
        raise bad("world_size", f"and {arg('nproc')} cannot be combined: {arg('nproc')} runs every rank "
                                f"as a process, {arg('world_size')} one rank of them")
    if not 2 <= world_size <= MAX_WORLD_SIZE:
        raise bad("world_size", f"must be from 2 to {MAX_WORLD_SIZE:,}, got {world_size}")
    if rank is not None and not 0 <= rank < world_size:
        raise bad("rank", f"must be from 0 to {world_size - 1} (the world's size less one), got {rank}")
    if not 1 <= gpus_per_node <= MAX_GPUS_PER_NODE:
        raise bad("gpus_per_node", f"must be from 1 to {MAX_GPUS_PER_NODE}, got {gpus_per_node}")


def world_env(world_size, rank, gpus_per_node):
    """What torchrun would set for rank `rank` of `world_size` on nodes of
    `gpus_per_node` GPUs, and the phantom's devices for one node."""
    local_world = min(gpus_per_node, world_size)
    return {
        WORLD_ENV: f"{rank}/{world_size}",
        "RANK": str(rank), "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank % gpus_per_node), "LOCAL_WORLD_SIZE": str(local_world),
        "GROUP_RANK": str(rank // gpus_per_node), "NODE_RANK": str(rank // gpus_per_node),
        "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
        "VG_FAKECUDA_DEVICES": str(local_world),
    }


def world_notes(result, runs):
    """The report's lines on a --world-size run, and on NCCL's own memory
    (either distributed mode)."""
    from ...render.words import count

    notes = []
    world = result.get("world_size")
    if world:
        rank = result.get("rank") or 0
        notes.append(f"One process ran as rank {rank} of {world:,} (--world-size) on PyTorch's fake process "
                     "group: collectives completed at once and moved nothing; sharded shapes are the "
                     "cluster's. The figures hold for every rank with the same role (under pipeline "
                     "parallelism stages differ: --rank picks another).")
        seen = {}
        for run in runs:
            for name, n in ((run.get("fake_world") or {}).get("unserved") or {}).items():
                seen[name] = max(seen.get(name, 0), n)
        objects = [f"{name} ({count(n, 'call')})" for name, n in sorted(seen.items()) if UNSERVED[name] == "object"]
        p2p = [f"{name} ({count(n, 'call')})" for name, n in sorted(seen.items()) if UNSERVED[name] == "p2p"]
        if objects:
            notes.append(f"Not served by the fake group: {', '.join(objects)}: the objects arrive as zeros "
                         "(or not at all), so what the program did with them is not the real run's.")
        if p2p:
            notes.append(f"Not served by the fake group: point-to-point {', '.join(p2p)}: received tensors "
                         "hold zeros, and shapes a real peer would send are not known (pipeline stages).")
        splits = max(((run.get("fake_world") or {}).get("all_to_all_with_splits") or 0) for run in runs)
        if splits:
            notes.append(f"all_to_all_single with split sizes ran {count(splits, 'time')}: where those sizes "
                         "come from values exchanged first (a mixture of experts' token counts), they are "
                         "zeros here and the buffers' sizes differ from the real run's.")
        served = max(((run.get("fake_world") or {}).get("ddp_served") or 0) for run in runs)
        kept_out = max(((run.get("fake_world") or {}).get("ddp_hooks_kept_out") or 0) for run in runs)
        if served:
            notes.append(f"DistributedDataParallel all-reduces its gradient buckets through a hook whose result "
                         f"a fake group does not give: the dry run's hook returned each bucket as it is, the "
                         f"tensors a real all-reduce returns ({count(served, 'DDP module')})"
                         + (f"; {count(kept_out, 'communication hook')} the script registered did not run "
                            "(compression hooks' buffers are not in the figures)." if kept_out else "."))
        reads = max(((run.get("fake_world") or {}).get("reads_after_first_collective") or 0) for run in runs)
        if reads:
            notes.append(f"The program read device values back {count(reads, 'time', 'times')} after its "
                         "first collective: a collective's result read back (a token count, a loss "
                         "averaged across ranks) is zeros here, and shapes or control flow decided on it "
                         "may differ from the real run's.")
    if world or (result.get("nproc") or 1) > 1:
        if not os.environ.get("VG_PHANTOM_NCCL_COMM"):
            notes.append("Memory NCCL itself takes on each card (its communicators' buffers, outside "
                         "PyTorch's allocator) is not in these figures: VG_PHANTOM_NCCL_COMM=SIZE gives "
                         "each communicator that much of its device.")
    return notes


# ------------------------------------------------------------------ the child

class FakeWorld:
    """In the child: init_process_group and new_group served by the fake
    group, and what it cannot serve counted."""

    def __init__(self, spec, read_counter):
        rank, world = spec.split("/")
        self.rank, self.world_size = int(rank), int(world)
        self.read_counter = read_counter  # () -> device reads so far (the phantom's counter)
        self.unserved = {}
        self.all_to_all_with_splits = 0
        self.collectives = 0
        self.reads_at_first_collective = None
        self._inside = threading.local()
        self.ddp_served = 0  # DistributedDataParallel modules whose buckets the dry run's hook returns
        self.ddp_hooks_kept_out = 0  # communication hooks the script registered, not run

    def install(self):
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d
        from torch.testing._internal.distributed import fake_pg  # registers the "fake" backend

        self._patch_init(dist, c10d, fake_pg.FakeStore)
        self._patch_new_group(dist, c10d)
        for name in UNSERVED:
            self._count(dist, c10d, name, self._unserved)
        for name in COLLECTIVES:
            self._count(dist, c10d, name, self._collective)
        self._serve_ddp_buckets()

    def _serve_ddp_buckets(self):
        """DDP all-reduces each gradient bucket through a communication hook
        whose future must hold the reduced bucket; a fake group's work
        completes with no value, and backward fails inside DDP ("expected
        the hook result is either a Tensor or a TensorList found None").
        Every DistributedDataParallel gets a hook that completes with the
        bucket itself, which is what the real all-reduce returns (it reduces
        the bucket in place): the same tensors, so the same memory. A hook
        the script registers would fail the same way: it is counted, and
        the dry run's stays."""
        import torch
        from torch.nn.parallel import DistributedDataParallel as ddp

        def bucket_as_is(state, bucket):
            done = torch.futures.Future()
            done.set_result(bucket.buffer())
            return done

        world, init, register = self, ddp.__init__, ddp.register_comm_hook

        @functools.wraps(init)
        def __init__(module, *args, **kwargs):
            init(module, *args, **kwargs)
            register(module, None, bucket_as_is)
            world.ddp_served += 1

        @functools.wraps(register)
        def register_comm_hook(module, state, hook):
            world.ddp_hooks_kept_out += 1

        def register_builtin_comm_hook(module, comm_hook_type):
            world.ddp_hooks_kept_out += 1

        ddp.__init__ = __init__
        ddp.register_comm_hook = register_comm_hook
        ddp._register_builtin_comm_hook = register_builtin_comm_hook

    def _patch_init(self, dist, c10d, fake_store):
        original = c10d.init_process_group
        world = self

        @functools.wraps(original)
        def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1,
                               store=None, group_name="", pg_options=None, device_id=None, **kwargs):
            # Whatever backend and rendezvous the script names: the fake group, as rank R of N.
            extra = {"timeout": timeout} if timeout is not None else {}
            return original(backend="fake", store=fake_store(), world_size=world.world_size, rank=world.rank,
                            group_name=group_name, device_id=device_id, **extra, **kwargs)

        _replace(dist, c10d, "init_process_group", init_process_group)
        try:
            import torch.distributed.device_mesh as mesh  # imported the function by name
        except ImportError:
            return
        if getattr(mesh, "init_process_group", None) is original:
            mesh.init_process_group = init_process_group

    def _patch_new_group(self, dist, c10d):
        original = c10d.new_group

        @functools.wraps(original)
        def new_group(ranks=None, timeout=None, backend=None, pg_options=None, *args, **kwargs):
            # a subgroup inherits the fake backend; NCCL's options mean nothing to it
            return original(ranks, timeout, None, None, *args, **kwargs)

        _replace(dist, c10d, "new_group", new_group)

    def _count(self, dist, c10d, name, on_call):
        original = getattr(c10d, name, None)
        if original is None:
            return

        inside = self._inside

        @functools.wraps(original)
        def counted(*args, **kwargs):
            if getattr(inside, "depth", 0):  # called by another counted call (send -> isend): not the program's
                return original(*args, **kwargs)
            on_call(name, args, kwargs)
            inside.depth = 1
            try:
                return original(*args, **kwargs)
            finally:
                inside.depth = 0

        _replace(dist, c10d, name, counted)

    def _unserved(self, name, args, kwargs):
        self.unserved[name] = self.unserved.get(name, 0) + 1

    def _collective(self, name, args, kwargs):
        self.collectives += 1
        if self.reads_at_first_collective is None:
            self.reads_at_first_collective = self.read_counter() or 0
        if name == "all_to_all_single":
            splits = [kwargs.get("output_split_sizes", args[2] if len(args) > 2 else None),
                      kwargs.get("input_split_sizes", args[3] if len(args) > 3 else None)]
            if any(s is not None for s in splits):
                self.all_to_all_with_splits += 1

    def figures(self):
        reads = None
        if self.reads_at_first_collective is not None:
            reads = max(0, (self.read_counter() or 0) - self.reads_at_first_collective)
        return {"rank": self.rank, "world_size": self.world_size, "collectives": self.collectives,
                "unserved": dict(self.unserved), "all_to_all_with_splits": self.all_to_all_with_splits,
                "reads_after_first_collective": reads, "ddp_served": self.ddp_served,
                "ddp_hooks_kept_out": self.ddp_hooks_kept_out}


def _replace(dist, c10d, name, fn):
    """`name` replaced in torch.distributed_c10d and in torch.distributed
    (which re-exports it), where the script will look it up."""
    setattr(c10d, name, fn)
    if hasattr(dist, name):
        setattr(dist, name, fn)


class _FakeWorld(Feature):
    name = "fake_world"

    def env(self, options):
        if options.world_size is None:
            return {}
        return world_env(options.world_size, options.rank or 0, options.gpus_per_node)

    def install(self, run):
        if not os.environ.get(WORLD_ENV):  # --world-size: this process is one rank of many
            return None
        import ctypes

        world = FakeWorld(os.environ[WORLD_ENV], lambda: run.counter("vg_fakecuda_d2h_reads", ctypes.c_long))
        world.install()
        return world

    def figures(self, world, run):
        return {"fake_world": world.figures() if world is not None else None}

    def notes(self, result, runs):
        return world_notes(result, runs)


FEATURE = _FakeWorld()
