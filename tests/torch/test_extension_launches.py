"""Extensions named in a dry run's report only when their kernels ran.

A stand-in extension: a shared object that registers a fat binary with two
kernels as it loads (what nvcc's generated code does) and launches them
through cudaLaunchKernel when asked, in a Python package named as the
library that showed the problem (bitsandbytes, which transformers imports
whether or not a script quantizes). It needs no CUDA toolkit: the
phantom's runtime, preloaded, answers it."""
import subprocess

import pytest

from test_dryrun import ROOT, built_phantom, dryrun, report, write  # noqa: F401  (a fixture too)

# torch_version: runs in the CUDA 12 tier too (docs/development.md)
pytestmark = [pytest.mark.torch, pytest.mark.torch_version]

KERNELS_C = r"""
#include <stddef.h>
typedef struct { unsigned x, y, z; } dim3;
typedef struct { unsigned magic, version; const void *data, *unused; } wrapper;
void **__cudaRegisterFatBinary(void *fat_cubin);
void __cudaRegisterFatBinaryEnd(void **handle);
void __cudaRegisterFunction(void **handle, const char *host_fun, char *device_fun, const char *device_name,
                            int thread_limit, void *tid, void *bid, void *block, void *grid, int *wsize);
int cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shared_mem, void *stream);

static wrapper fatbin = {0x466243b1u, 1, NULL, NULL};
static const char quantize, dequantize;

__attribute__((constructor)) static void registers(void)
{
    void **handle = __cudaRegisterFatBinary(&fatbin);
    __cudaRegisterFunction(handle, &quantize, (char *)"quantize", "quantize", -1, 0, 0, 0, 0, 0);
    __cudaRegisterFunction(handle, &dequantize, (char *)"dequantize", "dequantize", -1, 0, 0, 0, 0, 0);
    __cudaRegisterFatBinaryEnd(handle);
}

int launch(int which)
{
    dim3 one = {1, 1, 1};
    return cudaLaunchKernel(which ? (const void *)&dequantize : (const void *)&quantize, one, one, NULL, 0, NULL);
}
"""

INIT = """
import ctypes, os
_lib = ctypes.CDLL(os.path.join(os.path.dirname(__file__), "_kernels.so"))

def launch(which):
    assert _lib.launch(which) == 0
"""

NOTE = "Custom CUDA extensions ran kernels"


@pytest.fixture
def extension(tmp_path):
    package = tmp_path / "bitsandbytes"
    package.mkdir()
    (package / "kernels.c").write_text(KERNELS_C)
    (package / "__init__.py").write_text(INIT)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(package / "_kernels.so"), str(package / "kernels.c")],
                   check=True)
    return package / "_kernels.so"


def test_an_extension_imported_but_never_launched_is_not_named(tmp_path, extension):
    write(tmp_path, "imports.py", """
        import torch, bitsandbytes
        x = torch.ones(1 << 20, device="cuda") * 2
    """)
    result, _ = dryrun(tmp_path, "--allocator", "native,vramguard", "--no-snapshot", "imports.py", expect=0)
    assert result["native"]["extensions"] == {} and result["vramguard"]["extensions"] == {}
    assert NOTE not in report(result) and "Custom CUDA extensions" not in report(result)


def test_an_extension_whose_kernels_ran_is_named_with_what_it_launched(tmp_path, extension):
    write(tmp_path, "launches.py", """
        import sys, torch, bitsandbytes
        x = torch.ones(1 << 20, device="cuda") * 2
        for which in [0] * int(sys.argv[1]) + [1] * int(sys.argv[2]):
            bitsandbytes.launch(which)
    """)
    result, _ = dryrun(tmp_path, "--allocator", "native,vramguard", "--no-snapshot", "launches.py", "3", "1",
                       expect=0)
    for name in ("native", "vramguard"):
        assert result[name]["extensions"] == {
            "bitsandbytes": {"kernels": 2, "launches": 4, "libraries": [str(extension)]}}, result[name]
    assert (f"{NOTE}: bitsandbytes (2 kernels, 4 launches): their kernels compute nothing here, and memory they "
            "take outside PyTorch's allocator is not in the peaks above.") in report(result)
    one, _ = dryrun(tmp_path, "--allocator", "native", "--no-snapshot", "launches.py", "1", "0", expect=0)
    assert f"{NOTE}: bitsandbytes (1 kernel, 1 launch):" in report(one)
