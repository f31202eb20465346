"""The public reports' corpus as bench/public_ooms/run.py reads it: one report once, every
report with a rebuild or a cause, and the summary's shares over the reports that say enough
to rebuild their run (no torch needed)."""
import os
import sys

import pytest

pytest.importorskip("tomllib")  # the runner reads TOML with the standard library's reader (3.11+)

HERE = os.path.join(os.path.dirname(__file__), "..", "bench", "public_ooms")
sys.path.insert(0, HERE)
import run  # noqa: E402

MESSAGE = ("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 14.75 GiB total capacity; 13.00 GiB "
           "already allocated; 10.00 MiB free; 13.50 GiB reserved in total by PyTorch)")


def write(tmp_path, text):
    path = tmp_path / "reports.toml"
    path.write_text(text)
    return path


def entry(id_, link="https://example.org/1", message=MESSAGE):
    return f'[[report]]\nid = "{id_}"\nlink = "{link}"\nmessage = "{message}"\n\n'


def test_an_id_twice_is_refused(tmp_path):
    path = write(tmp_path, entry("a") + entry("a", link="https://example.org/2"))
    with pytest.raises(ValueError, match="a is there twice"):
        run.load(path, "report")


def test_one_report_under_two_ids_is_refused(tmp_path):
    # the same page quoting the same message, reflowed: one report
    path = write(tmp_path, entry("a") + entry("b", message=MESSAGE.replace("; ", ";  ")))
    with pytest.raises(ValueError, match="b is the report a again"):
        run.load(path, "report")


def test_two_messages_on_one_page_are_two_reports(tmp_path):
    other = MESSAGE.replace("20.00 MiB", "40.00 MiB")
    path = write(tmp_path, entry("a") + entry("b", message=other))
    assert [e["id"] for e in run.load(path, "report")] == ["a", "b"]


def row(id_, rebuilt=True, rebuildable=True, phantom=True, equal=True, error=0.001):
    return {"id": id_, "rebuilt": rebuilt, "rebuildable": rebuildable,
            "phantom": {"requested": "1"} if phantom else None,
            "request_equal": equal if phantom else None, "allocated_error": error if phantom else None}


def test_shares_count_the_corpus_and_a_miss_for_each_report_not_matched():
    rows = [row("match"), row("off", equal=False, error=0.05), row("fits", phantom=False),
            row("not-yet", rebuilt=False, phantom=False),
            row("aside", rebuilt=False, rebuildable=False, phantom=False)]
    s = run.summary(rows)
    assert (s["looked_at"], s["set_aside"], s["reports"], s["rebuilt"], s["compared"]) == (5, 1, 4, 3, 2)
    assert (s["request_equal"], s["allocated_within_2pct"]) == (1, 1)
    assert s["allocated_worst_error"] == 0.05
    line = run.summary_line(s)
    assert line.startswith("5 reports looked at, 1 set aside (the page does not say enough to rebuild the "
                           "run, or quotes the message short); 4 in the corpus, 3 rebuilt, 2 of them reaching")
    assert "Request equal at the printed precision: 1 of 4 (25%)" in line
    assert "within 2%: 1 of 4 (25%)" in line


@pytest.mark.parametrize("aside", [0, 1, 3])
def test_the_summary_line_at_each_count_set_aside(aside):
    rows = [row("m")] + [row(f"x{i}", rebuilt=False, rebuildable=False, phantom=False) for i in range(aside)]
    line = run.summary_line(run.summary(rows))
    if aside:
        assert line.startswith(f"{1 + aside} reports looked at, {aside} set aside")
    else:
        assert line.startswith("1 in the corpus, 1 rebuilt, 1 of them")
    assert "1 of 1 (100%)" in line


def test_an_empty_corpus_has_no_shares_to_divide():
    line = run.summary_line(run.summary([row("x", rebuilt=False, rebuildable=False, phantom=False)]))
    assert "0 in the corpus, 0 rebuilt, 0 of them" in line and "0 of 0 (0%)" in line


