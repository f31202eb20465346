"""last_oom(), regions and steps with the real PyTorch on the fake CUDA:
the report of an out-of-memory raised through torch ops (one tensor bigger
than the budget, a leak, free memory in pieces), and region peaks against
torch.cuda.max_memory_allocated()."""
import pytest

from fakegpu import GiB, MiB, run

pytestmark = pytest.mark.torch

REPORT = """
def report():
    r = vramguard.last_oom()
    return {"keys": [a.key for a in r.advice], "savings": [a.saving for a in r.advice],
            "requested": r.requested, "live": r.live, "short_by": r.short_by, "device": r.device,
            "regions": r.live_by_region, "text": str(r), "html": r._repr_html_()}
"""


def test_one_tensor_bigger_than_the_budget():
    out = run(REPORT, """
        vramguard.install(budget="64MiB")
        out["none_yet"] = vramguard.last_oom() is None
        keep = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
        try:
            with vramguard.track("forward"):
                torch.empty(100 * MiB, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError as e:
            out["raised"] = type(e).__name__
        out["report"] = report()
    """)
    assert out["none_yet"] is True and out["raised"] == "OutOfMemoryError"
    r = out["report"]
    assert (r["requested"], r["live"], r["device"]) == (100 * MiB, 4 * MiB, 0)
    assert r["short_by"] == 40 * MiB           # 100 MiB asked, 60 MiB of room under the budget
    assert r["keys"][0] == "too_big"
    assert r["regions"] == [["forward", 0, 4 * MiB]]
    assert "One tensor is larger than the budget" in r["text"] and "<ol>" in r["html"]


def test_the_oom_message_says_what_fits_not_the_address_space():
    """On a T4 (14.74 GiB), the arena's range is four times the device: the
    message names the largest block that could be allocated now, and that
    block is allocated right after, a granule more is not."""
    out = run("""
        vramguard.install()
        keep = torch.empty(GiB, dtype=torch.uint8, device="cuda")
        try:
            torch.empty(20 * GiB, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError as e:
            out["head"] = str(e).split("\\n")[0]
            out["range"] = vramguard._core.device_heap(0).stats()["fragmentation.largest_free_range"]
        out["summary"] = str(vramguard.summary())
        free, total = torch.cuda.mem_get_info()
        out["free"], out["total"] = free, total
        granule = 2 << 20
        fits = free // granule * granule  # what the message rounds to: whole granules
        out["fits"] = error(torch.empty, fits, dtype=torch.uint8, device="cuda")
        out["more"] = error(torch.empty, fits + granule, dtype=torch.uint8, device="cuda")
    """, devices=1, mem="15828320256")
    assert out["total"] == 15828320256 and out["free"] == out["total"] - GiB
    assert out["head"].endswith(
        "vramguard's arena: 1.00 GiB mapped in 1 range, 0 bytes unmapped so far; the largest block that "
        "could be allocated now is 13.74 GiB.")
    assert "58.9" not in out["head"] and "free range" not in out["head"]
    assert out["range"] > 50 * GiB  # the key is kept, as address space
    assert "| Largest block that could be allocated now: 13.74 GiB " in out["summary"]
    assert "address space" not in out["summary"] and "58.9" not in out["summary"]
    assert out["fits"] is None and out["more"][0] == "OutOfMemoryError"


def test_a_leak_across_steps_then_an_oom():
    out = run(REPORT, """
        import warnings
        vramguard.install(budget="256MiB")
        losses = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for i in range(10):
                activations = torch.empty(40 * MiB, dtype=torch.uint8, device="cuda")
                losses.append(torch.empty(8 * MiB, dtype=torch.uint8, device="cuda"))  # kept: the leak
                del activations
                vramguard.step()
        leak = vramguard.leak_check()
        out["leak"] = [leak.bytes_per_step, leak.since_step, leak.accumulated]
        out["warned"] = sum(issubclass(w.category, vramguard.LeakWarning) for w in caught)
        a = torch.empty(100 * MiB, dtype=torch.uint8, device="cuda")
        try:
            torch.empty(100 * MiB, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError:
            pass
        out["report"] = report()
    """)
    assert out["leak"] == [8 * MiB, 1, 72 * MiB] and out["warned"] == 1
    r = out["report"]
    assert r["keys"][0] == "leak" and r["savings"][0] == 72 * MiB
    assert "Fix the leak: +8.00 MiB per step" in r["text"]


def test_free_memory_in_pieces():
    """Under segments, freed blocks between live ones cannot merge: the
    report says what empty_cache would give back and suggests the arena."""
    out = run(REPORT, """
        vramguard.install(budget="256MiB", arena=False)
        small = [torch.empty(512 * 1024, dtype=torch.uint8, device="cuda") for _ in range(480)]
        del small[::2]
        try:
            torch.empty(100 * MiB, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError:
            pass
        out["report"] = report()
    """)
    r = out["report"]
    assert r["keys"][:2] == ["empty_cache", "arena"]
    assert r["savings"][0] == 120 * MiB - 512 * 1024
    assert "Cached free: 120.00 MiB in 240 blocks, largest free block 512.00 KiB" in r["text"]


