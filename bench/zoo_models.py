"""The zoo: real training (and one inference) loops, built on the device
with no downloaded weights, one step function each.

    step = build("gpt2", batch=8, size="full")     # size "small" for CI's CPUs
    for _ in range(3):
        step()

The same builders run on a real GPU (tests/gpu/zoo_on_gpu.sh) and on a
phantom one (bench/zoo_fidelity.py), so that what they allocate can be set side by
side. Models are created under `torch.device("cuda")`: their initialisation
runs on the device (a phantom's kernels do nothing), not on the host's
CPU (a tensor a step makes names its device: the context is gone by then).
Every loop has fixed shapes and a fixed number of steps, never control
flow on values read back, so a phantom (whose reads are zeros) takes the
path a GPU takes.

Two entries are driven by a library's own loop (bert-trainer: HF
transformers' Trainer; lightning: lightning.Trainer): the loop runs on a
thread and pauses after each optimizer step, so that their step() too is
one optimizer step (_LoopStepper). The QLoRA entries (llama2-7b-qlora and
its -adamw) load their model in 4 bits with bitsandbytes from a checkpoint
of shapes only, written from the config (no weights downloaded or made),
and train it with peft's LoRA under the Trainer; they, and llama-1b-lora,
take a sequence length (build's seq, zoo_run.py --seq).
"""
import atexit
import random
import tempfile
import threading

# name -> (builder, default batch, {size: options})
SIZES = ("small", "full")


def _optimizer(torch, model, kind="adamw"):
    params = [p for p in model.parameters() if p.requires_grad]
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9)
    return torch.optim.AdamW(params, lr=1e-4)


def _train_step(torch, model, opt, loss_fn):
    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn()
        loss.backward()
        opt.step()
        return loss

    return step


def _autocast(torch, enabled):
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=enabled)


def mlp(torch, batch, size):
    width = 1024 if size == "small" else 4096
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(width, 10))
    x = torch.randn(batch, width)
    y = torch.randint(0, 10, (batch,))
    opt = _optimizer(torch, model)
    return _train_step(torch, model, opt, lambda: torch.nn.functional.cross_entropy(model(x), y))


def _gpt2_config(transformers, size, seq):
    if size == "small":
        return transformers.GPT2Config(n_layer=2, n_embd=256, n_head=4, n_positions=max(1024, seq))
    return transformers.GPT2Config(n_positions=max(1024, seq))


def gpt2(torch, batch, size, bf16=True, seq=None):
    import transformers

    seq = seq or (128 if size == "small" else 1024)
    model = transformers.GPT2LMHeadModel(_gpt2_config(transformers, size, seq))
    ids = torch.randint(0, model.config.vocab_size, (batch, seq))
    opt = _optimizer(torch, model)

    def loss_fn():
        with _autocast(torch, bf16):
            return model(input_ids=ids, labels=ids).loss

    return _train_step(torch, model, opt, loss_fn)


def gpt2_fp32(torch, batch, size):
    return gpt2(torch, batch, size, bf16=False)


def gpt2_varlen(torch, batch, size):
    """A new sequence length every step, as padding-free batches give: the
    fragmentation case (each step's activations are a new set of sizes)."""
    import transformers

    top = 256 if size == "small" else 1024
    model = transformers.GPT2LMHeadModel(_gpt2_config(transformers, size, top))
    opt = _optimizer(torch, model)
    lengths = random.Random(0)

    def step():
        seq = lengths.randrange(top // 8, top + 1)
        ids = torch.randint(0, model.config.vocab_size, (batch, seq), device="cuda")  # made per step
        opt.zero_grad(set_to_none=True)
        with _autocast(torch, True):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        return loss

    return step


def gpt2_generate(torch, batch, size):
    """Inference with a growing KV cache: a fixed number of new tokens per
    step (no stop on end-of-text, which would read values back)."""
    import transformers

    prompt, new = (32, 32) if size == "small" else (128, 256)
    model = transformers.GPT2LMHeadModel(_gpt2_config(transformers, size, prompt + new)).eval()
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt))

    @torch.no_grad()
    def step():
        with _autocast(torch, True):
            out = model(input_ids=ids, use_cache=True)
            past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
            for _ in range(new):
                out = model(input_ids=token, past_key_values=past, use_cache=True)
                past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        return token

    return step


