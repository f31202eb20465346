"""bench/zoo.py's searches and goals, without PyTorch: the bisection each
figure rests on, and the verdicts --check gives on known tables."""
import json
import os
import random
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import zoo  # noqa: E402

MiB = 1 << 20


def counted(edge):
    calls = []

    def ok(x):
        calls.append(x)
        return x >= edge

    return ok, calls


@pytest.mark.parametrize("seed", range(200))
def test_first_true_finds_the_edge_from_any_guess(seed):
    rng = random.Random(seed)
    known_false = rng.randrange(0, 50)
    edge = known_false + 1 + rng.randrange(0, 5000)
    guess = rng.randrange(-10, 10000)
    ok, calls = counted(edge)
    assert zoo.first_true(ok, guess, known_false) == edge
    assert all(x > known_false for x in calls)  # never asks below what is known
    assert len(calls) <= 2 * (abs(guess - edge).bit_length() + 2) + 2


def test_a_right_guess_costs_two_runs():
    ok, calls = counted(100)
    assert zoo.first_true(ok, 100, 0) == 100
    assert calls == [100, 99]


def test_an_edge_at_the_known_bound_is_not_asked_below_it():
    ok, calls = counted(11)
    assert zoo.first_true(ok, 40, 10) == 11
    assert min(calls) == 11


def row(model, allocator, allocated, reserved, device, share=None, batches=None):
    return {"model": model, "allocator": allocator, "peak_allocated_bytes": allocated * MiB,
            "peak_reserved_bytes": reserved * MiB, "smallest_device_bytes": device * MiB,
            "allocator_share_bytes": (share if share is not None else device - 400) * MiB,
            "largest_batch": batches or {}}


def table(arena_reserved=380, arena_share=1000, arena_batch=12, segments_device=1500):
    return [row("m", "native", 1000, 400 + 1000, 1500, batches={"T4": 10}),
            row("m", "expandable", 1000, 1200, 1450, batches={"T4": 11}),
            row("m", "vramguard", 1000, arena_reserved + 1000, arena_share + 400, share=arena_share,
                batches={"T4": arena_batch}),
            row("m", "vramguard-segments", 1000, 1300, segments_device, batches={"T4": 11})]


def verdicts(rows):
    return {goal: (ok, failures) for goal, ok, failures in zoo.goals(rows)}


def test_goals_met():
    assert all(ok for ok, _ in verdicts(table(segments_device=1450)).values())


def test_each_goal_missed_names_the_model_and_figures():
    v = verdicts(table(arena_reserved=500, arena_share=1100, arena_batch=10, segments_device=1500))
    assert not v[zoo.GOALS[0]][0] and "m: 1,100 MiB for 1,000 MiB allocated" in v[zoo.GOALS[0]][1]
    assert not v[zoo.GOALS[1]][0] and any("vramguard-segments: 1,500 MiB against 1,450" in f
                                           for f in v[zoo.GOALS[1]][1])
    assert not v[zoo.GOALS[2]][0] and "m vramguard on T4: 10 against 11" in v[zoo.GOALS[2]][1]
    assert not v[zoo.GOALS[3]][0] and "m vramguard: 1,500 MiB against 1,400" in v[zoo.GOALS[3]][1]


def test_within_one_percent_or_a_granule():
    assert zoo._within(1000 * MiB + 16 * MiB, 1000 * MiB)  # the 16 MiB granule
    assert not zoo._within(1000 * MiB + 17 * MiB, 1000 * MiB)
    assert zoo._within(4000 * MiB + 40 * MiB, 4000 * MiB)  # 1%


def test_nothing_measured_is_not_a_pass():
    v = verdicts([])
    assert not any(ok for ok, _ in v.values())