def test_region_peaks_match_max_memory_allocated():
    out = run("""
        vramguard.install()
        base = torch.empty(10 * MiB, dtype=torch.uint8, device="cuda")
        torch.cuda.reset_peak_memory_stats()
        with vramguard.track("step"):
            x = torch.empty(30 * MiB, dtype=torch.uint8, device="cuda")
            with vramguard.track("inner"):
                y = torch.empty(5 * MiB, dtype=torch.uint8, device="cuda")
                del y
            del x
            z = torch.empty(2 * MiB, dtype=torch.uint8, device="cuda")
        out["max"] = torch.cuda.max_memory_allocated()
        t = vramguard.regions()
        out["rows"] = [[r.name, r.calls, r.peak, r.live_at_exit, r.allocated] for r in t]
    """)
    assert out["max"] == 45 * MiB
    assert out["rows"] == [["inner", 1, 45 * MiB, 40 * MiB, 5 * MiB],
                           ["step", 1, 45 * MiB, 12 * MiB, 37 * MiB]]


STEP = """
def step(batch):  # 16 MiB, 4 MiB a sample, and 8 MiB more past batch 57: not a line
    workspace = torch.empty(16 * MiB, dtype=torch.uint8, device="cuda")
    extra = torch.empty(8 * MiB if batch > 57 else 0, dtype=torch.uint8, device="cuda")
    activations = torch.empty(4 * MiB * batch, dtype=torch.uint8, device="cuda")
"""


def test_batch_advice_comes_only_from_the_step_that_failed():
    """find_max_batch measured `step`: an OOM inside it gets a batch figure,
    never one measured to fail; an unrelated tensor's OOM gets none."""
    out = run(REPORT, STEP, """
        vramguard.install(budget="256MiB")
        r = vramguard.find_max_batch(step, progress=False)
        out["largest"] = r.largest
        out["failed"] = sorted(t.batch for t in r.tries if not t.fits)
        fixed, per_sample = r.fit.fixed, r.fit.per_sample
        out["fit_says"] = int((256 * MiB - fixed) // per_sample)
        try:
            step(64)
        except torch.OutOfMemoryError:
            out["in_step"] = report()["text"]
        keep = torch.empty(100 * MiB, dtype=torch.uint8, device="cuda")
        try:
            torch.empty(200 * MiB, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError:
            out["unrelated"] = report()["text"]
        out["num_ooms"] = torch.cuda.memory_stats()["num_ooms"]
        out["summary"] = str(vramguard.summary())
        torch.cuda.reset_accumulated_memory_stats()
        out["after_reset"] = str(vramguard.summary())
    """, devices=1, mem="1GiB")
    assert out["largest"] == 58 and out["failed"] == [59, 60, 64]
    assert out["fit_says"] == 59                     # the line alone would advise a batch that failed
    assert "Lower the batch size to 58 at most" in out["in_step"]
    assert "batch 59 was measured to run out of memory" in out["in_step"]
    assert "Lower the batch size to" not in out["unrelated"]
    assert "Lower the batch size (no estimate)" in out["unrelated"]
    assert "Lower the batch size to 58 at most (measured to fit)" in out["in_step"]
    # the three tries that ran out count in num_ooms, and the summary says they were the search's
    assert out["num_ooms"] == 5
    assert "So far: 5 out-of-memory errors (of which 3 were find_max_batch's tries)" in out["summary"]
    assert "So far" not in out["after_reset"]


def test_precision_advice_only_for_wide_floats():
    out = run(REPORT, """
        vramguard.install(budget="256MiB")
        def forward(dtype):
            with vramguard.track("forward"):
                x = torch.empty(100 * MiB // torch.empty(0, dtype=dtype).element_size(), dtype=dtype, device="cuda")
                y = torch.empty(200 * MiB, dtype=torch.uint8, device="cuda")
        for dtype in (torch.float32, torch.uint8):
            try:
                forward(dtype)
            except torch.OutOfMemoryError:
                out[str(dtype)] = report()["text"]
        try:
            torch.empty(600 * MiB, dtype=torch.uint8, device="cuda")    # one uint8 tensor over the budget
        except torch.OutOfMemoryError:
            out["too_big"] = report()["text"]
    """, devices=1, mem="1GiB")
    wide, narrow, too_big = out["torch.float32"], out["torch.uint8"], out["too_big"]
    # no figure: what autocast frees depends on the model (the cast weights take memory too)
    assert "Mixed precision: torch.autocast (no estimate)" in wide
    assert "The failing frames hold float32 tensors" in wide and "saves about" not in wide
    assert "Mixed precision: torch.autocast (" not in narrow
    assert ("  Mixed precision (torch.autocast): the failing frames' tensors are not mostly 32-bit floats.\n"
            in narrow)
    assert "autocast" not in too_big and "16 bits" not in too_big
    assert "300.00 MiB" not in too_big and "enough alone" not in too_big
    assert "Lower the batch size" not in too_big and "Gradient accumulation" not in too_big