def _llama_config(transformers, size):
    """TinyLlama's shape (about 1.1B parameters), or a small one for CI."""
    if size == "small":
        config = transformers.LlamaConfig(hidden_size=256, intermediate_size=704, num_hidden_layers=2,
                                          num_attention_heads=8, num_key_value_heads=2, vocab_size=32000)
        return config, 128
    config = transformers.LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                                      num_attention_heads=32, num_key_value_heads=4, vocab_size=32000)
    return config, 1024


def llama(torch, batch, size):
    """A Llama-style decoder of about 1.1B parameters (TinyLlama's shape),
    bf16 autocast, gradient checkpointing."""
    import transformers

    config, seq = _llama_config(transformers, size)
    model = transformers.LlamaForCausalLM(config)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    ids = torch.randint(0, config.vocab_size, (batch, seq))
    opt = _optimizer(torch, model)

    def loss_fn():
        with _autocast(torch, True):
            return model(input_ids=ids, labels=ids).loss

    return _train_step(torch, model, opt, loss_fn)


def llama_lora(torch, batch, size, seq=None):
    """LoRA fine-tuning (peft) of the Llama-style decoder: the base's weights
    in bf16 and frozen (no quantization), rank-16 adapters (kept in fp32 by
    peft) on every attention and MLP projection, bf16 autocast, gradient
    checkpointing, only the adapters' parameters in AdamW. seq: tokens per
    sequence (default 1024, 128 small)."""
    import peft
    import transformers

    config, default_seq = _llama_config(transformers, size)
    seq = seq or default_seq
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    # Not reentrant: the frozen embedding's output needs no grad for the
    # adapters inside each checkpointed layer to get theirs.
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lora = peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, task_type="CAUSAL_LM",
                           target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                           "gate_proj", "up_proj", "down_proj"])
    model = peft.get_peft_model(model, lora)
    model.train()
    ids = torch.randint(0, config.vocab_size, (batch, seq))
    opt = _optimizer(torch, model)  # requires_grad: the adapters only

    def loss_fn():
        with _autocast(torch, True):
            return model(input_ids=ids, labels=ids).loss

    return _train_step(torch, model, opt, loss_fn)


def bert(torch, batch, size):
    """BERT-base fine-tuning for classification, sequence 512 (128 small)."""
    import transformers

    config, seq = _bert_config(transformers, size)
    model = transformers.BertForSequenceClassification(config)
    ids = torch.randint(0, config.vocab_size, (batch, seq))
    labels = torch.randint(0, 2, (batch,))
    opt = _optimizer(torch, model)

    def loss_fn():
        with _autocast(torch, True):
            return model(input_ids=ids, labels=labels).loss

    return _train_step(torch, model, opt, loss_fn)


class _LoopStepper:
    """A framework's own training loop (`run`: Trainer.train, Trainer.fit),
    one optimizer step per call. The loop runs on a thread of its own; its
    step-end hook calls `pause()`, which hands back to the caller and waits
    for the next call, so the loop's allocations, optimizer, scheduler and
    data loading are its own, its state lives on between calls as in one
    uninterrupted run, and each call times exactly one optimizer step (the
    first call: the loop's set-up and its first step).

    The loop is asked for more steps than anyone calls for; `close()` (also
    at exit) lets its hook say stop, and the loop ends as it would. An
    exception in the loop (an out-of-memory) is raised by the call. The
    entries add `trainer` and `optimizer_steps()` (the loop's own count)."""

    def __init__(self, run):
        self._run = run
        self._go = threading.Semaphore(0)
        self._done = threading.Semaphore(0)
        self._thread = None
        self._error = None
        self._ended = False
        self._stop = False
        self.output_dir = None  # a TemporaryDirectory the loop writes in, removed by close()

    def pause(self):
        """From the loop's step-end hook: True when the loop should stop."""
        self._done.release()
        self._go.acquire()
        return self._stop

    def _main(self):
        try:
            self._go.acquire()
            if not self._stop:
                self._run()
        except BaseException as exc:  # raised by the caller's call
            self._error = exc
        finally:
            self._ended = True
            self._done.release()

    def __call__(self):
        if self._ended:
            raise RuntimeError("the training loop has ended")
        if self._thread is None:
            self._thread = threading.Thread(target=self._main, name="zoo-training-loop", daemon=True)
            self._thread.start()
            atexit.register(self.close)
        self._go.release()
        self._done.acquire()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        if self._ended:
            raise RuntimeError("the training loop ended before its step")

    def close(self):
        """Ends the loop (its own way out), waits for it, and removes its
        output folder."""
        if self._thread is not None and not self._ended:
            self._stop = True
            self._go.release()
            self._thread.join()
        if self.output_dir is not None:
            self.output_dir.cleanup()


