"""NCCL's process group under a pluggable allocator.

From PyTorch 2.15 the default "nccl" backend is the torchcomms-based
ProcessGroupNCCL ("nccl2"). Destroying one (destroy_process_group, or the
interpreter's exit) constructs its caching-allocator hook, whose constructor
asks the allocator for a snapshot; PyTorch refuses snapshot() for every
pluggable allocator, in a destructor, so the process aborts ("terminate
called ... CUDAPluggableAllocator does not yet support snapshot") after the
job's last step. The legacy ProcessGroupNCCL asks only when
TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK is set. So install() makes
"nccl" the legacy group, as TORCH_DIST_USE_NCCL2=0 does, unless the user
chose with that variable; the variable is set too, for processes this one
starts and for a torch.distributed imported later."""
import os
import sys

ENV = "TORCH_DIST_USE_NCCL2"


def use_legacy_process_group():
    """What was decided, for summary(): a line, or None where there was
    nothing to decide (no nccl2 in this PyTorch, or the user's choice)."""
    if os.environ.get(ENV, "") != "":
        return None
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    nccl2 = getattr(c10d, "_create_nccl2_process_group", None)
    if c10d is not None and nccl2 is None:
        return None  # a PyTorch without nccl2
    # The backend is registered when first used, reading the variable then.
    os.environ[ENV] = "0"
    if c10d is not None:
        backend = getattr(c10d, "Backend", None)
        plugin = getattr(backend, "_plugins", {}).get("NCCL")
        legacy = getattr(c10d, "_register_builtin_nccl_as_legacy", None)
        if plugin is not None and getattr(plugin, "creator_fn", None) is nccl2 and legacy is not None:
            legacy()
    return f"the legacy NCCL process group ({ENV}=0, set by vramguard)"