def test_what_accumulates_is_ranked_by_growth_not_size():
    """losses.append(loss) with stacks recorded: the line that makes the kept
    tensor comes first; the batch, larger but replaced each step, is not
    listed, also when the leak is looked at the very step it is first seen."""
    out = run("""
        import sys
        vramguard.install()
        losses = []
        with vramguard.record(stacks=True):
            for i in range(8):
                x = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")    # BATCH: replaced each step
                loss = torch.empty(MiB, dtype=torch.uint8, device="cuda"); at = sys._getframe().f_lineno
                losses.append(loss)
                vramguard.step()
            leak = vramguard.leak_check()
        out["loss_line"] = f"<string>:{at}"
        out["steps"] = [leak.since_step, leak.steps]
        out["lines"] = [list(row) for row in leak.lines]
        out["text"] = str(leak)
    """, devices=1, mem="1GiB")
    assert out["steps"] == [1, 8]
    (label, grown, blocks), = out["lines"]
    assert label == out["loss_line"]                # the kept loss's line, not the batch's
    assert (grown, blocks) == (7 * MiB, 7)          # since the first boundary kept, step 1
    title, accumulates = out["text"].split("What accumulates, by line")[1].split("Usual causes")[0].split("\n", 1)
    assert title == " (from step 1 to step 8):"     # the lines' growth since the first boundary kept
    assert accumulates.count("\n") == 1 and "+7.00 MiB in 7 blocks" in accumulates


PHASES = """
def tensors():
    global w, x
    w = torch.randn(8192, 8192, device="cuda", requires_grad=True)     # 256 MiB
    x = torch.randn(64, 8192, device="cuda")

def backward_step():
    loss = (x @ w).sum()
    loss.backward()          # the gradient of w, 256 MiB more: over the budget
"""


@pytest.mark.torch_version  # torch's own frames (autograd's, torch.optim's) name the phase
def test_advice_follows_the_phase_that_failed():
    """An OOM inside loss.backward() is named as such and gets no
    torch.no_grad() advice; one in the optimizer's first step (Adam's state)
    gets none of the advice that acts on activations, backward having freed
    them. The card's compute capability picks autocast's dtype."""
    out = run(REPORT, PHASES, """
        vramguard.install(budget="400MiB")
        tensors()
        try:
            backward_step()
        except torch.OutOfMemoryError:
            out["backward"] = report()
        vramguard.install(budget="700MiB")
        backward_step()                                   # 512 MiB: the weight and its gradient
        opt = torch.optim.Adam([w])
        def optimizer_step():
            opt.step()                                    # two 256 MiB states: over the budget
        try:
            optimizer_step()
        except torch.OutOfMemoryError:
            out["optimizer"] = report()
    """, devices=1, mem="2GiB", VG_FAKECUDA_CC="7.5")
    back, opt = out["backward"], out["optimizer"]
    assert back["requested"] == 256 * MiB
    text = back["text"]
    assert "Where: in the backward pass (loss.backward())" in text
    assert "no_grad" not in back["keys"]
    assert ("  torch.no_grad() for evaluation: the failure came in the backward pass, which needs the activations "
            "torch.no_grad() would not keep.") in text.split("Not advised here:\n")[1]
    # the frame holds the float32 loss: autocast in float16, the dtype a 7.5 card runs fast, with loss scaling
    assert "under torch.autocast('cuda', dtype=torch.float16) (" in text and "torch.amp.GradScaler" in text
    assert "dtype=torch.bfloat16" not in text and "has no bfloat16 tensor cores" in text
    assert "saves about" not in text and "enough alone" not in text
    text = opt["text"]
    assert "Where: in the optimizer's step (optimizer.step())" in text
    assert opt["keys"] == ["optimizer"] and opt["savings"] == [None]
    assert "bitsandbytes.optim.AdamW8bit" in text
    assert ("  A smaller batch, torch.autocast, gradient checkpointing or accumulation: the failure came in the "
            "optimizer's step, after backward had freed the activations they act on.") in text
    assert "Lower the batch size" not in text and "Gradient checkpointing" not in text


