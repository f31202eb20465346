"""A Hugging Face Trainer as tutorials write it (fp16, gradient accumulation,
evaluation with metrics every step, auto_find_batch_size, report_to="none")
dry-runs to its end: accelerate's pad_across_processes, which reads sizes
back from the device, is left unpadded and counted, and the batch size the
search settles on is reported."""
from pathlib import Path

import pytest

from test_dryrun import dryrun, report, write

# torch_version: runs in the CUDA 12 tier too (docs/development.md)
pytestmark = [pytest.mark.torch, pytest.mark.torch_version]

SCRIPT = """
    import sys, torch
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    config = LlamaConfig(vocab_size=8192, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
    rows = [{"input_ids": torch.arange(32), "labels": torch.arange(32)} for _ in range(32)]
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=int(sys.argv[1]),
                             per_device_eval_batch_size=4, gradient_accumulation_steps=2, max_steps=2,
                             eval_strategy="steps", eval_steps=1, report_to="none", fp16=True,
                             auto_find_batch_size=True, save_strategy="no")
    Trainer(model=LlamaForCausalLM(config), args=args, train_dataset=rows, eval_dataset=rows[:8],
            compute_metrics=lambda p: {"rows": len(p.label_ids)}).train()
    print("trained to the end")
"""


def test_trainer_with_evaluation_runs_to_its_end(tmp_path):
    write(tmp_path, "train.py", SCRIPT)
    # 80 MiB for tensors: batch 16 does not fit (its logits, 16 x 32 x 8192, in fp32 for the loss)
    result, _ = dryrun(tmp_path, "--allocator", "native", "--no-snapshot", "--memory", "480MiB",
                       "train.py", "16")
    run = result["native"]
    assert run["exit_status"] == 0 and run["error"] is None
    assert "trained to the end" in Path(run["log"]).read_text()
    # Each evaluation pads the labels and the logits of its two batches: 4 calls. Which step runs
    # out, and the size the search settles on, differ by PyTorch version (measured: 2.15 settled
    # on 14, 2.8 on 8), so the test takes them from the run.
    unpadded, tried, settled = run["accelerate_unpadded"], run["auto_batch_sizes"], run["auto_batch_size"]
    assert unpadded >= 8 and unpadded % 4 == 0
    assert tried[0] == 16 and tried == sorted(tried, reverse=True) and len(set(tried)) == len(tried) >= 2
    assert settled == tried[-1]
    assert run["fits"] is False and run["first_oom"]["caught"]  # batch 16's, caught by the search
    lines = report(result).splitlines()
    assert ("accelerate's pad_across_processes reads tensor sizes back from the device (zeros here): the dry run "
            f"left its {unpadded} calls unpadded (one process has nothing to pad).") in lines
    larger = ", ".join(map(str, tried[:-1]))
    errors = "error at 16 was" if len(tried) == 2 else f"errors at {larger} were"
    assert (f"native: auto_find_batch_size settled on batch size {settled} (tried {', '.join(map(str, tried))}; "
            f"the out-of-memory {errors} caught by it).") in lines