def test_check_accepts_known_misses_only_while_they_happen(monkeypatch):
    rows = table(arena_reserved=500, segments_device=1450)  # goal 4 missed by "m vramguard"
    assert zoo.check(rows, "small", ["m"])[0] == [
        f"{zoo.GOALS[3]}: m vramguard: 1,500 MiB against 1,400"]
    monkeypatch.setattr(zoo, "KNOWN_MISSES", {(3, "small", "m vramguard"): "a known cause"})
    assert zoo.check(rows, "small", ["m"]) == ([], [])
    assert zoo.check(rows, "full", ["m"])[0]  # known at one size only
    unexpected, stale = zoo.check(table(segments_device=1450), "small", ["m"])  # met again: out of date
    assert unexpected == [] and stale == [f"{zoo.GOALS[3]}: m vramguard (a known cause)"]
    assert zoo.check(table(segments_device=1450), "small", ["other"]) == ([], [])  # not run: not stale


def _saved_table(folder, rows, **meta):
    meta = dict({"size": "full", "torch": "2.15.0", "limitless": "H200", "gpus": ["T4"], "date": "2026-11-26",
                 "runs": 40, "elapsed_s": 1, "command": "python bench/zoo.py --models m"}, **meta)
    zoo.save(str(folder), rows, meta, ["T4"])
    return meta


def test_merge_replaces_the_runs_made_again_and_keeps_the_rest(tmp_path):
    _saved_table(tmp_path, table() + [row("other", "native", 50, 60, 500)])
    new = [dict(r, peak_allocated_bytes=2000 * MiB) for r in table()] + [row("third", "native", 5, 6, 50)]
    meta = {"size": "full", "torch": "2.15.0", "limitless": "H200", "date": "2026-11-27", "runs": 7,
            "elapsed_s": 2, "command": "python bench/zoo.py --models m --merge-into X"}
    rows, merged = zoo.merge_into(str(tmp_path), new, meta)
    assert merged["elapsed_s"] == 3
    assert [(r["model"], r["allocator"]) for r in rows] == \
        [(r["model"], r["allocator"]) for r in table()] + [("other", "native"), ("third", "native")]
    assert all(r["peak_allocated_bytes"] == 2000 * MiB for r in rows if r["model"] == "m")
    assert merged["merged"] == ["python bench/zoo.py --models m --merge-into X (m, third, 2026-11-27)"]
    one, _ = zoo.merge_into(str(tmp_path), [dict(table()[3], peak_reserved_bytes=1 * MiB)], meta)
    assert [r["peak_reserved_bytes"] for r in one if r["model"] == "m"] == \
        [r["peak_reserved_bytes"] for r in table()[:3]] + [1 * MiB]  # one allocator's rows alone
    assert merged["runs"] == 47 and merged["date"] == "2026-11-26"  # the table's first date stays
    zoo.save(str(tmp_path), rows, merged, ["T4"])
    text = (tmp_path / "zoo.md").read_text()
    assert "Reproduce: `python bench/zoo.py --models m`; then `python bench/zoo.py --models m --merge-into X" in text
    _, again = zoo.merge_into(str(tmp_path), new, dict(meta, date="2026-11-28"))
    assert len(again["merged"]) == 2  # every part's command is kept


def test_a_run_merged_into_a_table_adds_its_runs_and_time(tmp_path, monkeypatch):
    """main(): the merged table counts this run's runs and seconds too."""
    class FakeZoo:
        def __init__(self, *args, **kwargs):
            self.runs = 0

        def time_steps(self, model, allocators, rows):
            self.runs += 4
            for r in rows:
                r["step_time_ratio"] = 1.0

    monkeypatch.setattr(zoo, "Zoo", FakeZoo)
    monkeypatch.setattr(zoo, "_since", lambda started: 30.0)
    monkeypatch.setitem(sys.modules, "torch", type(sys)("torch"))
    sys.modules["torch"].__version__ = "2.15.0"
    table_dir = tmp_path / "table"
    table_dir.mkdir()
    _saved_table(table_dir, table(), timing_only=True)
    assert zoo.main(["--timing-only", "--size", "full", "--models", "mlp", "--timing-rounds", "1",
                     "--out", str(tmp_path / "part"), "--merge-into", str(table_dir), "--quiet"]) == 0
    meta = json.loads((table_dir / "zoo.json").read_text())["meta"]
    assert (meta["runs"], meta["elapsed_s"]) == (44, 31.0)
    assert "mlp" in meta["merged"][0]


