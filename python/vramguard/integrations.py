"""vramguard's figures in the training loggers people already read.

    from vramguard.integrations import HFCallback, LightningCallback
    Trainer(..., callbacks=[HFCallback()])            # transformers
    L.Trainer(..., callbacks=[LightningCallback()])   # Lightning

Each step logs, under "vramguard/": allocated_bytes, reserved_bytes,
peak_allocated_bytes, peak_reserved_bytes (since the start or the last
vramguard.reset_peaks()), ooms, cached_free_in_pieces and
reserved_unallocated (the two ratios of vramguard.summary()).

Neither library is imported until its callback is asked for: importing
vramguard (and this module) never imports transformers or lightning, and
asking for a callback whose library is missing raises ImportError saying
what to install.
"""
from .torch import install as _torch

# The callbacks are left out of __all__: `import *` must not import their libraries.
__all__ = ["FIGURES", "PREFIX", "step_figures"]

#: Logged name (after the prefix) -> vramguard.stats() key.
FIGURES = {
    "allocated_bytes": "allocated_bytes.all.current",
    "reserved_bytes": "reserved_bytes.all.current",
    "peak_allocated_bytes": "allocated_bytes.all.peak",
    "peak_reserved_bytes": "reserved_bytes.all.peak",
    "ooms": "num_ooms",
    "cached_free_in_pieces": "fragmentation.external",
    "reserved_unallocated": "fragmentation.unused",
}
PREFIX = "vramguard/"


def step_figures(device=None, prefix=PREFIX, stats=None):
    """The figures a callback logs, read from vramguard.stats(device) (or
    from `stats`, a dict of the same keys)."""
    stats = _torch.stats(device) if stats is None else stats
    return {prefix + name: stats[key] for name, key in FIGURES.items()}


def require_installed(who):
    if not _torch.is_installed():
        raise _torch.VramguardError(
            f"{who} logs vramguard's figures, but vramguard is not PyTorch's allocator in this "
            "process: call vramguard.install() first, before anything touches the GPU")


def _missing(callback, package, pip_name):
    return ImportError(
        f"vramguard.integrations.{callback} needs {package}, which is not installed "
        f"(pip install {pip_name})")


# ------------------------------------------------------------------ transformers


def _hf_callback_class():
    try:
        from transformers import TrainerCallback
    except ImportError:
        raise _missing("HFCallback", "transformers", "transformers") from None

    class HFCallback(TrainerCallback):
        """A transformers TrainerCallback: reads vramguard's figures at the
        end of each optimizer step and adds the latest to the Trainer's logs
        (state.log_history, and the `logs` the callbacks after this one get).
        Reporting integrations (wandb, tensorboard) come before a callback
        passed in `callbacks=`; to have them report the figures too, put
        this one first: trainer.callback_handler.callbacks.insert(0, HFCallback())."""

        def __init__(self, device=None, prefix=PREFIX):
            self.device, self.prefix = device, prefix
            self.latest = {}

        def on_train_begin(self, args, state, control, **kwargs):
            require_installed("HFCallback")

        def on_step_end(self, args, state, control, **kwargs):
            self.latest = step_figures(self.device, self.prefix)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not self.latest or logs is None:
                return
            logs.update(self.latest)
            # Trainer.log() has stored a copy of `logs` already: add them there too.
            if state.log_history and state.log_history[-1].get("step") == state.global_step:
                state.log_history[-1].update(self.latest)

    return HFCallback


# ------------------------------------------------------------------ lightning


def _lightning_callback_base():
    try:
        from lightning.pytorch import Callback
    except ImportError:
        try:
            from pytorch_lightning import Callback  # the package's older name
        except ImportError:
            raise _missing("LightningCallback", "Lightning", "lightning") from None
    return Callback


def _lightning_callback_class():
    Callback = _lightning_callback_base()

    class LightningCallback(Callback):
        """A Lightning Callback: logs vramguard's figures after each training
        batch through pl_module.log (so every logger and the progress bar,
        with prog_bar=True, see them). Values are logged as float64 CPU
        tensors: exact for byte counts, and logging them allocates nothing
        on the device it measures."""

        def __init__(self, device=None, prefix=PREFIX, prog_bar=False):
            self.device, self.prefix, self.prog_bar = device, prefix, prog_bar

        def on_train_start(self, trainer, pl_module):
            require_installed("LightningCallback")

        def _device(self, pl_module):
            if self.device is not None:
                return self.device
            device = getattr(pl_module, "device", None)
            return device if getattr(device, "type", None) == "cuda" else None

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            import torch

            figures = step_figures(self._device(pl_module), self.prefix)
            pl_module.log_dict({k: torch.tensor(v, dtype=torch.float64) for k, v in figures.items()},
                               on_step=True, on_epoch=False, prog_bar=self.prog_bar, logger=True,
                               batch_size=1)

    return LightningCallback


_FACTORIES = {"HFCallback": _hf_callback_class, "LightningCallback": _lightning_callback_class}
_built = {}


def __getattr__(name):
    """The callback classes, built on first use (PEP 562), so that their
    library is imported only then."""
    factory = _FACTORIES.get(name)
    if factory is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _built:
        _built[name] = factory()
    return _built[name]
