"""vramguard inside PyTorch: install() and the allocator's state
(install.py, state.py), the pluggable allocator's hooks (hooks.py), the
torch.OutOfMemoryError shim (oom_shim.py), the patched statistics
functions of torch.cuda (patches.py) and the shape of their figures
(stats.py), and the guard on cuDNN's benchmark mode (cudnn.py).

Layer 3 of the package (tests/test_layers.py): it imports the base
modules and render/ only. `import torch` in these modules is PyTorch."""
