"""A phantom device's settings, checked where a dry run and a phantom
Jupyter kernel both take them: its size beside the CUDA context, and the
PYTORCH_CUDA_ALLOC_CONF each allocator runs under. A bad value is refused
with one line (DryRunInputError), named as the caller spelled it
(argnames)."""
from .._core import format_size
from . import argnames

__all__ = ["DryRunInputError", "alloc_conf", "check_device", "check_size"]


class DryRunInputError(ValueError):
    """A dry run that cannot start: a missing script, an unknown GPU, a bad
    option. One line says what."""


def check_size(value, what):
    if value is None:
        return None
    from .._units import parse_size

    try:
        nbytes = parse_size(value, what)
    except (TypeError, ValueError) as exc:
        said = str(exc)
        for lead in (f"{what} {value!r} ", f"a {what} "):  # parse_size names the value too: once is enough
            if said.startswith(lead):
                said = said[len(lead):]
                break
        raise DryRunInputError(f"{argnames.given(what, value)}: {said}") from None
    return nbytes


def check_device(memory, preset, context=None):
    """(device bytes, context bytes): `memory` (bytes or "8GiB"; None: the
    preset's total) and `context` (None: the preset's), refused with one
    line when the device would hold nothing beside its CUDA context. The
    dry run's rule, and a phantom kernel's."""
    device = check_size(memory, "memory") if memory is not None else preset.total_bytes
    context = check_size(context, "context") if context is not None else preset.context_bytes
    if device <= context:
        raise DryRunInputError(f"{argnames.given('memory', format_size(device), quote=False)} leaves nothing beside "
                               f"the CUDA context's "
                               f"{format_size(context)}")
    return device, context


def alloc_conf(allocator, user=None):
    """PYTORCH_CUDA_ALLOC_CONF for a run: the user's (`user`) as it is for
    native; for expandable the user's with expandable_segments:True in place
    of any expandable_segments setting of theirs; none for vramguard, whose
    allocator replaces PyTorch's."""
    if allocator == "vramguard":
        return None
    items = [item.strip() for item in (user or "").split(",") if item.strip()]
    if allocator == "expandable":
        items = [item for item in items if item.split(":")[0].strip() != "expandable_segments"]
        items.append("expandable_segments:True")
    return ",".join(items) or None
