"""A Hugging Face causal LM, loaded and optionally trained as a report ran it: the
model class and its config (published values given as --config key=value), a
checkpoint stand-in of that shape (vramguard's sparse safetensors: real header,
no data) loaded with from_pretrained (4-bit or 8-bit through bitsandbytes when
asked), then optionally LoRA (peft) and transformers' Trainer on random tokens
of the stated batch and length until --steps steps.

    python causal_lm.py --arch llama --config hidden_size=4096 ... --quant 4bit --train --batch 4 --seq 2048
"""
import argparse
import os
import tempfile

import torch
import transformers

from vramguard.dryrun.features.weightless import sparse_checkpoint_from_config
from config_args import DTYPES, config_kwargs

CONFIGS = {"llama": "LlamaConfig", "gpt2": "GPT2Config", "gpt_neox": "GPTNeoXConfig", "mistral": "MistralConfig",
           "qwen2": "Qwen2Config", "roberta": "RobertaConfig"}
HEADS = {"causal": "AutoModelForCausalLM", "masked": "AutoModelForMaskedLM"}


def sparse_checkpoint(config, folder, dtype, head="causal"):
    """The model's checkpoint as sparse safetensors (real headers, data holes), in shards of at
    most 2 GiB (one file of a 12B model's size is more than the host would map at once)."""
    return sparse_checkpoint_from_config(config, folder, dtype, model_class=getattr(transformers, HEADS[head]))


def library_at_least(version):
    """Whether the transformers imported is `version` or later (a rebuild may run the library of
    its report's day: an argument renamed since is passed by its name of then)."""
    from packaging.version import Version

    return Version(transformers.__version__) >= Version(version)


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n, seq, vocab):
        self.n, self.seq, self.vocab = n, seq, vocab

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        ids = torch.randint(0, self.vocab, (self.seq,))
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


