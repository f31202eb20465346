"""Sizes people type ("15GiB", "12.5GB", "T4", 2**30) and sizes people read.

One rule for every size vramguard takes (a replay's budget, install()'s,
Heap's, the command line's): parse_size() reads it, parse_budget() adds what
a budget must be.
"""
import math
import re
from decimal import Decimal, localcontext

from ._core import SEGMENT_GRANULE, format_size
from ._presets import find_preset, preset_names

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2,
    "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")

#: Every size the allocator takes is a 64-bit number (the C core's rule).
MAX_BYTES = (1 << 64) - 1

__all__ = ["parse_size", "parse_budget", "format_size", "format_size_column", "MAX_BYTES"]


def _too_large(what, value):
    # The wording of the C side's check (vgpy_as_u64), so one rule reads one way.
    return ValueError(f"{what} {value!r} is too large (more than 64 bits)")


def parse_size(value, what="size"):
    """Bytes from an int, or from a string such as "15GiB", "12.5GB", "512 MiB",
    or a GPU preset's name ("T4": its usable bytes, see vramguard.PRESETS).

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
    preset = find_preset(value)
    if preset is not None:
        return preset.usable_bytes
    match = _PATTERN.match(value)
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS:
        raise ValueError(
            f"cannot read {value!r} as a size: write bytes, or a number with a unit "
            "(B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), e.g. '15GiB' or '12.5GB', "
            f"or a GPU preset ({preset_names()})"
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


def _bare_number(value):
    """True for a size written without a unit: 15, "15", "1.5"."""
    if isinstance(value, (int, float)):
        return True
    match = _PATTERN.match(value) if isinstance(value, str) else None
    return bool(match) and not match.group(2)


def _positive(value):
    """True for a size above zero that rounds down to 0 bytes ("0.5", 1e-30):
    positive as typed, so "must be positive" would puzzle; too small is the error."""
    if isinstance(value, str):
        match = _PATTERN.match(value)
        return bool(match) and Decimal(match.group(1)) != 0
    return value > 0


def _bytes(n):
    return f"{n} byte" if n == 1 else f"{n} bytes"


def parse_budget(value, what="budget"):
    """Bytes for a budget, by parse_size()'s rule, and at least one 2 MiB
    segment (the least any allocation reserves): a bare number below that is
    nearly always a size whose unit was left out ("15" meant 15 GiB), so it
    is refused with the unit it likely needs."""
    nbytes = parse_size(value, what)
    if nbytes == 0 and not _positive(value):
        raise ValueError(f"a {what} must be positive, got {value!r} (None means no budget)")
    if nbytes < SEGMENT_GRANULE:
        if _bare_number(value):
            shown = value.strip() if isinstance(value, str) else value
            typed = _bytes(nbytes) if nbytes else f"{shown} bytes"
            raise ValueError(
                f"a {what} of {typed} is smaller than one 2 MiB segment: give a unit, e.g. '{shown}GiB'"
            )
        raise ValueError(
            f"a {what} of {value!r} ({_bytes(nbytes)}) is smaller than one 2 MiB segment, "
            "the least any allocation reserves"
        )
    return nbytes


_COLUMN_UNITS = ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
#: The widest a size gets in a table column ("999.99 MiB", "1024 bytes").
COLUMN_WIDTH = 10


def format_size_column(nbytes):
    """format_size() in at most COLUMN_WIDTH characters, for a table column:
    where it would take more ("1000.00 MiB" to "1023.99 MiB", "15360.00 GiB")
    the figure moves to the next unit ("0.98 GiB", "15.00 TiB")."""
    text = format_size(nbytes)
    if len(text) <= COLUMN_WIDTH:
        return text
    level = _COLUMN_UNITS.index(text.rsplit(" ", 1)[1])
    value = nbytes / 1024**level
    while round(value, 2) >= 1000 and level < len(_COLUMN_UNITS) - 1:
        value /= 1024
        level += 1
    return f"{value:.2f} {_COLUMN_UNITS[level]}"