def _mixed_precision(torch):
    """bf16 on devices that compute it natively (compute capability 8.0 and
    above), else fp32: fp16 would need a gradient scaler, whose skipped
    steps are control flow on values read back."""
    return torch.cuda.get_device_capability() >= (8, 0)


def _bert_config(transformers, size):
    if size == "small":
        config = transformers.BertConfig(hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=1024, num_labels=2)
        return config, 128
    return transformers.BertConfig(num_labels=2), 512


def bert_trainer(torch, batch, size):
    """BERT-base fine-tuning for classification (the shapes of `bert`) by
    HF transformers' Trainer: its own loop, AdamW (its default, fused),
    linear schedule, gradient clipping and mixed precision (bf16 where the
    device has it, else fp32), batches from a host dataset of random ids
    moved by the Trainer. Nothing downloaded, saved or reported."""
    import transformers

    config, seq = _bert_config(transformers, size)
    model = transformers.BertForSequenceClassification(config)
    bf16 = _mixed_precision(torch)
    with torch.device("cpu"):  # the host's, as in a script: the Trainer moves the batches
        g = torch.Generator().manual_seed(0)
        rows = 8 * batch  # a few batches, repeated: epochs roll over as in a long run
        ids = torch.randint(0, config.vocab_size, (rows, seq), generator=g)
        labels = torch.randint(0, 2, (rows,), generator=g)
        data = [{"input_ids": ids[i], "attention_mask": torch.ones(seq, dtype=torch.long),
                 "labels": labels[i]} for i in range(rows)]
        out = tempfile.TemporaryDirectory(prefix="zoo-bert-trainer-")
        args = transformers.TrainingArguments(
            output_dir=out.name, per_device_train_batch_size=batch, max_steps=10**9,
            bf16=bf16, learning_rate=2e-5, report_to="none", save_strategy="no", eval_strategy="no",
            logging_nan_inf_filter=False, disable_tqdm=True,
            dataloader_drop_last=True, seed=0)
        stepper = None

        class Pause(transformers.TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if stepper.pause():
                    control.should_training_stop = True

        trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[Pause()])
        trainer.remove_callback(transformers.PrinterCallback)  # stdout is zoo_run.py's (its JSON)
    stepper = _LoopStepper(trainer.train)
    stepper.trainer, stepper.output_dir = trainer, out
    stepper.optimizer_steps = lambda: trainer.state.global_step
    return stepper