@pytest.mark.torch_version  # torch.autocast's attributes, and Dynamo on the wrapped __exit__
def test_autocast_is_not_advised_to_a_program_under_it():
    """The failing call ran under torch.autocast: mixed precision is listed as
    not advised, whatever the frames hold; a 9.0 card is advised bfloat16;
    a compiled function with autocast inside still runs with the watch on."""
    out = run(REPORT, """
        vramguard.install(budget="256MiB")
        def forward(autocast):
            with torch.autocast("cuda", dtype=torch.float16, enabled=autocast):
                h = torch.empty(25 * MiB, dtype=torch.float32, device="cuda")    # 100 MiB of float32
                torch.empty(200 * MiB, dtype=torch.uint8, device="cuda")
        for autocast in (True, False):
            try:
                forward(autocast)
            except torch.OutOfMemoryError:
                out[str(autocast)] = report()["text"]
        @torch.compile(backend="eager")
        def compiled(a):
            with torch.autocast("cuda", dtype=torch.float16):
                return a @ a
        out["compiled"] = str(compiled(torch.randn(8, 8, device="cuda")).dtype)
    """, devices=1, mem="1GiB", VG_FAKECUDA_CC="9.0")
    under, plain = out["True"], out["False"]
    assert ("  Mixed precision (torch.autocast): the failing call already ran under torch.autocast (float16).\n"
            in under)
    assert "Mixed precision: torch.autocast (" not in under
    assert "Mixed precision: torch.autocast (no estimate)" in plain
    assert "under torch.autocast('cuda', dtype=torch.bfloat16) (" in plain and "runs bfloat16" in plain
    assert out["compiled"] == "torch.float16"


def test_the_summary_largest_block_counts_what_the_device_has_free():
    """At a memory fraction of 1.0 the budget is the whole card, but the
    CUDA context holds part of it: the summary's largest block asks the
    device, and exactly that block is served after it, a granule more is not."""
    out = run("""
        import re
        vramguard.install()
        torch.cuda.set_per_process_memory_fraction(1.0)
        keep = torch.empty(GiB, dtype=torch.uint8, device="cuda")
        text = str(vramguard.summary())
        out["line"] = re.search(r"Largest block that could be allocated now: ([^|]*?) +\\|", text).group(1)
        out["within"] = "within the budget and what the device has free" in text
        out["torch"] = str(torch.cuda.memory_summary()).count("what the device has free")
        fits = vramguard._core.device_heap(0).largest_allocatable()
        out["fits"], out["free"] = fits, torch.cuda.mem_get_info()[0]
        out["served"] = error(torch.empty, fits, dtype=torch.uint8, device="cuda")
        out["more"] = error(torch.empty, fits + (2 << 20), dtype=torch.uint8, device="cuda")
    """, devices=1, mem="15828320256", VG_FAKECUDA_CONTEXT="400MiB")
    free = 15828320256 - GiB - 400 * MiB                     # the context's 400 MiB is not room
    assert out["free"] == free and out["fits"] == free // (2 * MiB) * (2 * MiB)   # whole granules
    assert out["line"] == "13.35 GiB" and out["within"] is True and out["torch"] == 1
    assert out["served"] is None and out["more"][0] == "OutOfMemoryError"


@pytest.mark.torch_version  # torch.no_grad's and inference_mode's classes, as the decorator uses them
def test_no_grad_is_not_advised_to_a_call_already_under_it():
    out = run(REPORT, """
        vramguard.install(budget="256MiB")
        def evaluate():
            x = torch.empty(25 * MiB, dtype=torch.float32, device="cuda")
            torch.empty(200 * MiB, dtype=torch.uint8, device="cuda")
        for name, wrap in (("no_grad", torch.no_grad()), ("inference", torch.inference_mode()),
                           ("plain", None)):
            try:
                if wrap is None:
                    evaluate()
                else:
                    with wrap:
                        evaluate()
            except torch.OutOfMemoryError:
                out[name] = report()
        try:
            torch.inference_mode()(evaluate)()                       # the decorator's form
        except torch.OutOfMemoryError:
            out["decorated"] = report()
        @torch.compile(backend="eager")                            # Dynamo with the wrapped __exit__
        def compiled(a):
            with torch.no_grad():
                b = a @ a
            return b, a * 2
        b, c = compiled(torch.randn(8, 8, device="cuda", requires_grad=True))
        out["compiled"] = [b.requires_grad, c.requires_grad]
    """, devices=1, mem="1GiB")
    assert out["compiled"] == [False, True]
    for name, region in (("no_grad", "torch.no_grad()"), ("inference", "torch.inference_mode()"),
                         ("decorated", "torch.inference_mode()")):
        assert "no_grad" not in out[name]["keys"]
        assert (f"  torch.no_grad() for evaluation: the failing call already ran under {region}.\n"
                in out[name]["text"]), name
    assert "no_grad" in out["plain"]["keys"] and "already ran under" not in out["plain"]["text"]
