"""What vramguard tells the user about a run: summary() (summary.py),
last_oom() (oom.py; its advice in oom_advice.py, its text and HTML in
oom_text.py, what is noted for it as it happens in oom_notes.py), regions
(regions.py, the table they print in region_table.py), steps and leaks
(steps.py; the leak rule in leak_rule.py, the Leak in leak.py), what
regions and steps keep per heap (tracked_heaps.py), the meter's and
find_max_batch's invisible peaks (peak_probe.py), vramguard.plot()
(plot.py), the replay report of `python -m vramguard replay`
(replay_report.py), and the demo with its example trace (demo.py).

Layer 5 of the package (tests/test_layers.py): below it, the base
modules, render/, torch/ and trace/."""