def test_the_set_aside_reports_get_a_table_of_their_own():
    r = row("aside", rebuilt=False, rebuildable=False, phantom=False)
    r.update(link="https://example.org/a", total="14.75 GiB", cause="unstated: batch",
             real={"requested": "20.00 MiB", "allocated": "13.00 GiB"})
    kept = row("m", rebuilt=False, phantom=False)
    kept.update(link="https://example.org/m", total="14.75 GiB", cause="not yet rebuilt",
                real={"requested": "1", "allocated": "2"})
    text = run.table([kept, r])
    corpus, aside = text.split("Set aside, the page not saying enough to rebuild the run, or quoting the message short:")
    assert "[m](https://example.org/m)" in corpus and "aside" not in corpus
    assert "| [aside](https://example.org/a) | 14.75 GiB | 20.00 MiB | 13.00 GiB | unstated: batch |" in aside


def test_the_shipped_rows_are_the_corpus_as_worded_now():
    """bench/results' newest rows: one per report, each set aside or not as rebuilds.toml says,
    and the summary the one summary() computes from them."""
    import glob
    import json

    # the default torch's folders (public-ooms-<version>-<date>), not those of the day's torch
    folders = sorted(glob.glob(os.path.join(HERE, "..", "results", "public-ooms-[0-9]*")))
    assert folders, "no public-ooms results"
    data = json.load(open(os.path.join(folders[-1], "rows.json")))
    entries = {r["id"]: r for r in run.load(os.path.join(HERE, "rebuilds.toml"), "rebuild")
               + run.load(os.path.join(HERE, "rebuilds.toml"), "not_rebuilt")}
    reports = {r["id"] for r in run.load(os.path.join(HERE, "reports.toml"), "report")}
    assert sorted(r["id"] for r in data["rows"]) == sorted(reports)
    for row in data["rows"]:
        assert row["rebuildable"] is entries[row["id"]].get("rebuildable", True), row["id"]
        assert row["rebuilt"] is ("script" in entries[row["id"]]), row["id"]
    assert data["summary"] == run.summary(data["rows"])


def test_a_rebuild_cannot_be_set_aside(tmp_path):
    path = tmp_path / "rebuilds.toml"
    path.write_text('[[rebuild]]\nid = "a"\nscript = "x.py"\nrebuildable = false\n')
    with pytest.raises(ValueError, match="a is rebuilt"):
        run.load(path, "rebuild")


def test_the_shipped_corpus_is_whole():
    reports = run.load(os.path.join(HERE, "reports.toml"), "report")
    rebuilds = run.load(os.path.join(HERE, "rebuilds.toml"), "rebuild")
    unrebuilt = run.load(os.path.join(HERE, "rebuilds.toml"), "not_rebuilt")
    ids = {r["id"] for r in reports}
    covered = [r["id"] for r in rebuilds + unrebuilt]
    assert sorted(covered) == sorted(ids), "each report has one rebuild or one cause, and nothing else is there"
    for r in unrebuilt:
        assert r["cause"].strip(), r["id"]
        assert isinstance(r.get("rebuildable", True), bool), r["id"]
        # a report set aside says what its page leaves out; one in the corpus says what it needs
        assert r["cause"].startswith(("unstated", "the message", "not a capacity failure")) \
            if r.get("rebuildable") is False else r["cause"].startswith(("not rebuilt", "not yet rebuilt")), r["id"]


RELEASES = [("2022-12-15", "1.13.1"), ("2023-03-15", "2.0.0"), ("2023-05-08", "2.0.1"), ("2023-10-04", "2.1.0")]


@pytest.mark.parametrize("report, day", [
    ({"date": "2023-05-08", "torch_version": "not stated"}, ("2.0.1", "the newest release on 2023-05-08")),
    ({"date": "2023-05-07", "torch_version": "not stated"}, ("2.0.0", "the newest release on 2023-05-07")),
    ({"date": "2023-04-08", "torch_version": "1.13.1+cu117 (printed in the log)"}, ("1.13.1", "named by the report")),
    ({"date": "2022-01-01", "torch_version": "not stated"}, (None, "no release on or before 2022-01-01")),
    ({"torch_version": "not stated"}, (None, "the report has no date")),
])
def test_the_torch_of_a_reports_day(report, day):
    assert run.torch_of_day(report, RELEASES) == day


