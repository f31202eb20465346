"""A Hugging Face Trainer as tutorials write it (fp16, gradient accumulation,
evaluation with metrics every step, auto_find_batch_size, report_to="none")
dry-runs to its end: accelerate's pad_across_processes, which reads sizes
back from the device, is left unpadded and counted, and the batch size the
search settles on is reported."""
import pytest

from test_dryrun import dryrun, report, write

pytestmark = pytest.mark.torch

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
    # 80 MiB for tensors: batch 16's logits (16 x 32 x 8192, fp32 for the loss) do not fit, 14's do
    result, _ = dryrun(tmp_path, "--allocator", "native", "--no-snapshot", "--memory", "480MiB",
                       "train.py", "16")
    run = result["native"]
    assert run["exit_status"] == 0 and run["error"] is None
    assert "trained to the end" in (tmp_path / "out" / "native.log").read_text()
    # two evaluations of two batches, each padding its labels and its logits
    assert run["accelerate_unpadded"] == 8
    assert (run["auto_batch_sizes"], run["auto_batch_size"]) == ([16, 14], 14)
    assert run["fits"] is False and run["first_oom"]["caught"]  # batch 16's, caught by the search
    lines = report(result).splitlines()
    assert ("accelerate's pad_across_processes reads tensor sizes back from the device (zeros here): the dry run "
            "left its 8 calls unpadded (one process has nothing to pad).") in lines
    assert ("native: auto_find_batch_size settled on batch size 14 (tried 16, 14; the out-of-memory error at 16 "
            "was caught by it).") in lines
