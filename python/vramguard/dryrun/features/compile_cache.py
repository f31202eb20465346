"""torch.compile's generated code, shared by a dry run's runs without
changing what any run measures.

Every run of a dry run must allocate as a program's first run on a fresh
card does, whose compile starts from an empty cache. A run that found
another's compile in Inductor's caches would skip device work of that
compile: the small tensors the joint graph's constant folding makes, and
autotuning's copies of the kernels' arguments and its cache-flush buffer.
Most of a compile's time, though, is spent where no device memory is
touched: lowering the graphs and generating their code. So the runs share
Inductor's FX graph cache, in a folder of the dry run's own (the runner's,
removed at its end), on three conditions that keep every run's device
allocations those of a cold compile:

- AOTAutograd's own cache is off (TORCHINDUCTOR_AUTOGRAD_CACHE=0): a hit
  there skips the joint graph's passes, which then run in every run;
- autotuning's cache of chosen configs is off (autotune_local_cache): every
  run times its kernels, with the buffers that timing allocates;
- a graph whose code generation allocated device memory itself (the
  benchmarks of max-autotune's GEMM templates) is not saved, so later runs
  compile it cold again; every code generation's allocations are counted,
  under every allocator (memory_stats, plus the phantom's own cudaMalloc
  count for memory outside the caching allocator).

Measured on nanoGPT (124M, fp16 autocast, batch 4, two steps): a run that
loaded the first run's code made the same 8,437 allocator events in the
same order, of the same sizes, at the same offsets, with the same stacks,
and compiled in 10.6 s instead of 29.5 s (docs/would-it-fit.md).
"""
import ctypes
import sys
import threading

from ...render.words import count
from .after_import import patch_after_import
from .base import Feature

__all__ = ["FEATURE", "note"]

#: Set for every child: see the module's docstring.
ENV = {"TORCHINDUCTOR_AUTOGRAD_CACHE": "0"}

_INNER_MARK = "_vramguard_codegen_allocations"


def _allocations(run):
    """Allocations so far in this process: the caching allocator's requests
    on every device CUDA has started, and the phantom's cudaMalloc calls."""
    torch = run.torch
    total = run.counter("vg_fakecuda_malloc_calls", ctypes.c_long) or 0
    try:
        if torch.cuda.is_initialized():
            for device in range(torch.cuda.device_count()):
                total += int(torch.cuda.memory_stats(device).get("allocation.all.allocated", 0) or 0)
    except Exception:
        pass
    return total


def _install(state, run):
    from torch._inductor import codecache, compile_fx, config

    if hasattr(config, "autotune_local_cache"):  # a torch older than that cache has none to turn off
        config.autotune_local_cache = False
    if not (hasattr(codecache, "FxGraphCache") and hasattr(compile_fx, "fx_codegen_and_compile")):
        return  # a torch before the FX graph cache (2.0, 2.1): nothing is shared, every run compiles cold
    codegen = compile_fx.fx_codegen_and_compile
    save = codecache.FxGraphCache._save_graph
    lock = threading.Lock()

    def fx_codegen_and_compile(*args, **kwargs):
        before = _allocations(run)
        graph = codegen(*args, **kwargs)
        made = _allocations(run) - before
        with lock:
            state["compiled"] += 1
        if made > 0 and graph is not None:
            try:
                setattr(graph, _INNER_MARK, made)
            except Exception:  # a graph that takes no attribute is not saved either
                with lock:
                    state["unmarked"] += 1
        return graph

    def _save_graph(key, compiled_graph, *args, **kwargs):
        made = getattr(compiled_graph, _INNER_MARK, None)
        if made or state["unmarked"]:
            with lock:
                state["not_saved"] += 1
            return None
        with lock:
            state["saved"] += 1
        return save(key, compiled_graph, *args, **kwargs)

    compile_fx.fx_codegen_and_compile = fx_codegen_and_compile
    codecache.FxGraphCache._save_graph = staticmethod(_save_graph)


def _hits():
    try:
        from torch._dynamo.utils import counters

        return int(counters["inductor"]["fxgraph_cache_hit"])
    except Exception:
        return 0


def note(runs):
    """The report's words on the shared code, or None when no run loaded any."""
    hits = max([(r.get("compile_cache") or {}).get("hits", 0) for r in runs] or [0])
    not_saved = max([(r.get("compile_cache") or {}).get("not_saved", 0) for r in runs] or [0])
    if not hits and not not_saved:
        return None
    words = []
    if hits:
        words.append(f"runs loaded the code an earlier run had generated (up to {count(hits, 'graph')} a run) "
                     "and still did the device work of a first compile (constant folding, autotuning), "
                     "so each run's figures are those of a first run on the card")
    if not_saved:
        words.append(f"{count(not_saved, 'graph')} whose code generation took device memory "
                     f"{'was' if not_saved == 1 else 'were'} compiled anew in every run")
    return "Compiled code: " + "; ".join(words) + "."


class _CompileCache(Feature):
    name = "compile_cache"

    def env(self, options):
        return dict(ENV)

    def install(self, run):
        state = {"compiled": 0, "saved": 0, "not_saved": 0, "unmarked": 0}
        patch_after_import(["torch._inductor.compile_fx"], lambda name: _install(state, run))
        return state

    def figures(self, state, run):
        if state is None or "torch._inductor.compile_fx" not in sys.modules:
            return {"compile_cache": None}
        return {"compile_cache": {"hits": _hits(), "compiled": state["compiled"], "saved": state["saved"],
                                  "not_saved": state["not_saved"]}}

    def notes(self, result, runs):
        line = note(runs)
        return [line] if line else []


FEATURE = _CompileCache()
