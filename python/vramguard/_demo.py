"""`python -m vramguard demo`: a training loop's allocation pattern on a
simulated 15 GiB device (a Colab T4), the report it leaves, and a replay of
its recorded trace: how small a GPU would do, under vramguard's policy and
under PyTorch's.

The loop is synthetic (no GPU recording ships with the package yet).

The pattern is that of a small transformer trained with Adam: weights first,
then per step activations that grow through the forward pass and shrink
through the backward pass, short-lived temporaries, gradients and the
optimizer's state (made on the first step and kept)."""
import random

from ._core import Heap
from ._record import record
from ._report import format_replay_report, replay_report
from ._summary import format_summary
from ._units import format_size

T4 = 15 * (1 << 30)


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


def run_demo(capacity=T4, steps=5, layers=12, hidden=768, batch=8, seq=512, seed=0, out=print):
    """Run the synthetic loop; returns the heap for a closer look."""
    rng = random.Random(seed)
    heap = Heap(capacity)
    with record(heap, name="synthetic-gpt-train") as rec:
        params = [heap.malloc(size) for size in _model_shapes(layers, hidden)]
        grads, optimizer = [], []
        for _ in range(steps):
            _train_step(heap, params, grads, optimizer, batch, seq, hidden, 12, rng)
    stats = heap.stats()
    out(
        f"Synthetic training loop: GPT-like, {layers} layers, hidden {hidden}, batch {batch}, "
        f"sequence {seq}, {steps} steps, on a simulated {format_size(capacity)} device."
    )
    out(format_summary(stats))
    peak = stats["reserved_bytes.all.peak"]
    out(f"Peak reserved {format_size(peak)} of {format_size(capacity)} ({peak / capacity:.0%}).")
    out("")
    out(f"Replaying the recorded trace: would it fit on a {format_size(capacity)} GPU, and on how little?")
    out(format_replay_report(replay_report(rec.trace, capacity)))
    return heap
