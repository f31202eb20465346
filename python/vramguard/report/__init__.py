"""What vramguard tells the user about a run: summary() (summary.py),
last_oom() and its advice (oom.py, with what is noted for it as it
happens in oom_notes.py), regions, steps and leaks (regions.py),
vramguard.plot() (plot.py), the replay report of `python -m vramguard
replay` (replay_report.py), and the demo with its example trace
(demo.py).

Layer 5 of the package (tests/test_layers.py): below it, the base
modules, render/, torch/ and trace/."""
