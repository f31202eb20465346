"""Unified memory in a dry run: a script that takes cudaMallocManaged memory
(as bitsandbytes' paged optimizers do) runs on the phantom, writes and reads
it, and the report says how much there was, apart from PyTorch's peaks, and
what a card does when it and PyTorch's memory exceed the device."""
import subprocess
import sys
from pathlib import Path

import pytest

from test_dryrun import MiB, _env, dryrun, report, write

# torch_version: runs in the CUDA 12 tier too (docs/development.md)
pytestmark = [pytest.mark.torch, pytest.mark.torch_version]

SCRIPT = """
    import ctypes, sys, torch
    x = torch.empty(40 << 20, dtype=torch.uint8, device="cuda")
    mib = int(sys.argv[1])
    if mib:
        ptr = ctypes.c_void_p()
        assert ctypes.CDLL(None).cudaMallocManaged(ctypes.byref(ptr), ctypes.c_size_t(mib << 20), 2) == 0
        ctypes.memset(ptr, 1, mib << 20)   # host memory, on a phantom too
        assert ctypes.string_at(ptr.value + (mib << 20) - 1, 1) == b"\\x01"
"""
NOTE = ("Unified memory (cudaMallocManaged): {}, outside PyTorch's allocator (in no peak above); a card keeps it "
        "on the device while there is room and pages it out under pressure.")
PAGING = ("With native, peak reserved plus the 16.00 MiB of unified memory exceeds the 48.00 MiB a T4 of "
          "448.00 MiB leaves after its CUDA context: expect slower steps as the driver pages the unified memory "
          "out to host memory and back, not an out-of-memory error.")


@pytest.mark.parametrize("mib", [0, 3, 16])
def test_unified_memory_is_reported_apart_from_the_peaks(tmp_path, mib):
    write(tmp_path, "managed.py", SCRIPT)
    # 448 MiB less the 400 MiB context: 48 MiB, which 40 + 3 fits and 40 + 16 does not
    result, _ = dryrun(tmp_path, "--allocator", "native", "--no-snapshot", "--memory", "448MiB",
                       "managed.py", str(mib), expect=0)
    run = result["native"]
    assert run["fits"] is True and run["peak_reserved_bytes"] == 40 * MiB
    assert run["managed_bytes"] == result["managed_bytes"] == mib * MiB
    assert run["managed_prefetched_bytes"] == result["managed_prefetched_bytes"] == 0
    lines = report(result).splitlines()
    notes = [line for line in lines if "unified memory" in line.lower() or "cudaMallocManaged" in line]
    if mib == 0:
        assert notes == []
    elif mib == 3:
        assert notes == [NOTE.format("3.00 MiB")]
    else:
        assert notes == [PAGING, NOTE.format("16.00 MiB")]
        assert lines.index(PAGING) == lines.index("Fits on a T4 of 448.00 MiB with native.") + 1


def test_paged_optimizer_state_is_the_unified_memory(tmp_path):
    """bitsandbytes pages state1/state2 of parameters with at least 1e5
    elements: one byte each for the 8-bit optimizer, 2 x 1024 x 512 bytes
    for the weight here; the bias (512) and the absmax tensors stay in
    PyTorch's allocator, the same under every allocator."""
    write(tmp_path, "paged.py", """
        import torch, bitsandbytes as bnb
        model = torch.nn.Linear(1024, 512).cuda()
        opt = bnb.optim.PagedAdamW8bit(model.parameters(), lr=1e-3)
        for _ in range(2):
            model(torch.randn(4, 1024, device="cuda")).sum().backward()
            opt.step()
            opt.zero_grad()
    """)
    result, _ = dryrun(tmp_path, "--no-snapshot", "--jobs", "1", "paged.py", expect=0)
    runs = [result[name] for name in ("native", "expandable", "vramguard")]
    assert {r["managed_bytes"] for r in runs} == {2 * 1024 * 512} == {result["managed_bytes"]}
    assert {r["managed_prefetched_bytes"] for r in runs} == {2 * 1024 * 512}  # prefetched each step
    assert len({r["peak_allocated_bytes"] for r in runs}) == 1
    assert ("Paged optimizer state: 1.00 MiB of unified memory, outside PyTorch's allocator (in no peak "
            "above); a card keeps it on the device while there is room and pages it out under pressure."
            ) in report(result).splitlines()


QLORA = """
    import os, sys, torch, bitsandbytes as bnb
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM

    folder = sys.argv[1]
    if not os.path.exists(folder):   # a checkpoint of random weights, once, on the CPU
        config = LlamaConfig(vocab_size=256, hidden_size=512, intermediate_size=1024, num_hidden_layers=1,
                             num_attention_heads=8, max_position_embeddings=64)
        LlamaForCausalLM(config).half().save_pretrained(folder)
        sys.exit(0)
    model = LlamaForCausalLM.from_pretrained(folder, device_map={"": 0}, quantization_config=BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float16))
    model = prepare_model_for_kbit_training(model)
    # r=256 on a 512-wide model: each LoRA matrix has 131,072 elements, over bitsandbytes' paging threshold
    model = get_peft_model(model, LoraConfig(r=256, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    opt = bnb.optim.PagedAdamW8bit([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    for _ in range(2):
        model(input_ids=torch.zeros(2, 32, dtype=torch.long, device="cuda"),
              labels=torch.zeros(2, 32, dtype=torch.long, device="cuda")).loss.backward()
        opt.step()
        opt.zero_grad()
    # 8-bit state1 and state2, one byte each per element, of every parameter of 1e5 elements or more
    print("PAGED", sum(2 * p.numel() for p in model.parameters() if p.requires_grad and p.numel() >= 1e5))
"""


def test_qlora_with_a_paged_optimizer_under_every_allocator(tmp_path):
    """A small Llama in 4-bit NF4 with LoRA, PagedAdamW8bit, two steps."""
    write(tmp_path, "qlora.py", QLORA)
    subprocess.run([sys.executable, "qlora.py", str(tmp_path / "model")], cwd=tmp_path, env=_env(), check=True,
                   capture_output=True, timeout=300)
    result, _ = dryrun(tmp_path, "--no-snapshot", "--jobs", "1", "qlora.py", str(tmp_path / "model"), expect=0)
    runs = [result[name] for name in ("native", "expandable", "vramguard")]
    paged = {int(line.split()[1]) for run in runs
             for line in Path(run["log"]).read_text().splitlines() if line.startswith("PAGED ")}
    assert paged == {4 * 131072 * 2}  # q_proj and v_proj, lora_A and lora_B each
    assert {r["managed_bytes"] for r in runs} == paged
    assert len({r["peak_allocated_bytes"] for r in runs}) == 1
    assert "Paged optimizer state: 1.00 MiB of unified memory" in report(result)
