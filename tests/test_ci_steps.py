"""make test's step machinery: tests/beside.sh runs a step beside others
(its output whole after theirs, its status passed on, its processes ended
when the others fail), and tests/steps_table.sh times the whole from the
first start to the last end, naming the steps that ran side by side."""
import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BESIDE, TABLE = str(ROOT / "tests" / "beside.sh"), str(ROOT / "tests" / "steps_table.sh")


def _run(args, steps, **kw):
    env = dict(os.environ, STEPS_FILE=str(steps))
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=60, **kw)


def test_the_background_output_follows_the_foreground_and_both_are_timed(tmp_path):
    steps = tmp_path / "steps.tsv"
    proc = _run([BESIDE, "libraries", "bash", "-c", "echo from-bg", "--",
                 str(ROOT / "tests" / "timed_step.sh"), "suite", "bash", "-c", "sleep 1; echo from-fg"], steps)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.index("from-fg") < out.index("== libraries, run beside the steps above:") < out.index("from-bg")
    names = [line.split("\t")[0] for line in steps.read_text().splitlines()]
    assert sorted(names) == ["libraries", "suite"]
    assert all(len(line.split("\t")) == 5 for line in steps.read_text().splitlines())


def test_a_failed_background_step_fails_the_whole(tmp_path):
    proc = _run([BESIDE, "libraries", "bash", "-c", "exit 4", "--", "true"], tmp_path / "s.tsv")
    assert proc.returncode == 4
    # its seconds are the machine's (0 s, or 1 s on a busy one): not asserted
    assert re.search(r"== step libraries: \d+ s, failed \(exit 4\)", proc.stdout), proc.stdout


def test_a_failed_foreground_ends_the_background_and_passes_its_status(tmp_path):
    marker = tmp_path / "still-running"
    proc = _run([BESIDE, "libraries", "bash", "-c", f"sleep 2; touch {marker}", "--", "bash", "-c", "exit 3"],
                tmp_path / "s.tsv")
    assert proc.returncode == 3
    assert "stopped, the steps beside it failed" in proc.stdout
    subprocess.run(["sleep", "3"])
    assert not marker.exists()  # the background step's processes ended with it


def test_bad_arguments_get_the_usage(tmp_path):
    for args in ([], ["name", "true"], ["name", "--", "true", "x"], ["name", "true", "--"]):
        proc = _run([BESIDE, *args], tmp_path / "s.tsv")
        assert proc.returncode == 2 and ("usage" in proc.stderr or "want NAME" in proc.stderr), args


def test_the_whole_is_wall_time_and_overlaps_are_named(tmp_path):
    steps = tmp_path / "steps.tsv"
    steps.write_text("libraries\t100\t0\t1000\t1100\n"
                     "C tests\t60\t0\t1000\t1060\n"
                     "fast suite\t50\t1\t1060\t1110\n"
                     "tier\t30\t0\t1110\t1140\n")
    table = subprocess.run([TABLE, str(steps)], capture_output=True, text=True, check=True).stdout
    assert "| libraries | 100 s | 71% | C tests; fast suite |" in table
    assert "| fast suite (failed, exit 1) | 50 s | 36% | libraries |" in table
    assert "| tier | 30 s | 21% |  |" in table
    assert "| **all 4 steps** | **2 min 20 s** | | 100 s side by side |" in table


def test_rows_without_start_and_end_count_one_after_the_other(tmp_path):
    steps = tmp_path / "steps.tsv"
    steps.write_text("a\t60\t0\nb\t30\t0\n")
    table = subprocess.run([TABLE, str(steps)], capture_output=True, text=True, check=True).stdout
    assert "| **all 2 steps** | **1 min 30 s** | |  |" in table
    assert "| a | 60 s | 67% |  |" in table


def test_nothing_recorded_says_so(tmp_path):
    out = subprocess.run([TABLE, str(tmp_path / "none.tsv")], capture_output=True, text=True, check=True).stdout
    assert out.startswith("no step was timed")
