"""Figures turned into what people read: the summary table (summary.py),
the advice line under a figure (advice.py), the HTML a notebook shows
(html.py) and the matplotlib drawing of a replay (plot.py). Nothing here
reads the allocator or imports torch: the callers pass the figures.

Layer 2 of the package (tests/test_layers.py): it imports only the base
modules (_core, _presets, _units)."""
