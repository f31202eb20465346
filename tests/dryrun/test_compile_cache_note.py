"""The report's line on the compiled code the runs shared
(features/compile_cache.py), at counts 0, 1 and many."""
from vramguard.dryrun.features import compile_cache
from vramguard.dryrun.features.compile_cache import note


def _runs(*caches):
    return [{"allocator": "native", "compile_cache": c} for c in caches]


def test_no_line_when_nothing_was_shared_or_refused():
    assert note(_runs(None, {"hits": 0, "compiled": 3, "saved": 3, "not_saved": 0})) is None
    assert note([]) is None


def test_one_graph_loaded():
    line = note(_runs({"hits": 0, "compiled": 1, "saved": 1, "not_saved": 0},
                      {"hits": 1, "compiled": 0, "saved": 0, "not_saved": 0}))
    assert line == ("Compiled code: runs loaded the code an earlier run had generated (up to 1 graph a run) "
                    "and still did the device work of a first compile (constant folding, autotuning), so "
                    "each run's figures are those of a first run on the card.")


def test_many_graphs_and_refused_ones():
    line = note(_runs({"hits": 0, "compiled": 5, "saved": 3, "not_saved": 2},
                      {"hits": 3, "compiled": 2, "saved": 0, "not_saved": 2}))
    assert "(up to 3 graphs a run)" in line
    assert line.endswith("; 2 graphs whose code generation took device memory were compiled anew in every run.")


def test_one_refused_graph_alone():
    line = note(_runs({"hits": 0, "compiled": 1, "saved": 0, "not_saved": 1}))
    assert line == "Compiled code: 1 graph whose code generation took device memory was compiled anew in every run."


def test_every_child_gets_aotautograd_cache_off():
    assert compile_cache.FEATURE.env(None) == {"TORCHINDUCTOR_AUTOGRAD_CACHE": "0"}