def test_the_shipped_releases_are_pypis_in_date_order():
    releases = run.load_releases()
    assert releases == sorted(releases)
    assert ("2023-05-08", "2.0.1") in releases and ("2025-01-29", "2.6.0") in releases
    assert len({v for _, v in releases}) == len(releases)


def test_a_rebuild_ran_when_it_reached_an_oom_or_fitted():
    assert run.ran(row("oom"))
    assert run.ran({"phantom": None, "phantom_error": "fits: no out-of-memory, peak allocated 7.17 GiB"})
    assert not run.ran({"phantom": None, "phantom_error": "ModuleNotFoundError: No module named 'tqdm'"})
    assert not run.ran({"phantom": None, "phantom_error": None})


def test_the_combined_rows_take_the_days_torch_wherever_it_ran_even_as_a_miss():
    default = [row("a"), row("b"), row("c", equal=False, error=0.05), row("d", rebuilt=False, phantom=False)]
    day = [dict(row("a", phantom=False), phantom_error="fits: no out-of-memory, peak allocated 1 GiB"),
           dict(row("b", phantom=False), phantom_error="ModuleNotFoundError: No module named 'x'"),
           row("c")]
    rows = run.combined(default, day)
    assert [r["id"] for r in rows] == ["a", "b", "c", "d"]
    assert rows[0] is day[0] and rows[1] is default[1] and rows[2] is day[2] and rows[3] is default[3]
    s = run.summary(rows)
    assert (s["compared"], s["request_equal"]) == (2, 2)  # a fitted under its day's torch: a miss now


def test_an_old_form_message_gives_reserved_unallocated_derived_and_marked():
    import messages

    figures = run.figures(messages.parse_message(MESSAGE))
    assert figures["reserved_unallocated"].text == "512.00 MiB*"
    assert figures["reserved_unallocated"].bytes == 512 * 2**20
    assert (figures["requested"].text, figures["allocated"].text, figures["free"].text) == (
        "20.00 MiB", "13.00 GiB", "10.00 MiB")


def test_under_the_days_torch_a_rebuild_takes_its_days_libraries():
    both = {"pythonpath": ["build/x-5.23"], "day_pythonpath": ["build/x-4.28"]}
    assert run.libraries(both) == ["build/x-5.23"]
    assert run.libraries(both, day=True) == ["build/x-4.28"]
    assert run.libraries({"pythonpath": ["build/x-4.29"]}, day=True) == ["build/x-4.29"]  # already of its day
    assert run.libraries({}, day=True) == [] and run.libraries({}) == []


def test_a_rebuild_for_its_days_torch_only_is_not_run_under_another(monkeypatch):
    """A rebuild whose library has no build for the default torch (day_only) gets a row saying
    why, without a dry run; the corpus' own such rows say so in the default torch's results."""
    def never(*a, **k):
        raise AssertionError("ran a dry run")

    monkeypatch.setattr(run.subprocess, "run", never)
    report = {"id": "r", "link": "https://example.org/1", "card": "T4", "card_total_from_message": "14.75 GiB",
              "message": "CUDA out of memory. Tried to allocate 2.00 MiB (GPU 0; 14.75 GiB total capacity; "
                         "13.21 GiB already allocated; 832.00 KiB free; 13.44 GiB reserved in total by PyTorch)"}
    rebuild = {"id": "r", "script": "x.py", "gpu": "T4", "day_only": "x has no build for it"}
    row = run.run_rebuild(rebuild, report, "/nonexistent")
    assert row["phantom_error"] == "not run under this torch: x has no build for it"
    assert not run.ran(row) and row.get("request_equal") is None
    day_only = {r["id"] for r in run.load(os.path.join(HERE, "rebuilds.toml"), "rebuild") if r.get("day_only")}
    assert day_only
    import glob
    import json

    (default,) = [p for p in glob.glob(os.path.join(HERE, "..", "results", "public-ooms-2.*", "rows.json"))]
    for row in json.load(open(default))["rows"]:
        if row["id"] in day_only:
            assert row["phantom_error"].startswith("not run under this torch: "), row["id"]


