"""The phantom GPU: the real PyTorch on stand-in CUDA libraries
(gpu.py: preload() and environ()), the dry run of a script on it
(dryrun.py) and its child process (child.py, run as
`python -m vramguard.phantom.child`), and the Jupyter kernel on a phantom
(kernel.py).

Layer 7 of the package (tests/test_layers.py): only the top (cli.py,
integrations.py, the package's __init__) is above it."""
