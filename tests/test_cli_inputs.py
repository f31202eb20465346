"""`python -m vramguard replay` on paths that are not trace files: one line,
status 2, and never a wait (a FIFO with no writer blocks whoever opens it;
a device reads without end)."""
import os
import subprocess
import sys

import pytest


def replay(path, cwd):
    # The timeout only keeps a regression from hanging the suite; the
    # assertions are on the status and the line.
    return subprocess.run([sys.executable, "-m", "vramguard", "replay", str(path)], capture_output=True,
                          text=True, cwd=cwd, timeout=60)


def check_refused(proc, said):
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("vramguard: "), proc.stderr
    assert said in proc.stderr, proc.stderr


def test_an_empty_file_says_it_is_empty(tmp_path):
    (tmp_path / "memory.pickle").write_bytes(b"")
    check_refused(replay("memory.pickle", tmp_path), "vramguard: memory.pickle: the file is empty")


def test_a_directory_says_so(tmp_path):
    (tmp_path / "traces").mkdir()
    check_refused(replay("traces", tmp_path), "vramguard: traces: is a directory, not a trace file")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_is_refused_without_opening_it(tmp_path):
    os.mkfifo(tmp_path / "trace.pickle")
    check_refused(replay("trace.pickle", tmp_path), "trace.pickle: not a regular file (a pipe or a device)")


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_a_device_is_refused(tmp_path):
    check_refused(replay("/dev/zero", tmp_path), "/dev/zero: not a regular file")


def test_dangling_and_looping_links_name_the_path(tmp_path):
    (tmp_path / "dangling.pickle").symlink_to("nowhere")
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    check_refused(replay("dangling.pickle", tmp_path), "vramguard: dangling.pickle: No such file or directory")
    check_refused(replay("a", tmp_path), "vramguard: a: Too many levels of symbolic links")
