"""The dry run's shared compile cache (vramguard/dryrun/features/compile_cache.py)
on an Inductor without the caches it adjusts (torch 2.0 and 2.1: no FX graph
cache, no autotuning cache): nothing is patched, so every run compiles cold, as
it does there anyway. No torch needed: Inductor's modules stand in as bare
namespaces with only what each version has."""
import sys
import types

import pytest

from vramguard.dryrun.features import compile_cache


def inductor(monkeypatch, *, graph_cache, autotune_cache):
    torch = types.ModuleType("torch")
    package = types.ModuleType("torch._inductor")
    codecache, compile_fx, config = (types.ModuleType("torch._inductor." + n)
                                     for n in ("codecache", "compile_fx", "config"))
    original = object()
    if graph_cache:
        codecache.FxGraphCache = type("FxGraphCache", (), {"_save_graph": staticmethod(lambda *a, **k: "saved")})
        compile_fx.fx_codegen_and_compile = original
    else:
        compile_fx.compile_fx_inner = original  # what 2.0 has instead
    if autotune_cache:
        config.autotune_local_cache = True
    package.codecache, package.compile_fx, package.config = codecache, compile_fx, config
    torch._inductor = package
    for name, module in (("torch", torch), ("torch._inductor", package), ("torch._inductor.codecache", codecache),
                         ("torch._inductor.compile_fx", compile_fx), ("torch._inductor.config", config)):
        monkeypatch.setitem(sys.modules, name, module)
    return codecache, compile_fx, config, original


@pytest.mark.parametrize("autotune_cache", [False, True])
def test_an_inductor_without_the_graph_cache_is_left_as_it_is(monkeypatch, autotune_cache):
    codecache, compile_fx, config, original = inductor(monkeypatch, graph_cache=False, autotune_cache=autotune_cache)
    compile_cache._install({"compiled": 0, "saved": 0, "not_saved": 0, "unmarked": 0}, run=None)
    assert compile_fx.compile_fx_inner is original and not hasattr(compile_fx, "fx_codegen_and_compile")
    assert not hasattr(codecache, "FxGraphCache")
    assert getattr(config, "autotune_local_cache", None) is (False if autotune_cache else None)


def test_an_inductor_with_the_graph_cache_but_no_autotuning_cache_is_patched(monkeypatch):
    codecache, compile_fx, config, original = inductor(monkeypatch, graph_cache=True, autotune_cache=False)
    compile_cache._install({"compiled": 0, "saved": 0, "not_saved": 0, "unmarked": 0}, run=None)
    assert compile_fx.fx_codegen_and_compile is not original
    assert not hasattr(config, "autotune_local_cache")  # nothing set that this version does not read
    assert codecache.FxGraphCache._save_graph("key", object()) == "saved"