class ShiftedLogitsLoss(transformers.Trainer):
    """The loss as transformers' causal LMs computed it before 4.46: the logits upcast
    (.float()), the shifted logits copied (logits[..., :-1, :].contiguous()), cross entropy
    against labels[..., 1:]."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        logits = outputs.logits.float()
        shift = logits[..., :-1, :].contiguous()
        loss = torch.nn.functional.cross_entropy(shift.view(-1, shift.size(-1)), labels[..., 1:].contiguous().view(-1))
        return (loss, outputs) if return_outputs else loss


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--arch", choices=CONFIGS, default="llama")
    p.add_argument("--config", nargs="*", default=[], help="key=value of the model's published config")
    p.add_argument("--head", choices=HEADS, default="causal")
    p.add_argument("--half-cuda", action="store_true",
                   help="built on the CPU, then model.half().cuda(): the weights copied to the GPU in module order")
    p.add_argument("--checkpoint-dtype", choices=DTYPES, default="fp16")
    p.add_argument("--dtype", choices=DTYPES, default=None, help="from_pretrained's dtype (default: the config's)")
    p.add_argument("--quant", choices=("none", "4bit", "8bit"), default="none")
    p.add_argument("--bnb-4bit-compute-dtype", choices=DTYPES, default="fp32")
    p.add_argument("--bnb-4bit-quant-type", default="fp4")
    p.add_argument("--bnb-4bit-double-quant", action="store_true")
    p.add_argument("--attn", default=None, help="attn_implementation (eager, sdpa); default the library's")
    p.add_argument("--train", action="store_true")
    p.add_argument("--lora-r", type=int, default=0)
    p.add_argument("--lora-alpha", type=int, default=8)
    p.add_argument("--lora-dropout", type=float, default=0.0)
    p.add_argument("--lora-targets", default=None, help="comma-separated; default peft's for the model")
    p.add_argument("--prepare-kbit", action="store_true", help="peft's prepare_model_for_kbit_training")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--mixed", choices=("none", "fp16", "bf16"), default="none")
    p.add_argument("--optim", default="adamw_torch")
    p.add_argument("--fsdp", default="", help="TrainingArguments' fsdp (\"full_shard auto_wrap\"), one process")
    p.add_argument("--fsdp-wrap", default=None, help="the decoder layer class FSDP wraps")
    p.add_argument("--fsdp-version", type=int, default=2, help="1: torch's FullyShardedDataParallel; 2: fully_shard")
    p.add_argument("--fsdp-flat-params", action="store_true",
                   help="FSDP1 with use_orig_params=False: the optimizer steps each unit's flat parameter")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--shifted-logits-loss", action="store_true",
                   help="the loss of transformers before 4.46 (ShiftedLogitsLoss)")
    a = p.parse_args()

    if a.fsdp:  # one process, as torchrun --nproc_per_node 1 starts it
        for key, val in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                         ("MASTER_PORT", "29533")):
            os.environ.setdefault(key, val)
    config = getattr(transformers, CONFIGS[a.arch])(**config_kwargs(a.config))
    if a.half_cuda:
        # what .half().cuda() allocates on the GPU, in its order (Module._apply: children first,
        # then a module's own parameters and buffers), without the model's bytes on the host
        with torch.device("meta"):
            model = getattr(transformers, HEADS[a.head]).from_config(config)
        model.half().to_empty(device="cuda")
        torch.cuda.synchronize()
        return
    folder = os.path.join(os.environ.get("VRAMGUARD_DRYRUN_DIR") or tempfile.mkdtemp(), "checkpoint")
    sparse_checkpoint(config, folder, DTYPES[a.checkpoint_dtype], a.head)
    kwargs = {"device_map": {"": 0}}
    if a.dtype:  # named torch_dtype before transformers 4.56
        kwargs["dtype" if library_at_least("4.56") else "torch_dtype"] = DTYPES[a.dtype]
    if a.attn and library_at_least("4.36"):
        kwargs["attn_implementation"] = a.attn
    elif a.attn and a.attn != "eager":  # before 4.36 a model has its eager attention only
        raise SystemExit(f"causal_lm.py: --attn {a.attn}: transformers {transformers.__version__} has eager only")
    if a.quant == "4bit":
        kwargs["quantization_config"] = transformers.BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type=a.bnb_4bit_quant_type,
            bnb_4bit_compute_dtype=DTYPES[a.bnb_4bit_compute_dtype],
            bnb_4bit_use_double_quant=a.bnb_4bit_double_quant)
    elif a.quant == "8bit":
        kwargs["quantization_config"] = transformers.BitsAndBytesConfig(load_in_8bit=True)
    model = getattr(transformers, HEADS[a.head]).from_pretrained(folder, **kwargs)
    if not a.train:
        return
    model.config.use_cache = False
    if a.prepare_kbit:
        import peft

        # peft before 0.4 names it prepare_model_for_int8_training
        prepare = getattr(peft, "prepare_model_for_kbit_training", None) or peft.prepare_model_for_int8_training
        model = prepare(model, use_gradient_checkpointing=a.gradient_checkpointing)
    if a.lora_r:
        import peft

        targets = a.lora_targets.split(",") if a.lora_targets else None
        model = peft.get_peft_model(model, peft.LoraConfig(r=a.lora_r, lora_alpha=a.lora_alpha,
                                                           lora_dropout=a.lora_dropout, target_modules=targets,
                                                           bias="none", task_type="CAUSAL_LM"))
    args = transformers.TrainingArguments(
        output_dir=os.path.join(os.path.dirname(folder), "out"), per_device_train_batch_size=a.batch,
        gradient_accumulation_steps=a.grad_accum, max_steps=a.steps, optim=a.optim,
        gradient_checkpointing=a.gradient_checkpointing, fp16=a.mixed == "fp16", bf16=a.mixed == "bf16",
        report_to=[], save_strategy="no", logging_steps=1, dataloader_num_workers=0,
        **({"fsdp": a.fsdp, "fsdp_config": {"version": a.fsdp_version, **(
            {"use_orig_params": False} if a.fsdp_flat_params else {}), **(
            {"transformer_layer_cls_to_wrap": [a.fsdp_wrap]} if a.fsdp_wrap else {})}} if a.fsdp else {}))
    data = RandomTokens(a.batch * a.grad_accum * a.steps, a.seq, config.vocab_size)
    trainer = ShiftedLogitsLoss if a.shifted_logits_loss else transformers.Trainer
    trainer(model=model, args=args, train_dataset=data).train()


if __name__ == "__main__":
    main()
