"""Sizes people type ("15GiB", "12.5GB", 2**30) and sizes people read."""
import math
import re
from decimal import Decimal, localcontext

from ._core import format_size

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2,
    "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")

#: Every size the allocator takes is a 64-bit number (the C core's rule).
MAX_BYTES = (1 << 64) - 1

__all__ = ["parse_size", "format_size", "MAX_BYTES"]


def _too_large(what, value):
    # The wording of the C side's check (vgpy_as_u64), so one rule reads one way.
    return ValueError(f"{what} {value!r} is too large (more than 64 bits)")


def parse_size(value, what="size"):
    """Bytes from an int, or from a string such as "15GiB", "12.5GB", "512 MiB".

    GB/MB/KB are powers of ten, GiB/MiB/KiB powers of two, as the units say.
    Raises ValueError for anything else (negative, empty, unknown unit, more
    than 64 bits); `what` names the value in the message.
    """
    if isinstance(value, bool):
        raise TypeError(f"a {what} must be an int or a string like '15GiB', not a bool")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a {what} must not be negative, got {value}")
        if value > MAX_BYTES:
            raise _too_large(what, value)
        return value
    if isinstance(value, float):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"a {what} must be a finite non-negative number, got {value}")
        if value > MAX_BYTES:
            raise _too_large(what, value)
        return int(value)
    if not isinstance(value, str):
        raise TypeError(f"a {what} must be an int or a string like '15GiB', not {type(value).__name__}")
    match = _PATTERN.match(value)
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS:
        raise ValueError(
            f"cannot read {value!r} as a size: write bytes, or a number with a unit "
            "(B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), e.g. '15GiB' or '12.5GB'"
        )
    # Decimal reads the digits exactly ("18446744075857035264" stays itself)
    # and keeps "1e400" a number to compare, not an infinity.
    number = Decimal(match.group(1))
    if number.adjusted() > 24:  # past 10**24: more than 64 bits in any unit
        raise _too_large(what, value)
    if number.adjusted() < -40:  # far below one byte
        return 0
    with localcontext() as ctx:
        ctx.prec = 80
        nbytes = int(number * _UNITS[unit])
    if nbytes > MAX_BYTES:
        raise _too_large(what, value)
    return nbytes
