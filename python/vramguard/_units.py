"""Sizes people type ("15GiB", "12.5GB", 2**30) and sizes people read."""
import math
import re

from ._core import format_size

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2,
    "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")

__all__ = ["parse_size", "format_size"]


def parse_size(value):
    """Bytes from an int, or from a string such as "15GiB", "12.5GB", "512 MiB".

    GB/MB/KB are powers of ten, GiB/MiB/KiB powers of two, as the units say.
    Raises ValueError for anything else (negative, empty, unknown unit).
    """
    if isinstance(value, bool):
        raise TypeError("a size must be an int or a string like '15GiB', not a bool")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a size must not be negative, got {value}")
        return value
    if isinstance(value, float):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"a size must be a finite non-negative number, got {value}")
        return int(value)
    if not isinstance(value, str):
        raise TypeError(f"a size must be an int or a string like '15GiB', not {type(value).__name__}")
    match = _PATTERN.match(value)
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS:
        raise ValueError(
            f"cannot read {value!r} as a size: write bytes, or a number with a unit "
            "(B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), e.g. '15GiB' or '12.5GB'"
        )
    return int(float(match.group(1)) * _UNITS[unit])
