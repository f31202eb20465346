"""The truth harness's scenarios (tests/torch/truth.py), each in a fresh
process on the phantom: an out-of-memory error in a training step's
forward, in backward, in the optimizer's step, under autocast, after a
leak, after find_max_batch, at a memory fraction of 1.0 beside the CUDA
context, in pieces under segments, recovered in an except block, a
recording begun with a model live, and the counters after
reset_accumulated_memory_stats. Every figure and advice line the report,
the summary and the recovery line print is held against the session's own
measurement or listed as unchecked with the reason; none may be false.
docs/development.md keeps the counts."""
import os

import pytest

from fakegpu import run

pytestmark = pytest.mark.torch

HERE = os.path.dirname(os.path.abspath(__file__))

PRELUDE = f"""
import sys
sys.path.insert(0, {HERE!r})
import truth
"""

# Each scenario fills `v` (truth.Verdicts).
SCENARIOS = {
    "fp32 step, forward": """
        vramguard.install(budget="256MiB")
        def step(batch):
            x = torch.empty(batch * MiB // 4, dtype=torch.float32, device="cuda")        # 1 MiB a sample
            h = torch.empty(batch * 2 * MiB // 4, dtype=torch.float32, device="cuda")
        v = truth.Verdicts()
        try:
            step(100)
        except torch.OutOfMemoryError:
            facts = truth.at_failure()
            v = truth.check_report(vramguard.last_oom(), facts, step)
    """,
    "backward": """
        vramguard.install(budget="400MiB")
        w = torch.randn(8192, 8192, device="cuda", requires_grad=True)
        x = torch.randn(64, 8192, device="cuda")
        def train():
            loss = (x @ w).sum()
            loss.backward()
        v = truth.Verdicts()
        try:
            train()
        except torch.OutOfMemoryError:
            v = truth.check_report(vramguard.last_oom(), truth.at_failure())
    """,
    "optimizer step": """
        vramguard.install(budget="700MiB")
        w = torch.randn(8192, 8192, device="cuda", requires_grad=True)
        (w * 2).sum().backward()
        opt = torch.optim.Adam([w])
        def update():
            opt.step()
        v = truth.Verdicts()
        try:
            update()
        except torch.OutOfMemoryError:
            v = truth.check_report(vramguard.last_oom(), truth.at_failure())
    """,
    "under autocast": """
        vramguard.install(budget="256MiB")
        def forward():
            with torch.autocast("cuda", dtype=torch.float16):
                h = torch.empty(25 * MiB, dtype=torch.float32, device="cuda")
                torch.empty(200 * MiB, dtype=torch.uint8, device="cuda")
        v = truth.Verdicts()
        try:
            forward()
        except torch.OutOfMemoryError:
            v = truth.check_report(vramguard.last_oom(), truth.at_failure())
    """,
    "a leak": """
        import warnings, re
        warnings.simplefilter("ignore")
        vramguard.install(budget="256MiB")
        losses = []
        for i in range(10):
            act = torch.empty(40 * MiB, dtype=torch.uint8, device="cuda")
            losses.append(torch.empty(8 * MiB, dtype=torch.uint8, device="cuda"))
            del act
            vramguard.step()
        a = torch.empty(100 * MiB, dtype=torch.uint8, device="cuda")
        v = truth.Verdicts()
        try:
            torch.empty(100 * MiB, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError:
            report = vramguard.last_oom()
            v = truth.check_report(report, truth.at_failure())
            line = next(l for l in str(report).splitlines() if "Fix the leak" in l)
            frees = re.search(r"\\(frees at least (.*)\\)", line).group(1)
            before = torch.cuda.memory_allocated()
            losses.clear()
            freed = before - torch.cuda.memory_allocated()
            v.add(line + " [applied]", truth.size_of(frees) <= freed, {"freed_by_dropping_the_leak": freed})
    """,
    "find_max_batch, then an OOM": """
        vramguard.install(budget="256MiB")
        def step(batch):
            workspace = torch.empty(16 * MiB, dtype=torch.uint8, device="cuda")
            activations = torch.empty(4 * MiB * batch, dtype=torch.uint8, device="cuda")
        r = vramguard.find_max_batch(step, progress=False)
        failed = sum(1 for t in r.tries if not t.fits)
        v = truth.Verdicts()
        try:
            step(64)
        except torch.OutOfMemoryError:
            v = truth.check_report(vramguard.last_oom(), truth.at_failure(), step)
        truth.check_summary(v, str(vramguard.summary()), search_ooms=failed)
    """,
    "memory fraction 1.0 beside the CUDA context": """
        vramguard.install()
        torch.cuda.set_per_process_memory_fraction(1.0)
        keep = torch.empty(GiB, dtype=torch.uint8, device="cuda")
        v = truth.Verdicts()
        truth.check_summary(v, str(vramguard.summary()))
        try:
            torch.empty(20 * GiB, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError:
            v2 = truth.check_report(vramguard.last_oom(), truth.at_failure())
            v.checked += v2.checked
            v.unchecked += v2.unchecked
    """,
    "pieces under segments": """
        vramguard.install(budget="256MiB", arena=False)
        small = [torch.empty(512 * 1024, dtype=torch.uint8, device="cuda") for _ in range(480)]
        del small[::2]
        v = truth.Verdicts()
        try:
            torch.empty(100 * MiB, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError:
            v = truth.check_report(vramguard.last_oom(), truth.at_failure())
    """,
    "recovered in an except block": """
        vramguard.install(budget="256MiB")
        def step():
            x = torch.empty(150 * MiB, dtype=torch.uint8, device="cuda")
            torch.empty(150 * MiB, dtype=torch.uint8, device="cuda")
        v = truth.Verdicts()
        try:
            step()
        except torch.OutOfMemoryError:
            before = truth.at_failure()
            text = str(vramguard.recover())
            truth.check_recovered(v, text, before, truth.at_failure())
    """,
    "a recording begun with a model live": """
        vramguard.install()
        weights = torch.empty(300 * MiB, dtype=torch.uint8, device="cuda")
        torch.cuda.reset_peak_memory_stats()
        with vramguard.record() as rec:
            x = torch.empty(100 * MiB, dtype=torch.uint8, device="cuda")
            del x
            y = torch.empty(50 * MiB, dtype=torch.uint8, device="cuda")
        peak = torch.cuda.memory_stats()["requested_bytes.all.peak"]
        result = vramguard.replay(rec.trace)
        v = truth.Verdicts()
        v.add("the replay's physical limit (peak live tensors)", result.peak_requested_bytes == peak,
              {"replay": result.peak_requested_bytes, "torch_requested_peak": peak})
    """,
    "reset_accumulated_memory_stats": """
        vramguard.install(budget="256MiB")
        keep = torch.empty(10 * MiB, dtype=torch.uint8, device="cuda")
        for _ in range(2):
            try:
                torch.empty(300 * MiB, dtype=torch.uint8, device="cuda")
            except torch.OutOfMemoryError:
                pass
        v = truth.Verdicts()
        truth.check_summary(v, str(vramguard.summary()))
        torch.cuda.reset_accumulated_memory_stats()
        try:
            torch.empty(300 * MiB, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError:
            pass
        truth.check_summary(v, str(vramguard.summary()))
    """,
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_no_printed_sentence_is_false(name):
    env = {"VG_FAKECUDA_CONTEXT": "400MiB"} if "context" in name else {}
    mem = "15828320256" if "context" in name else "1GiB"
    out = run(PRELUDE, SCENARIOS[name], "out['verdicts'] = v.as_dict()", devices=1, mem=mem, **env)
    verdicts = out["verdicts"]
    false = [c for c in verdicts["checked"] if not c[1]]
    assert verdicts["checked"], "the scenario checked nothing"
    assert not false, false