def lightning(torch, batch, size):
    """A small transformer classifier (token ids to one of 10 classes) as a
    LightningModule trained by `lightning.Trainer` on one GPU: its own loop,
    AdamW from configure_optimizers, mixed precision (bf16 where the device
    has it, else fp32), batches from a host DataLoader moved by Lightning.
    No checkpoints, logger, progress bar or model summary."""
    import lightning as L

    width, layers, seq, vocab = (128, 2, 64, 1000) if size == "small" else (512, 6, 512, 32000)
    nn = torch.nn

    class Classifier(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, width)
            self.pos = nn.Parameter(torch.zeros(seq, width))
            layer = nn.TransformerEncoderLayer(width, width // 64, 4 * width, dropout=0.1,
                                               batch_first=True, norm_first=True)
            self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.head = nn.Linear(width, 10)

        def training_step(self, batch, batch_idx):
            ids, labels = batch
            hidden = self.encoder(self.embed(ids) + self.pos)
            return nn.functional.cross_entropy(self.head(hidden.mean(1)), labels)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=3e-4)

    module = Classifier()
    stepper = None

    class Pause(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if stepper.pause():
                trainer.should_stop = True

    with torch.device("cpu"):  # the host's, as in a script: Lightning moves the batches
        g = torch.Generator().manual_seed(0)
        rows = 8 * batch  # a few batches, repeated: epochs roll over as in a long run
        data = torch.utils.data.TensorDataset(torch.randint(0, vocab, (rows, seq), generator=g),
                                              torch.randint(0, 10, (rows,), generator=g))
        loader = torch.utils.data.DataLoader(data, batch_size=batch, shuffle=True, drop_last=True, generator=g)
        trainer = L.Trainer(accelerator="gpu", devices=1, max_steps=10**9,
                            precision="bf16-mixed" if _mixed_precision(torch) else "32-true",
                            enable_checkpointing=False, logger=False, enable_progress_bar=False,
                            enable_model_summary=False, callbacks=[Pause()])
    stepper = _LoopStepper(lambda: trainer.fit(module, train_dataloaders=loader))
    stepper.trainer = trainer
    stepper.optimizer_steps = lambda: trainer.global_step
    return stepper


#: Llama-2-7B's published config (meta-llama/Llama-2-7b-hf), as
#: examples/train_qlora.py has it; "small": a tiny Llama for CI's CPUs.
LLAMA2_7B = dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096,
                 rms_norm_eps=1e-5)
LLAMA_TINY = dict(vocab_size=32000, hidden_size=256, intermediate_size=704, num_hidden_layers=2,
                  num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=4096,
                  rms_norm_eps=1e-5)


class _RandomTokens:
    """A causal-LM dataset of random ids of one length (the Trainer's
    batches; memory depends on shapes only)."""

    def __init__(self, torch, rows, seq, vocab):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (rows, seq), generator=g)
        self.mask = torch.ones(seq, dtype=torch.long)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": self.mask, "labels": self.ids[i]}


def llama2_7b_qlora(torch, batch, size, seq=None, optim="paged_adamw_8bit"):
    """QLoRA as the Colab tutorials write it (examples/train_qlora.py): a
    Llama-2-7B-shaped model (a tiny Llama small) loaded in 4-bit NF4 with
    double quantization and fp16 compute (bitsandbytes) from a checkpoint of
    shapes only (a sparse safetensors file: no weights anywhere),
    prepare_model_for_kbit_training, LoRA r=16 on every linear layer (peft),
    gradient checkpointing, HF Trainer with fp16 and `optim` (the paged 8-bit
    AdamW, or "adamw_torch": torch.optim.AdamW over the adapters). seq:
    tokens per sequence (default 512, 128 small)."""
    import peft
    import transformers

    from vramguard.dryrun.features.weightless import sparse_checkpoint_from_config

    seq = seq or (128 if size == "small" else 512)
    shape = LLAMA_TINY if size == "small" else LLAMA2_7B
    out = tempfile.TemporaryDirectory(prefix="zoo-qlora-")
    with torch.device("cpu"):  # the checkpoint is written on the meta device, the data made on the host
        folder = sparse_checkpoint_from_config(transformers.LlamaConfig(**shape), f"{out.name}/model",
                                               dtype=torch.float16)
        quant = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                bnb_4bit_use_double_quant=True,
                                                bnb_4bit_compute_dtype=torch.float16)
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, quantization_config=quant,
                                                                  dtype=torch.float16, device_map={"": 0})
        model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)
        model = peft.get_peft_model(model, peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05,
                                                           target_modules="all-linear", task_type="CAUSAL_LM"))
        data = _RandomTokens(torch, 8 * batch, seq, shape["vocab_size"])
        args = transformers.TrainingArguments(
            output_dir=f"{out.name}/out", per_device_train_batch_size=batch, max_steps=10**9,
            learning_rate=2e-4, fp16=True, gradient_checkpointing=True, optim=optim,
            report_to="none", save_strategy="no", eval_strategy="no", logging_nan_inf_filter=False,
            disable_tqdm=True, dataloader_drop_last=True, seed=0)
        stepper = None

        class Pause(transformers.TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if stepper.pause():
                    control.should_training_stop = True

        trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[Pause()])
        trainer.remove_callback(transformers.PrinterCallback)  # stdout is zoo_run.py's (its JSON)
    stepper = _LoopStepper(trainer.train)
    stepper.trainer, stepper.output_dir = trainer, out
    stepper.optimizer_steps = lambda: trainer.state.global_step
    return stepper


