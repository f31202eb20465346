"""Working in a notebook: the IPython handler that reports and recovers
after an out-of-memory error, and the meter after each cell (ipython.py),
recover() (recover.py), and find_max_batch(), which recovers between its
tries (find_batch.py).

Layer 6 of the package (tests/test_layers.py): below it, every layer but
phantom/ and the top."""
