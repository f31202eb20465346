"""The Python façade: sizes, the summary table, the demo command."""
import subprocess
import sys

import pytest

import vramguard
from vramguard import Heap, format_summary, parse_size

MiB, GiB = 1 << 20, 1 << 30


@pytest.mark.parametrize(
    "text, expected",
    [
        ("15GiB", 15 * GiB), ("12.5GB", 12_500_000_000), ("512 MiB", 512 * MiB),
        ("1024", 1024), ("2kb", 2000), ("1TiB", 1 << 40), (4096, 4096), ("1e3", 1000),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "GiB", "15 GiBs", "-1GiB", "fifteen", "1.2.3GB"])
def test_parse_size_rejects_with_a_clear_message(bad):
    with pytest.raises(ValueError, match="cannot read"):
        parse_size(bad)


@pytest.mark.parametrize("bad, error", [(-1, ValueError), (True, TypeError), ([1], TypeError), (float("nan"), ValueError)])
def test_parse_size_rejects_bad_types(bad, error):
    with pytest.raises(error):
        parse_size(bad)


def test_format_size_matches_torch():
    assert vramguard.format_size(512) == "512 bytes"
    assert vramguard.format_size(1536) == "1.50 KiB"
    assert vramguard.format_size(20 * MiB) == "20.00 MiB"
    assert vramguard.format_size(15 * GiB) == "15.00 GiB"


def test_summary_shows_current_peak_totals_and_counters():
    heap = Heap(GiB, budget=512 * MiB)
    a = heap.malloc(100 * MiB)
    b = heap.malloc(1000)
    heap.free(a)
    text = format_summary(heap.stats())
    lines = text.splitlines()
    assert all(len(line) == len(lines[0]) for line in lines), "every row is as wide as the table"
    assert "budget 512.00 MiB" in text
    row = next(line for line in lines if line.startswith("| Allocated memory"))
    assert row.split("|")[2:6] == ["   1.00 KiB ", " 100.00 MiB ", " 100.00 MiB ", " 100.00 MiB "]
    # the default is the arena: what it holds is mapped pages (50 for 100 MiB, 1 for the small pool)
    mapped = next(line for line in lines if line.startswith("| Mapped memory"))
    assert mapped.split("|")[2:6] == [" 102.00 MiB ", " 102.00 MiB ", " 102.00 MiB ", "    0 bytes "]
    assert "from small pool" in text and "maps 2 (51 pages)" in format_summary(heap.stats(), verbose=True)
    assert "maps 2" not in text
    assert "Cached free in pieces (1 - largest free block / cached free)" in text
    # the policy's counters are the verbose form's, one more section of the same width
    assert "cache hits" not in text
    verbose = format_summary(heap.stats(), verbose=True).splitlines()
    assert all(len(line) == len(lines[0]) for line in verbose)
    # the arena's provider calls are one more row in the verbose form, after its memory line
    maps = next(i for i, line in enumerate(verbose) if line.startswith("| maps 2 (51 pages)"))
    assert verbose[maps - 1].startswith("| Memory: arena") and lines[maps - 1] == verbose[maps - 1]
    verbose = verbose[:maps] + verbose[maps + 1:]
    assert verbose[:len(lines) - 1] == lines[:-1]
    assert verbose[len(lines) - 1:len(lines)] == ["|" + "-" * 79 + "|"]
    assert verbose[len(lines)].startswith("| cache hits 0, cache misses 2, splits 2, merges 1, ")
    heap.free(b)


def test_demo_command_prints_the_summary():
    out = subprocess.run(
        [sys.executable, "-m", "vramguard", "demo", "--steps", "2"], capture_output=True, text=True, check=True
    ).stdout
    assert "vramguard memory summary" in out
    assert "Peak reserved" in out


def test_cli_rejects_a_bad_size():
    proc = subprocess.run(
        [sys.executable, "-m", "vramguard", "demo", "--capacity", "lots"], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "cannot read 'lots' as a size" in proc.stderr


def test_format_size_picks_the_unit_after_rounding():
    GiB = 1 << 30
    assert vramguard.format_size(1023) == "1023 bytes"
    assert vramguard.format_size(1024) == "1.00 KiB"
    assert vramguard.format_size(MiB) == "1.00 MiB"
    assert vramguard.format_size(GiB) == "1.00 GiB"
    assert vramguard.format_size(GiB - 1) == "1.00 GiB"  # not "1024.00 MiB"
    assert vramguard.format_size(1000 * MiB) == "1000.00 MiB"
    assert vramguard.format_size(GiB - 6 * MiB) == "1018.00 MiB"
    assert vramguard.format_size((1 << 64) - 1) == "16.00 EiB"


def test_no_summary_row_breaks_out_of_the_box():
    """A row wider than the table (a long allocator line, counts in the
    billions) wraps onto rows of the table's width; no word is lost."""
    from vramguard.render.summary import summary_line

    text = "allocator: " + " ".join(f"word{i}" for i in range(30))
    rows = summary_line(text).splitlines()
    assert len(rows) == 3 and all(len(row) == 81 and row.startswith("| ") and row.endswith(" |") for row in rows)
    assert " ".join(" ".join(row[2:-2].split()) for row in rows) == text
    assert summary_line("short").splitlines() == ["| short" + " " * 72 + " |"]
    stats = Heap(1 << 30).stats()
    stats.update({"num_ooms": 10 ** 12, "num_device_errors": 10 ** 12, "num_invalid_frees": 10 ** 12,
                  "allocated_bytes.all.current": 1})
    lines = format_summary(stats).splitlines()
    assert all(len(line) == 81 for line in lines)
    assert "1,000,000,000,000 invalid frees" in " ".join(lines)
