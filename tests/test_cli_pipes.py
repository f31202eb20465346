"""The command line when its surroundings go away: a reader that closes
stdout early (`python -m vramguard demo | head -1`) and Ctrl-C."""
import os
import subprocess
import sys

import vramguard.trace.importer
from vramguard import Trace, save_trace
from vramguard.cli import EXIT_INTERRUPTED, EXIT_STDOUT_CLOSED, main

MiB = 1 << 20


def small_trace(tmp_path):
    t = Trace("small")
    t.free(t.alloc(MiB))
    path = tmp_path / "small.vgtrace"
    save_trace(t, path)
    return path


def run_into_closed_pipe(*args, cwd=None):
    """The command with a stdout whose reader has already gone: every
    write fails with EPIPE, as when `head` has exited."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([sys.executable, "-m", "vramguard", *args], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, cwd=cwd)
    finally:
        os.close(write_end)


def test_demo_into_a_closed_pipe_exits_quietly():
    proc = run_into_closed_pipe("demo", "--steps", "1")
    assert proc.stderr == ""
    assert proc.returncode == EXIT_STDOUT_CLOSED == 141


def test_replay_into_a_closed_pipe_exits_quietly(tmp_path):
    path = small_trace(tmp_path)
    for extra in ([], ["--json"]):
        proc = run_into_closed_pipe("replay", str(path), *extra)
        assert proc.stderr == ""
        assert proc.returncode == EXIT_STDOUT_CLOSED


def test_ctrl_c_during_a_replay_is_one_line_and_status_130(tmp_path, monkeypatch, capsys):
    def interrupted(_path):
        raise KeyboardInterrupt

    monkeypatch.setattr(vramguard.trace.importer, "load_trace", interrupted)
    status = main(["replay", str(small_trace(tmp_path))])
    out, err = capsys.readouterr()
    assert status == EXIT_INTERRUPTED == 130
    assert err == "vramguard: interrupted\n" and out == ""
