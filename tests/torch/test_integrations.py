"""vramguard's figures logged per step by the callbacks for Lightning and
HF transformers, with the real libraries, the real PyTorch and the fake
CUDA. The fake runs no kernels, so the steps allocate on the device
(torch.empty) and compute nothing there: Lightning's training step is
manual and allocates; the HF Trainer computes on the CPU while its model
allocates a device buffer at each forward."""
import pytest

from fakegpu import MiB, run

pytestmark = pytest.mark.torch

NAMES = ["allocated_bytes", "reserved_bytes", "peak_allocated_bytes", "peak_reserved_bytes", "ooms",
         "cached_free_in_pieces", "reserved_unallocated"]
KEYS = ["vramguard/" + name for name in NAMES]


def test_lightning_logs_the_figures_of_each_step():
    out = run("""
        vramguard.install()
        import lightning.pytorch as L
        from lightning.pytorch.loggers import Logger
        from vramguard.integrations import LightningCallback, step_figures

        class Recorder(Logger):
            name, version = "recorder", 0
            def __init__(self):
                super().__init__()
                self.rows = []
            def log_metrics(self, metrics, step=None):
                self.rows.append({"step": step, **metrics})
            def log_hyperparams(self, *args, **kwargs):
                pass

        class Tiny(L.LightningModule):
            # Each step keeps one more MiB on the device: a known growth.
            def __init__(self):
                super().__init__()
                self.automatic_optimization = False
                self.weight = torch.nn.Parameter(torch.zeros(256))
                self.kept, self.seen = [], []
            def training_step(self, batch, batch_idx):
                self.kept.append(torch.empty(MiB, dtype=torch.uint8, device=self.device))
            def on_train_batch_end(self, outputs, batch, batch_idx):
                # Lightning calls this after the callbacks' hook
                self.seen.append(step_figures())
            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        logger = Recorder()
        model = Tiny()
        class Batches(torch.utils.data.IterableDataset):
            # no len(): Lightning would reduce the length on the device, a kernel
            def __iter__(self):
                return iter([torch.zeros(4) for _ in range(6)])  # 3 batches: one epoch

        data = torch.utils.data.DataLoader(Batches(), batch_size=2)
        trainer = L.Trainer(accelerator="cuda", devices=1, max_epochs=1, logger=logger, log_every_n_steps=1,
                            callbacks=[LightningCallback()], enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(model, data)
        out["rows"] = logger.rows
        out["seen"] = model.seen
        out["callback_metrics"] = {k: float(v) for k, v in trainer.callback_metrics.items()}
        out["stats"] = vramguard.stats()
    """)
    rows, seen = out["rows"], out["seen"]
    assert len(seen) == 3
    assert [[row[k] for k in KEYS] for row in rows] == [[float(s[k]) for k in KEYS] for s in seen]
    # each step one more MiB (in a 2 MiB segment each: no 1 MiB block shares one)
    growth = [b["vramguard/allocated_bytes"] - a["vramguard/allocated_bytes"] for a, b in zip(seen, seen[1:])]
    assert growth == [MiB, MiB]
    assert [s["vramguard/ooms"] for s in seen] == [0, 0, 0]
    assert {k: out["callback_metrics"][k] for k in KEYS} == {k: float(seen[-1][k]) for k in KEYS}
    assert seen[-1]["vramguard/peak_allocated_bytes"] == out["stats"]["allocated_bytes.all.peak"]


def test_hf_trainer_logs_the_figures_into_its_logs(tmp_path):
    pytest.importorskip("transformers")
    out = run(f"OUTPUT = {str(tmp_path)!r}", """
        vramguard.install()
        from transformers import Trainer, TrainerCallback, TrainingArguments
        from vramguard.integrations import HFCallback, step_figures

        class Tiny(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.weight = torch.nn.Parameter(torch.ones(4))
                self.kept = []
            def forward(self, x, labels=None):
                # the model trains on the CPU; each forward keeps a MiB on the device
                self.kept.append(torch.empty(MiB, dtype=torch.uint8, device="cuda"))
                return {"loss": ((x * self.weight).sum(-1) - labels).pow(2).mean()}

        class Seen(TrainerCallback):
            # after HFCallback: sees the logs it added, and the figures then
            def __init__(self):
                self.logs, self.figures = [], []
            def on_log(self, args, state, control, logs=None, **kwargs):
                self.logs.append(dict(logs))
                self.figures.append(step_figures())

        data = [{"x": torch.ones(4), "labels": torch.tensor(1.0)} for _ in range(8)]
        args = TrainingArguments(OUTPUT, use_cpu=True, max_steps=3, logging_steps=1, per_device_train_batch_size=2,
                                 report_to=[], save_strategy="no", disable_tqdm=True)
        seen = Seen()
        trainer = Trainer(model=Tiny(), args=args, train_dataset=data, callbacks=[HFCallback(), seen])
        trainer.train()
        out["logs"] = seen.logs
        out["figures"] = seen.figures
        out["history"] = trainer.state.log_history
    """)
    steps = [log for log in out["logs"] if "loss" in log]
    assert len(steps) == 3
    for log, figures in zip(steps, out["figures"]):
        assert {k: log[k] for k in KEYS} == figures
    growth = [b["vramguard/allocated_bytes"] - a["vramguard/allocated_bytes"] for a, b in zip(steps, steps[1:])]
    assert growth == [MiB, MiB]
    history = [h for h in out["history"] if "loss" in h]
    assert [{k: h[k] for k in KEYS} for h in history] == [{k: s[k] for k in KEYS} for s in steps]


def test_callbacks_refuse_to_run_before_install():
    out = run("""
        import lightning.pytorch as L
        from vramguard.integrations import LightningCallback
        out["error"] = error(LightningCallback().on_train_start, None, None)
    """)
    assert out["error"] == ["VramguardError", "LightningCallback logs vramguard's figures, but vramguard is not "
                            "PyTorch's allocator in this process: call vramguard.install() first, before "
                            "anything touches the GPU"]