def llama2_7b_qlora_adamw(torch, batch, size, seq=None):
    """llama2-7b-qlora with torch.optim.AdamW (optim="adamw_torch") instead
    of the paged 8-bit AdamW: its state in PyTorch's allocator, in fp32."""
    return llama2_7b_qlora(torch, batch, size, seq, optim="adamw_torch")


def _vision(torch, batch, size, arch, bf16, opt_kind):
    import torchvision

    model = getattr(torchvision.models, arch)(weights=None)
    side = 64 if size == "small" else 224
    if arch.startswith("vit"):
        side = 224  # the patch embedding's positions fix the input size
    x = torch.randn(batch, 3, side, side)
    y = torch.randint(0, 1000, (batch,))
    opt = _optimizer(torch, model, opt_kind)

    def loss_fn():
        with _autocast(torch, bf16):
            return torch.nn.functional.cross_entropy(model(x), y)

    return _train_step(torch, model, opt, loss_fn)


def resnet18(torch, batch, size):
    return _vision(torch, batch, size, "resnet18", False, "sgd")


def resnet50(torch, batch, size):
    return _vision(torch, batch, size, "resnet50", True, "sgd")


def vit_b_16(torch, batch, size):
    return _vision(torch, batch, size, "vit_b_16", True, "adamw")


# name -> (builder, batch at full size, batch at small size)
MODELS = {
    "mlp": (mlp, 256, 32),
    "gpt2": (gpt2, 8, 2),
    "gpt2-fp32": (gpt2_fp32, 8, 2),
    "gpt2-varlen": (gpt2_varlen, 8, 2),
    "gpt2-generate": (gpt2_generate, 16, 2),
    "llama-1b": (llama, 4, 2),
    "llama-1b-lora": (llama_lora, 4, 2),
    "llama2-7b-qlora": (llama2_7b_qlora, 1, 2),
    "llama2-7b-qlora-adamw": (llama2_7b_qlora_adamw, 1, 2),
    "bert": (bert, 32, 4),
    "bert-trainer": (bert_trainer, 32, 4),
    "lightning": (lightning, 64, 8),
    "resnet18": (resnet18, 64, 4),
    "resnet50": (resnet50, 64, 4),
    "vit_b_16": (vit_b_16, 32, 2),
}


def default_batch(name, size="full"):
    _, full, small = MODELS[name]
    return full if size == "full" else small


#: The entries that take a sequence length (build's seq).
WITH_SEQ = ("llama-1b-lora", "llama2-7b-qlora", "llama2-7b-qlora-adamw")


def build(torch, name, batch=None, size="full", seq=None):
    """The step function of zoo model `name`, its model and data made on
    the current CUDA device. batch None: the model's default for `size`;
    seq None: the model's own sequence length (only WITH_SEQ take one)."""
    if seq is not None and name not in WITH_SEQ:
        raise ValueError(f"zoo model {name!r} has no sequence length option: only {', '.join(WITH_SEQ)}")
    if name not in MODELS:
        raise ValueError(f"unknown zoo model {name!r}: one of {', '.join(MODELS)}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}: one of {', '.join(SIZES)}")
    builder = MODELS[name][0]
    batch = batch or default_batch(name, size)
    torch.manual_seed(0)
    with torch.device("cuda"):
        return builder(torch, batch, size) if seq is None else builder(torch, batch, size, seq=seq)