def test_each_days_libraries_folder_is_made_by_deps_sh():
    """Every folder a rebuild names for its day's torch is one deps.sh makes."""
    rebuilds = run.load(os.path.join(HERE, "rebuilds.toml"), "rebuild")
    deps = open(os.path.join(HERE, "deps.sh")).read()
    folders = {p for r in rebuilds for p in r.get("day_pythonpath", [])}
    assert folders
    for folder in folders:
        assert folder.startswith("build/public-ooms-deps/"), folder
        assert '"$DEPS/%s"' % folder.split("/")[2] in deps, folder  # its top folder (a source's src/ below)


def test_the_shipped_rows_under_the_days_torch_are_each_reports_own():
    """bench/results' newest day-torch rows: each report of the corpus, under the torch its date
    (or its page) gives, that torch the one the row ran, and the summary summary() computes."""
    import glob
    import json

    folders = sorted(glob.glob(os.path.join(HERE, "..", "results", "public-ooms-day-torch-*")))
    assert folders, "no day-torch results"
    data = json.load(open(os.path.join(folders[-1], "rows.json")))
    reports = {r["id"]: r for r in run.load(os.path.join(HERE, "reports.toml"), "report")}
    releases = run.load_releases()
    for row in data["rows"]:
        day, basis = run.torch_of_day(reports[row["id"]], releases)
        assert (row["torch_of_day"], row["torch_of_day_basis"]) == (day, basis), row["id"]
        assert row.get("torch") is None or row["torch"].split("+")[0] == day, row["id"]
    assert data["summary"] == run.summary(data["rows"])


def test_the_day_table_puts_each_report_beside_its_default_run():
    real = {"requested": "64.00 MiB", "allocated": "38.73 GiB", "reserved_unallocated": "138.61 MiB"}
    default = [dict(row("a", equal=False, error=-0.0052), real=real, phantom={"requested": "2.00 MiB",
                    "allocated": "38.53 GiB"}),
               dict(row("b", phantom=False), real=real, phantom_error="fits: no out-of-memory, peak allocated 7 GiB")]
    day = [dict(default[0], phantom={"requested": "64.00 MiB", "allocated": "38.45 GiB",
                                      "reserved_unallocated": "372.74 MiB"}, request_equal=True,
                allocated_error=-0.0072, link="L", torch="2.6.0+cu124", torch_of_day="2.6.0",
                torch_of_day_basis="the newest release on 2025-03-06"),
           dict(default[1], phantom=None, phantom_error="ModuleNotFoundError: No module named 'x'",
                peak_allocated_bytes=None, link="L", torch=None, torch_of_day="2.0.1",
                torch_of_day_basis="named by the report")]
    lines = run.day_table(default, day).splitlines()
    assert lines[2] == ("| [a](L) | 2.6.0+cu124 (the newest release on 2025-03-06) | 64.00 MiB / 2.00 MiB (differs) "
                        "/ 64.00 MiB (equal) | 38.73 GiB / 38.53 GiB (-0.52%) / 38.45 GiB (-0.72%) "
                        "| 138.61 MiB / 372.74 MiB |")
    assert lines[3] == ("| [b](L) | 2.0.1 (named by the report) | 64.00 MiB / fits: no out-of-memory, peak allocated "
                        "7 GiB / not run: ModuleNotFoundError: No module named 'x' | 38.73 GiB / - / - "
                        "| 138.61 MiB / - |")
    stopped = dict(day[1], peak_allocated_bytes=3 << 30, phantom_error="RuntimeError: dtypes differ")
    assert run.outcome(stopped) == "no OOM, stops at peak allocated 3.00 GiB: RuntimeError: dtypes differ"
