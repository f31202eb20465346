"""QLoRA fine-tuning as the Colab tutorials write it: a Llama-2-7B in 4-bit
NF4 (bitsandbytes), LoRA adapters on every linear layer (peft), gradient
checkpointing, Hugging Face's Trainer with fp16 and the paged 8-bit AdamW.

Would it fit on Colab's T4, at this sequence length and batch? Without a GPU
and without downloading 13 GB of weights:

    python -m vramguard dryrun --gpu T4 --no-weights examples/train_qlora.py
    python -m vramguard dryrun --gpu T4 --no-weights examples/train_qlora.py --model NousResearch/Llama-2-7b-hf
    python -m vramguard dryrun --gpu T4 --no-weights --sweep SEQ=512,1024,2048,4096 examples/train_qlora.py --seq {SEQ}

With no --model, the model is Llama-2-7B's shape from its published config,
written as a checkpoint of shapes only (a sparse safetensors file in a
temporary folder: no data, nothing downloaded); with --model, a Hub id or a
local folder (under `dryrun --no-weights`, only its config and safetensors
headers are read). On a real GPU the script trains for real (--steps).
Needs transformers, peft, bitsandbytes and accelerate.
"""
import argparse
import os
import tempfile

import torch
from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
from transformers import (AutoModelForCausalLM, BitsAndBytesConfig, LlamaConfig, Trainer, TrainingArguments)

#: Llama-2-7B's published config (meta-llama/Llama-2-7b-hf), its weights in fp16.
LLAMA2_7B = dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096,
                 rms_norm_eps=1e-5, torch_dtype="float16")


class RandomTokens(torch.utils.data.Dataset):
    """Token ids of one length: the memory of a step depends on shapes only."""

    def __init__(self, n, seq, vocab):
        self.ids = torch.randint(0, vocab, (n, seq))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]), "labels": self.ids[i]}


def shapes_only_checkpoint(folder):
    """Llama-2-7B's config and a safetensors file of its tensors' shapes, no data."""
    from vramguard.dryrun.features.weightless import sparse_checkpoint_from_config

    return sparse_checkpoint_from_config(LlamaConfig(**LLAMA2_7B), folder, dtype=torch.float16)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a Hub id or a local folder (default: Llama-2-7B's shapes, no weights)")
    ap.add_argument("--seq", type=int, default=512, help="tokens per sequence (default 512)")
    ap.add_argument("--batch", type=int, default=1, help="per_device_train_batch_size (default 1)")
    ap.add_argument("--accumulation", type=int, default=4, help="gradient_accumulation_steps (default 4)")
    ap.add_argument("--steps", type=int, default=2, help="optimizer steps (default 2)")
    ap.add_argument("--rank", type=int, default=16, help="LoRA rank (default 16)")
    ap.add_argument("--optim", default="paged_adamw_8bit", help="TrainingArguments' optim (default paged_adamw_8bit)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="train-qlora-") as tmp:
        model_path = args.model or shapes_only_checkpoint(os.path.join(tmp, "llama-2-7b-shapes"))
        quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                   bnb_4bit_compute_dtype=torch.float16)
        model = AutoModelForCausalLM.from_pretrained(model_path, quantization_config=quant, dtype=torch.float16,
                                                     device_map={"": 0})
        print(f"after loading: {torch.cuda.memory_allocated() / 2**20:,.0f} MiB allocated", flush=True)
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)
        model = get_peft_model(model, LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.05,
                                                 target_modules="all-linear", task_type="CAUSAL_LM"))
        training = TrainingArguments(
            output_dir=os.path.join(tmp, "out"), per_device_train_batch_size=args.batch,
            gradient_accumulation_steps=args.accumulation, max_steps=args.steps, learning_rate=2e-4,
            fp16=True, gradient_checkpointing=True, optim=args.optim, logging_steps=1, save_strategy="no",
            report_to="none")
        data = RandomTokens(args.batch * args.accumulation * args.steps, args.seq, model.config.vocab_size)
        Trainer(model=model, args=training, train_dataset=data).train()
        print(f"peak allocated {torch.cuda.max_memory_allocated() / 2**20:,.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
