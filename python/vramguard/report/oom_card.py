"""Which card the out-of-memory report's advice is for (oom_advice.py), and the
16-bit dtype torch.autocast should use on it.

A budget that is a card's preset (install(budget="T4") on a larger GPU)
stands for that card: the advice is for the card the program will run on.
Otherwise the device itself, as torch reports it. The dtype is
_presets.autocast_dtype's, the rule the dry run's remedies use too.
"""
import sys

from .._presets import PRESETS, autocast_dtype

__all__ = ["card_of", "autocast_advice_dtype"]


def _preset_of_budget(budget):
    for preset in PRESETS.values():
        if budget and preset.usable_bytes == budget:
            return preset
    return None


def card_of(record):
    """(name, compute capability) of the card the advice is for, or None
    when neither the budget nor torch says."""
    preset = _preset_of_budget(record["budget"])
    if preset is not None:
        return preset.name, tuple(preset.compute_capability)
    torch = sys.modules.get("torch")  # an out-of-memory came from it: imported
    if torch is None:
        return None
    try:
        return torch.cuda.get_device_name(record["device"]), tuple(torch.cuda.get_device_capability(record["device"]))
    except Exception:  # the device cannot say (a simulated heap, a device error)
        return None


def autocast_advice_dtype(card):
    """"bfloat16" or "float16" for the card, None when it is not known."""
    if card is None:
        return None
    return autocast_dtype(card[1])