@pytest.mark.parametrize("field,value", [("size", "small"), ("torch", "2.10.0"), ("limitless", "A100-80GB")])
def test_merge_refuses_a_table_of_another_kind(tmp_path, field, value):
    _saved_table(tmp_path, table())
    meta = {"size": "full", "torch": "2.15.0", "limitless": "H200", "date": "d", "runs": 1, "command": "c"}
    with pytest.raises(SystemExit, match=f"its {field} is"):
        zoo.merge_into(str(tmp_path), table(), dict(meta, **{field: value}))


@pytest.mark.parametrize("content", [None, "", "{not json", "[]", '{"rows": []}',
                                     '{"meta": 5, "rows": []}', '{"meta": {}, "rows": [1]}'])
def test_merge_into_a_missing_or_broken_table_says_so(tmp_path, content):
    if content is not None:
        (tmp_path / "zoo.json").write_text(content)
    meta = {"size": "full", "torch": "2.15.0", "limitless": "H200", "date": "d", "runs": 1, "command": "c"}
    with pytest.raises(SystemExit, match="cannot merge into"):
        zoo.merge_into(str(tmp_path), table(), meta)


def test_rebuild_takes_only_finished_searches(tmp_path):
    """An interrupted benchmark's runs give back what its searches settled,
    nothing they had not: the smallest device where 16 MiB less failed, the
    largest batch where one more failed."""
    from vramguard import PRESETS

    h200, t4, l4 = PRESETS["H200"], PRESETS["T4"], PRESETS["L4"]
    (tmp_path / "runs").mkdir()
    n = 0

    def run(allocator, preset, fits, memory=None, batch=8):
        nonlocal n
        n += 1
        r = {"model": "m", "allocator": allocator, "device": preset.cuda_name,
             "total_memory": memory or preset.total_bytes, "batch": batch, "fits": fits,
             "peak_allocated_bytes": 1000 * MiB, "peak_reserved_bytes": 1100 * MiB, "context_bytes": 400 * MiB,
             "device_peak_bytes": 1600 * MiB, "device_calls_per_step": [9, 3, 0, 0], "step_seconds": [1, 1, 1, 1],
             "host_peak_rss_bytes": 1}
        (tmp_path / "runs" / f"{n:04d}-m-{allocator}.json").write_text(__import__("json").dumps(r))

    for allocator in ("native", "vramguard"):
        run(allocator, h200, True)
    for memory, fits in ((1600, True), (1520, False), (1536, True)):  # settled: 1,536 MiB
        run("native", h200, fits, memory=memory * MiB)
    run("vramguard", h200, True, memory=1536 * MiB)  # cut short: 1,520 never tried
    for batch, fits in ((40, True), (41, False)):
        run("native", t4, fits, batch=batch)
    run("vramguard", t4, True, batch=50)  # cut short
    run("native", l4, True, batch=60)
    rows = {r["allocator"]: r for r in zoo.rebuild(str(tmp_path), "H200", ["T4", "L4"], lambda m: 8)}
    assert rows["native"]["smallest_device_bytes"] == 1536 * MiB
    assert rows["native"]["allocator_share_bytes"] == (1536 - 500) * MiB
    assert rows["native"]["largest_batch"] == {"T4": 40}
    assert "smallest_device_bytes" not in rows["vramguard"] and rows["vramguard"]["largest_batch"] == {}
    assert rows["native"]["warm_device_calls_per_step"] == 0


# ---------------------------------------------------------------- on a GPU (bench/zoo_card.py)

import zoo_card  # noqa: E402


@pytest.mark.parametrize("seed", range(100))
def test_card_search_finds_the_largest_batch_that_fits(seed):
    rng = random.Random(seed)
    edge, guess = rng.randint(0, 600), rng.randint(1, 700)
    asked = []

    def fits(batch):
        asked.append(batch)
        return batch <= edge

    assert zoo_card.largest_fitting(fits, guess) == edge
    assert 0 not in asked                      # batch 0 fits by definition: never run
    assert len(asked) <= 2 * (abs(guess - edge) + 1).bit_length() + 2


def test_card_search_costs_two_runs_when_the_phantom_was_right():
    asked = []
    assert zoo_card.largest_fitting(lambda b: asked.append(b) or b <= 334, 334) == 334
    assert sorted(asked) == [334, 335]


