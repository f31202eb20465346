"""GPU tests: vramguard must be PyTorch's allocator before anything touches
the GPU, so it is installed here, when this folder is collected, if there
is a GPU. Elsewhere every test in this folder skips with the reason."""
import pytest

try:
    import torch
except ImportError:  # CI: no PyTorch
    torch = None

HAVE_CUDA = torch is not None and torch.cuda.is_available()
REASON = "needs PyTorch with a CUDA GPU" if torch is None else "needs a CUDA GPU"

if HAVE_CUDA:
    import vramguard

    vramguard.install()


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/gpu" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.cuda)
            if not HAVE_CUDA:
                item.add_marker(pytest.mark.skip(reason=REASON))
