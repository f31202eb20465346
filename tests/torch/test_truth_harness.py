"""The truth harness's scenarios (tests/torch/truth.py), each in a fresh
process on the phantom: an out-of-memory error in a training step's
forward, in backward, in the optimizer's step, under autocast, after a
leak, after find_max_batch, at a memory fraction of 1.0 beside the CUDA
context, in pieces under segments, recovered in an except block, a CNN
(torchvision's ResNet-18) and a transformers model (a small Llama) in
fp32 training, a recording begun with a model live, the counters after
reset_accumulated_memory_stats, and the shipped quickstart, each in an
IPython kernel. Every figure and advice line the report,
the summary and the recovery line print is held against the session's own
measurement or listed as unchecked with the reason; none may be false.
docs/development.md keeps the counts."""
import json
import os
import textwrap
from pathlib import Path

import pytest

from test_fakecuda_torch import preload
from test_recover_kernel import run_cells

pytestmark = pytest.mark.torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = Path(HERE).parents[1]

PRELUDE = f"""
import sys
sys.path.insert(0, {HERE!r})
import torch, vramguard
import truth
MiB, GiB = 1 << 20, 1 << 30
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
    "a CNN (torchvision's ResNet-18), fp32 training": """
        import torchvision
        vramguard.install(budget="512MiB")
        model = torchvision.models.resnet18(num_classes=10).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        def loss_of(batch):
            x = torch.randn(batch, 3, 224, 224, device="cuda")
            return torch.nn.functional.cross_entropy(model(x), torch.zeros(batch, dtype=torch.long, device="cuda"))
        v = truth.training_verdicts(loss_of, opt, 128)
    """,
    "a transformers model (a small Llama), fp32 training": """
        from transformers import LlamaConfig, LlamaForCausalLM
        vramguard.install(budget="512MiB")
        config = LlamaConfig(vocab_size=8192, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                             num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=1024)
        model = LlamaForCausalLM(config).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        def loss_of(batch):
            ids = torch.randint(0, 8192, (batch, 1024), device="cuda")
            return model(input_ids=ids, labels=ids).loss
        v = truth.training_verdicts(loss_of, opt, 16)
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


def _env(mem, context=None):
    env = dict(LD_PRELOAD=preload(), VG_FAKECUDA_DEVICES="1", VG_FAKECUDA_MEM=mem)
    if context:
        env["VG_FAKECUDA_CONTEXT"] = context
    return env


def _verdicts(cell):
    assert cell["errors"] == [], cell
    (line,) = [line for line in cell["out"].splitlines() if line.startswith("@@")]
    return json.loads(line[2:])


VERDICTS = 'print("@@" + json.dumps(v.as_dict()))'


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_no_printed_sentence_is_false(name, tmp_path):
    """Each scenario as a cell of an IPython kernel on the phantom."""
    context = "context" in name
    env = _env("15828320256" if context else "1GiB", "400MiB" if context else None)
    (cell,) = run_cells(tmp_path, PRELUDE + "import json\n" + textwrap.dedent(SCENARIOS[name]) + VERDICTS,
                        gpu_env=env)
    verdicts = _verdicts(cell)
    false = [c for c in verdicts["checked"] if not c[1]]
    assert verdicts["checked"], "the scenario checked nothing"
    assert not false, false


QUICKSTART_CHECK = PRELUDE + """
import json
v = truth.Verdicts()
truth.check_summary(v, str(vramguard.summary()), search_ooms=sum(1 for t in found.tries if not t.fits))
report = str(vramguard.last_oom())
for line in report.splitlines():
    if "saves about" in line or "enough alone" in line or "NOTEBOOK.ipynb" in line:
        v.add(line, False, "an estimate or a placeholder")
v.add("the report offers the measure call", "vramguard.last_oom().measure_remedies()" in report, None)
""" + VERDICTS


def test_the_quickstart_prints_no_false_sentence(tmp_path):
    """The shipped quickstart's code cells in a kernel on a phantom T4, then
    the harness's checks of what it left: the summary's figures, and its
    OOM report free of estimates and placeholders; every cell runs."""
    from vramguard.phantom.gpu import environ

    nb = json.loads((ROOT / "notebooks" / "quickstart.ipynb").read_text())
    cells = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    ran = run_cells(tmp_path, *cells, QUICKSTART_CHECK, gpu_env=environ("T4"))
    assert [c["errors"] for c in ran[:-1]] == [[] for _ in cells]
    assert not any("skipped: needs a GPU" in c["out"] for c in ran[:-1])      # its GPU cells ran
    verdicts = _verdicts(ran[-1])
    assert verdicts["checked"] and not [c for c in verdicts["checked"] if not c[1]], verdicts


INTERRUPTED = PRELUDE + """
import json, os, signal, time
vramguard.install(budget="256MiB")
keep = torch.empty(16 * MiB, dtype=torch.uint8, device="cuda")
def step():
    a = torch.empty(100 * MiB, dtype=torch.uint8, device="cuda")
    print("@@before=" + json.dumps(truth.at_failure()))
    INTERRUPT
step()
"""

INTERRUPTS = {
    "by exception": "raise KeyboardInterrupt",
    "by SIGINT": "os.kill(os.getpid(), signal.SIGINT); time.sleep(30)   # as the stop button sends it",
}

AFTER = PRELUDE + """
import json
print("@@after=" + json.dumps(truth.at_failure()))
"""


@pytest.mark.parametrize("how", list(INTERRUPTS))
def test_the_recovery_line_after_an_interrupt_is_true(how, tmp_path):
    """A step interrupted with its tensor held (Ctrl-C by exception, and by
    SIGINT): the handler's recovery line against torch's counters before
    the interrupt and after the handler."""
    interrupted, after = run_cells(tmp_path, INTERRUPTED.replace("INTERRUPT", INTERRUPTS[how]), AFTER,
                                   gpu_env=_env("1GiB"))
    assert interrupted["errors"] == ["KeyboardInterrupt"]
    marks = {line.split("=", 1)[0]: json.loads(line.split("=", 1)[1])
             for cell in (interrupted, after) for line in cell["out"].splitlines() if line.startswith("@@")}
    (line,) = [l for l in interrupted["out"].splitlines() if l.startswith("After the interrupt, ")]
    import truth

    v = truth.Verdicts()
    truth.check_recovered(v, line[len("After the interrupt, "):], marks["@@before"], marks["@@after"])
    assert v.checked and not v.false(), v.checked