def test_card_table_says_what_did_not_run():
    card = {"meta": {"gpu": "NVIDIA H200", "driver": "580", "torch": "2.11.0", "date": "2026-11-26",
                     "models": ["gpt2"], "allocators": ["native", "vramguard"]},
            "memory": [{"model": "gpt2", "allocator": "native", "fits": True,
                        "peak_allocated_bytes": 100 << 20, "peak_reserved_bytes": 120 << 20},
                       {"model": "gpt2", "allocator": "vramguard", "error": "not run: the time limit"}],
            "batch": [{"model": "gpt2", "allocator": "native", "largest_batch": 8, "guess": 4}],
            "timing": [{"model": "gpt2", "allocator": "vramguard", "ratio_to_default": 0.968, "rounds": 2}]}
    text = zoo_card.markdown(card)
    assert "| gpt2 | native | 100 | 120 | 8 (4) | - |" in text
    assert "| gpt2 | vramguard | not run: the time limit |  | - | 0.968 (2 rounds) |" in text


def test_merge_refuses_to_mix_searches_and_replays(tmp_path):
    _saved_table(tmp_path, table())
    meta = {"size": "full", "torch": "2.15.0", "limitless": "H200", "date": "d", "runs": 1, "command": "c",
            "replays_only": True}
    with pytest.raises(SystemExit, match="replays only"):
        zoo.merge_into(str(tmp_path), table(), meta)


def test_a_replays_only_table_has_no_batch_columns_and_measures_no_search_goal(tmp_path):
    rows = [dict({k: v for k, v in r.items() if k not in ("smallest_device_bytes", "allocator_share_bytes")},
                 largest_batch={}) for r in table()]
    for r in rows:
        r["replay_smallest_device_bytes"] = 1400 * MiB
    text = zoo.report(rows, {"size": "full", "torch": "2.15.0", "limitless": "H200", "date": "d", "runs": 5,
                             "elapsed_s": 9, "command": "c --replays-only"}, [])
    assert "no searches" in text and "largest batch" not in text.split("## Goals")[0]
    lines = text.splitlines()
    for goal in zoo.GOALS[:3]:
        assert f"- not measured: {goal}: nothing measured" in lines
    assert f"- met: {zoo.GOALS[3]}" in lines


def test_the_misses_of_a_table_are_listed_once_per_cause(monkeypatch):
    monkeypatch.setattr(zoo, "KNOWN_MISSES", {(1, "full", "m vramguard-segments"): "one cause",
                                              (2, "full", "m vramguard-segments on T4"): "one cause",
                                              (0, "full", "m"): "another",
                                              (3, "full", "m vramguard"): "met here: not listed",
                                              (0, "small", "m"): "another size: not listed"})
    rows = table(arena_share=1100, segments_device=1500)
    rows[3]["largest_batch"] = {"T4": 10}
    meta = {"size": "full", "torch": "t", "limitless": "H200", "date": "d", "runs": 1, "elapsed_s": 1,
            "command": "c"}
    known = zoo.report(rows, meta, ["T4"]).split("Known misses, with their causes:")[1].strip().splitlines()
    assert known == [f"- {zoo.GOALS[1]}: m vramguard-segments; {zoo.GOALS[2]}: m vramguard-segments on T4. "
                     "Why: one cause", f"- {zoo.GOALS[0]}: m. Why: another"]
    timed_only = [dict(r, smallest_device_bytes=None) for r in table()]  # a table that measured no search
    for r in timed_only:
        del r["smallest_device_bytes"], r["allocator_share_bytes"]
        r["largest_batch"] = {}
    assert "Known misses" not in zoo.report(timed_only, meta, ["T4"])


def test_the_full_table_in_the_results_misses_only_known_goals():
    path = os.path.join(os.path.dirname(zoo.HERE), "bench", "results", "zoo-full-2.15.0-2026-11-26", "zoo.json")
    with open(path) as f:
        rows = json.load(f)["rows"]
    models = sorted({r["model"] for r in rows})
    assert zoo.check(rows, "full", models) == ([], [])
