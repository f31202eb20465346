"""PyTorch's CUDA out-of-memory message, read back into figures.

Three wordings are read:

- PyTorch 2.1 and later: "Tried to allocate X. GPU 0 has a total capacity of T of
  which F is free. [Including non-PyTorch memory, this process has P memory in use.]
  [Process N has P memory in use.]... Of the allocated memory A is allocated by
  PyTorch, and R is reserved by PyTorch but unallocated." (2.1 spells "capacty";
  a GPU index may be missing: "GPU has a total capacity ...").
- PyTorch 1.x and 2.0: "Tried to allocate X (GPU 0; T total capacity; A already
  allocated; F free; R reserved in total by PyTorch)": reserved but unallocated is
  R - A, with the precision of both.
- The short form: "Tried to allocate X. GPU has T total, F free, P in use by this
  process."

A figure the message does not give (a message cut short) is None. A size is kept
as the text PyTorch printed and its bytes: comparisons are made at that precision
(format_size writes what PyTorch would print for a byte count).
"""
import re
from dataclasses import dataclass, field
from typing import List, Optional

UNITS = {"bytes": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_SIZE = r"(\d+(?:\.\d+)?)\s*(bytes|B|KiB|MiB|GiB|TiB)"


class MessageError(ValueError):
    """Not an out-of-memory message of PyTorch's (no request in it)."""


@dataclass(frozen=True)
class Size:
    text: str  # as printed: "1024.00 MiB"
    bytes: int  # its value in bytes (the printed figure times the unit)
    unit: str

    def __str__(self):
        return self.text


def parse_size(text):
    """'1.45 GiB' -> Size; ValueError for anything else."""
    m = re.fullmatch(r"\s*" + _SIZE + r"\s*", text or "")
    if not m:
        raise ValueError(f"not a size: {text!r}")
    number, unit = m.groups()
    return Size(f"{number} {unit}", round(float(number) * UNITS[unit]), unit)


def format_size(nbytes):
    """A byte count as PyTorch's allocator prints it (c10 format_size)."""
    if nbytes <= 1024:
        return f"{int(nbytes)} bytes"
    if nbytes <= 1048576:
        return f"{nbytes / 1024:.2f} KiB"
    if nbytes <= 1073741824:
        return f"{nbytes / 1048576:.2f} MiB"
    return f"{nbytes / 1073741824:.2f} GiB"


def half_step(size):
    """Half the last printed digit of `size`, in bytes: the rounding a printed figure carries."""
    decimals = len(size.text.split(" ")[0].partition(".")[2])
    return UNITS[size.unit] * 0.5 * 10 ** -decimals


@dataclass
class OomMessage:
    form: str  # "2.1+", "old" or "short"
    requested: Size
    total: Optional[Size] = None
    free: Optional[Size] = None
    allocated: Optional[Size] = None  # allocated by PyTorch ("already allocated" in the old form)
    reserved_unallocated: Optional[Size] = None  # the 2.1+ form's own figure
    reserved_total: Optional[Size] = None  # the old form's "reserved in total"
    this_process: Optional[Size] = None  # "this process has P memory in use"
    other_processes: List[Size] = field(default_factory=list)  # "Process N has P memory in use"

    def reserved_unallocated_bytes(self):
        """Reserved but unallocated: printed (2.1+), or reserved in total less allocated (old)."""
        if self.reserved_unallocated is not None:
            return self.reserved_unallocated.bytes
        if self.reserved_total is not None and self.allocated is not None:
            return self.reserved_total.bytes - self.allocated.bytes
        return None

    def non_pytorch_bytes(self):
        """What the card held beside PyTorch's cache at the failure, every process's
        included: total - free - allocated - reserved but unallocated (None when the
        message lacks a figure)."""
        unalloc = self.reserved_unallocated_bytes()
        if None in (self.total, self.free, self.allocated, unalloc):
            return None
        return self.total.bytes - self.free.bytes - self.allocated.bytes - unalloc


def _find(pattern, text):
    m = re.search(pattern, text)
    return parse_size(f"{m.group(1)} {m.group(2)}") if m else None


def parse_message(text):
    """The figures of one out-of-memory message; MessageError when it has no request."""
    if not isinstance(text, str):
        raise MessageError("not a message")
    text = " ".join(text.split())  # the pages' line breaks and doubled spaces
    requested = _find(r"Tried to allocate " + _SIZE, text)
    if requested is None:
        raise MessageError(f"no 'Tried to allocate' in {text[:80]!r}")
    if re.search(r"Tried to allocate " + _SIZE + r" \(\s*GPU", text):
        msg = OomMessage("old", requested)
        msg.total = _find(_SIZE + r" total capacity", text)
        msg.allocated = _find(_SIZE + r" already allocated", text)
        msg.free = _find(_SIZE + r" free", text)
        msg.reserved_total = _find(_SIZE + r" reserved in total", text)
        return msg
    short = re.search(r"GPU(?: \d+)? has " + _SIZE + r" total, " + _SIZE + r" free(?:, " + _SIZE
                      + r" in use by this process)?", text)
    if short:
        msg = OomMessage("short", requested)
        g = short.groups()
        msg.total = parse_size(f"{g[0]} {g[1]}")
        msg.free = parse_size(f"{g[2]} {g[3]}")
        if g[4]:
            msg.this_process = parse_size(f"{g[4]} {g[5]}")
        return msg
    msg = OomMessage("2.1+", requested)
    cap = re.search(r"total capac(?:i)?ty of " + _SIZE + r"(?: of which " + _SIZE + r" is free)?", text)
    if cap:
        msg.total = parse_size(f"{cap.group(1)} {cap.group(2)}")
        if cap.group(3):
            msg.free = parse_size(f"{cap.group(3)} {cap.group(4)}")
    msg.this_process = _find(r"this process has " + _SIZE + r" memory in use", text)
    msg.other_processes = [parse_size(f"{a} {b}") for a, b in
                           re.findall(r"Process \d+ has " + _SIZE + r" memory in use", text)]
    msg.allocated = _find(_SIZE + r" is allocated by PyTorch", text)
    msg.reserved_unallocated = _find(_SIZE + r" is reserved by PyTorch but unallocated", text)
    return msg


def equal_at_precision(real, phantom_bytes):
    """Whether `phantom_bytes`, printed as PyTorch prints it, is the text `real` shows."""
    return format_size(phantom_bytes) == real.text


def signed_error(real, phantom_bytes):
    """(phantom - real) / real; None where either is missing or real is zero."""
    if real is None or phantom_bytes is None or real.bytes == 0:
        return None
    return (phantom_bytes - real.bytes) / real.bytes
