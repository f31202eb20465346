"""The phantom GPU: the real PyTorch on stand-in CUDA libraries (gpu.py:
their build, preload() and environ()), a phantom device's settings
(settings.py: its size, each allocator's PYTORCH_CUDA_ALLOC_CONF), and the
Jupyter kernel on a phantom (kernel.py). The dry run that runs programs on
it is vramguard.dryrun.

Layer 7 of the package (tests/test_layers.py): the dry run and the top
(cli.py, integrations.py, the package's __init__) are above it."""
