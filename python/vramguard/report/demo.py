"""`python -m vramguard demo`: a training loop's allocation pattern on a
simulated T4 (its usable memory), the report it leaves, and a replay of its
recorded trace: how small a GPU would do, under vramguard's policy and under
PyTorch's. The same loop with a larger batch and fewer steps is the example
trace that ships with the package (example_trace()); each trace's name says
its batch and steps, so the two are never taken for one another.

The loop is synthetic (no GPU recording ships with the package yet).

The pattern is that of a small transformer trained with Adam: weights first,
then per step activations that grow through the forward pass and shrink
through the backward pass, short-lived temporaries, gradients and the
optimizer's state (made on the first step and kept)."""
import io
import random

from .._core import Heap
from ..trace.importer import Allowance, read_trace_bytes
from .._presets import find_preset
from ..trace.record import record
from ..trace.replay import UNLIMITED
from .replay_report import format_replay_report, replay_report
from ..render.summary import format_summary
from ..render.words import a, count, plural
from ..trace.format import save_trace
from .._units import format_size, parse_size


def _model_shapes(layers, hidden):
    """Parameter tensors of a GPT-like model, in bytes (fp32)."""
    shapes = [50257 * hidden * 4, 1024 * hidden * 4]  # embeddings
    for _ in range(layers):
        shapes += [hidden * 4, hidden * 4]                      # layer norm
        shapes += [hidden * 3 * hidden * 4, 3 * hidden * 4]     # qkv
        shapes += [hidden * hidden * 4, hidden * 4]             # proj
        shapes += [hidden * 4, hidden * 4]                      # layer norm
        shapes += [hidden * 4 * hidden * 4, 4 * hidden * 4]     # mlp in
        shapes += [4 * hidden * hidden * 4, hidden * 4]         # mlp out
    return shapes


def _train_step(heap, params, grads, optimizer, batch, seq, hidden, heads, rng):
    acts = []
    token = batch * seq * hidden * 4
    for _ in range(len(params) // 12):
        # attention scores and the layer's saved activations
        acts.append(heap.malloc(batch * heads * seq * seq * 4))
        for scale in (1, 3, 1, 4, 4, 1):
            acts.append(heap.malloc(token * scale))
        tmp = [heap.malloc(rng.choice((512, 2048, token // 8))) for _ in range(4)]
        for p in tmp:
            heap.free(p)
    logits = heap.malloc(batch * seq * 50257 * 4)
    loss = heap.malloc(4)
    heap.free(logits)
    for p in reversed(acts):  # backward frees activations as it goes
        g = heap.malloc(token)
        heap.free(p)
        heap.free(g)
    heap.free(loss)
    if not grads:
        grads.extend(heap.malloc(size) for size in map(heap.block_size, params))
    if not optimizer:
        optimizer.extend(heap.malloc(heap.block_size(p)) for p in params for _ in range(2))


def _describe_device(capacity):
    preset = find_preset(capacity)
    nbytes = parse_size(capacity, "capacity")
    if preset:
        return nbytes, f"{format_size(nbytes)} device ({a(preset.name)}'s usable memory)"
    return nbytes, f"{format_size(nbytes)} device"


def run_demo(capacity="T4", steps=5, layers=12, hidden=768, batch=8, seq=512, seed=0, out=print):
    """Run the synthetic loop on a simulated device of `capacity` (a size or
    a GPU preset); returns the heap for a closer look."""
    nbytes, device = _describe_device(capacity)
    heap = Heap(nbytes)
    rec = _record_loop(heap, steps, layers, hidden, batch, seq, seed)
    stats = heap.stats()
    out(
        f"Synthetic training loop: GPT-like, {count(layers, 'layer')}, hidden {hidden}, batch {batch}, "
        f"sequence {seq}, {count(steps, 'step')}, on a simulated {device}."
    )
    out(format_summary(stats))
    peak = stats["reserved_bytes.all.peak"]
    out(f"Peak reserved {format_size(peak)} of {format_size(nbytes)} ({peak / nbytes:.0%}).")
    out("")
    out(f"Replaying the recorded trace: would it fit on that {format_size(nbytes)} GPU, and on how little?")
    out(format_replay_report(replay_report(rec.trace, capacity)))
    return heap


def trace_name(batch, steps):
    """The name of the loop's trace: the batch and the steps, which tell the
    demo's (batch 8, 5 steps by default) from the shipped example's."""
    return f"synthetic-gpt-train-batch{batch}-{steps}{plural(steps, 'step')}"


def _record_loop(heap, steps, layers, hidden, batch, seq, seed):
    rng = random.Random(seed)
    with record(heap, name=trace_name(batch, steps)) as rec:
        params = [heap.malloc(size) for size in _model_shapes(layers, hidden)]
        grads, optimizer = [], []
        for _ in range(steps):
            _train_step(heap, params, grads, optimizer, batch, seq, hidden, 12, rng)
    return rec


#: The loop of the trace that ships with the package (vramguard.example_trace()):
#: sized so that on a T4 its tensors fit, and vramguard's policy does while PyTorch's does not.
EXAMPLE = {"steps": 3, "layers": 12, "hidden": 768, "batch": 25, "seq": 512, "seed": 0}
EXAMPLE_FILE = "synthetic_gpt_train_batch25_3steps.vgtrace.gz"


def record_example(path):
    """Record the example loop on a simulated device and save its trace to
    `path` (deterministic: the same bytes every time)."""
    # Recorded under segments, as the shipped file was: the recording's
    # reserved curve and its metadata follow the heap's policy.
    rec = _record_loop(Heap(UNLIMITED, policy="segments"), **EXAMPLE)
    trace = rec.trace
    trace.meta["recipe"] = "vramguard.report.demo.EXAMPLE: " + ", ".join(f"{k}={v}" for k, v in EXAMPLE.items())
    save_trace(trace, path, compress=True)
    return trace


def example_trace():
    """The small trace that ships with vramguard,
    synthetic-gpt-train-batch25-3steps: a synthetic GPT-like training loop
    recorded on a simulated device (see EXAMPLE; 1,892 ops). On a T4 its
    tensors fit (13.92 GiB at the peak); vramguard's policy fits them there
    and PyTorch's does not. Not the demo's trace (`python -m vramguard
    demo`: batch 8, 5 steps, 5.71 GiB at the peak), which is smaller."""
    from importlib import resources

    data = resources.files("vramguard").joinpath("data").joinpath(EXAMPLE_FILE).read_bytes()
    return read_trace_bytes(io.BytesIO(data), EXAMPLE_FILE, None, Allowance.unlimited(EXAMPLE_FILE))
