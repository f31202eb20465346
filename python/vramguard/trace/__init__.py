"""Allocation traces: the Trace type and the .vgtrace file (format.py),
the Python stacks of allocations (stacks.py), the readers of PyTorch's
snapshots and of lifetime logs (importer.py), recording a heap
(record.py), replaying on a simulated device (replay.py) and writing
PyTorch's snapshot format from vramguard's state (snapshot.py).

Layer 4 of the package (tests/test_layers.py): below it, the base
modules, render/ and torch/ (the installed allocator's device heaps)."""
