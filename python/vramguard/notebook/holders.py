"""Who holds the memory still live after recover(): the variables of the
user's namespace (a notebook's globals, or __main__'s) that hold CUDA
tensors, with their bytes per device, largest first; and what PyTorch
itself keeps (its cuBLAS workspaces), measured by releasing them as
PyTorch's own leak check does (torch.testing's CudaMemoryLeakCheck calls
torch._C._cuda_clearCublasWorkspaces() so as not to count them).
"""
import itertools
import sys

__all__ = ["holders", "release_torch_workspaces", "bytes_by_device", "union_by_device"]

# How far into containers a variable is searched (a dict of tensors, a list
# of batches); a module's parameters, their gradients and its buffers, an
# optimizer's state.
DEPTH = 3
# Items looked at per container: a list of a million numbers is no holder,
# and walking it would stall the line after every error.
MAX_ITEMS = 10_000
# IPython's own names: its history and outputs, not the user's variables.
_IPYTHON_NAMES = {"In", "Out", "exit", "quit", "get_ipython"}


def _storages(value, torch, depth, seen):
    """(device index, key, bytes) of the CUDA storages `value` reaches."""
    if isinstance(value, torch.Tensor):
        if value.is_cuda:
            storage = value.untyped_storage()
            key = (value.device.index, storage.data_ptr())
            if key not in seen:
                seen.add(key)
                yield value.device.index, storage.nbytes()
        return
    if isinstance(value, torch.nn.Module):  # its weights, their gradients, its buffers
        params = list(value.parameters())
        grads = [p.grad for p in params if p.grad is not None]
        for tensor in params + grads + list(value.buffers()):
            yield from _storages(tensor, torch, 0, seen)
        return
    if isinstance(value, torch.optim.Optimizer):
        value = list(value.state.values())
    if depth <= 0:
        return
    if isinstance(value, dict):
        items = value.values()
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = value
    else:
        return
    for item in list(itertools.islice(items, MAX_ITEMS)):
        yield from _storages(item, torch, depth - 1, seen)


def bytes_by_device(value, depth=DEPTH):
    """{device index: bytes} of the distinct CUDA storages `value` holds."""
    return union_by_device([value], depth)


def union_by_device(values, depth=DEPTH):
    """{device index: bytes} of the distinct CUDA storages the values hold
    together (a tensor two of them hold counts once)."""
    torch = sys.modules.get("torch")
    out, seen = {}, set()
    if torch is None:
        return out
    for value in values:
        for device, nbytes in _storages(value, torch, depth, seen):
            out[device] = out.get(device, 0) + nbytes
    return out


def holders(namespace):
    """[(name, {device: bytes})] of the namespace's variables that hold CUDA
    memory, largest first (names starting with "_" and IPython's own are
    skipped: they are history, not the user's)."""
    found = []
    for name, value in list(namespace.items()):
        if name.startswith("_") or name in _IPYTHON_NAMES:
            continue
        try:
            held = bytes_by_device(value)
        except Exception:  # a property that raises, a half-built object
            continue
        if held:
            found.append((name, held))
    return sorted(found, key=lambda item: (-sum(item[1].values()), item[0]))


def release_torch_workspaces():
    """Releases PyTorch's cached cuBLAS workspaces (it makes them again at
    the next matrix multiply); False when this PyTorch has no such call."""
    torch = sys.modules.get("torch")
    clear = getattr(getattr(torch, "_C", None), "_cuda_clearCublasWorkspaces", None)
    if clear is None:
        return False
    clear()
    return True
