"""LLM.int8 in a dry run: what a phantom cannot size.

bitsandbytes' 8-bit layer, Linear8bitLt (what transformers puts in place of
every linear layer under BitsAndBytesConfig(load_in_8bit=True), and what a
script may make itself), decomposes each matrix multiplication when its
outlier threshold is above 0 (transformers' llm_int8_threshold, 6.0 unless
set): the activations' columns holding a value at or above the threshold
are multiplied apart in 16 bits, in buffers sized by how many such columns
there are. Their count comes from the values, which a phantom does not
compute, so a dry run's figures cannot hold what those buffers take on a
card. With a threshold of 0 nothing depends on values.

The child counts the Linear8bitLt layers made with a threshold above 0
(their constructor, wrapped once bitsandbytes' module loads: cheap, and the
same for a model loaded by transformers or built by hand); the report says
so when there were any.
"""
import functools
import sys

from .after_import import patch_after_import
from ...render.words import count
from .base import Feature

#: the module that defines Linear8bitLt
MODULES = "bitsandbytes.nn.modules"


class Record:
    """Read by the child into its result (llm_int8_layers)."""

    def __init__(self):
        self.outlier_layers = 0  # Linear8bitLt made with threshold > 0


def _patch(module, record):
    cls = getattr(module, "Linear8bitLt", None)
    if cls is None or getattr(cls.__init__, "_vramguard_counted", False):
        return
    original = cls.__init__

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        state = getattr(self, "state", None)
        if (getattr(state, "threshold", 0.0) or 0.0) > 0.0:
            record.outlier_layers += 1

    __init__._vramguard_counted = True
    cls.__init__ = __init__


def install():
    """The record the counting fills: bitsandbytes' layers are patched now
    if loaded, else as they load."""
    record = Record()
    patch_after_import((MODULES,), lambda name: _patch(sys.modules[name], record))
    return record


def note(runs):
    """The report's sentence, or None when no run made an LLM.int8 layer
    with an outlier threshold."""
    layers = max((r.get("llm_int8_layers") or 0 for r in runs), default=0)
    if not layers:
        return None
    return (f"The program used LLM.int8 (bitsandbytes' Linear8bitLt with an outlier threshold: "
            f"{count(layers, 'layer')}), which sizes its outlier buffers from the activations' values: a "
            "phantom does not compute them, so the figures leave out what those buffers take on a card.")


class _LlmInt8(Feature):
    name = "llm_int8"

    def install(self, run):
        return install()

    def figures(self, record, run):
        return {"llm_int8_layers": record.outlier_layers if record else 0}

    def notes(self, result, runs):
        return list(filter(None, [note(runs)]))


FEATURE = _LlmInt8()
