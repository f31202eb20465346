"""Finds the CUDA runtime that the installed PyTorch uses, and prints it as
make variables for the fake's build (csrc/phantom/fakecuda.mk):

    CUDA_INC := <the runtime wheel's include directory>
    CUDART_LIB := <its libcudart.so.N>
    CUDA_MAJOR := N
    CUBLAS_INC := <the cuBLAS wheel's include directory>
    CUBLAS_LIB := <its libcublas.so.N>
    CUBLASLT_LIB := <its libcublasLt.so.N>
    CUDNN_INC := <the cuDNN wheel's include directory, or empty>
    CUDNN_LIB := <its libcudnn.so.M, or empty>
    CUDNN_MAJOR := M

PyTorch is not imported (that takes seconds and loads the real runtime):
its CUDA version is read from torch/version.py, and the runtime from pip's
nvidia wheels beside it (nvidia/cu13 for CUDA 13, nvidia/cuda_runtime for
CUDA 12). VG_FAKECUDA_INCLUDE and VG_FAKECUDA_CUDART, set together, name
another runtime instead (another wheel's, unpacked anywhere).

cuBLAS, for the stand-ins of libcublas and libcublasLt, is found the same
way (nvidia/cu13 for CUDA 13, nvidia/cublas for CUDA 12), or in
VG_FAKECUDA_CUBLAS (an unpacked wheel's nvidia/... directory, with lib/ and
include/). Without it the CUBLAS_ variables are empty and the stand-ins are
not built.

cuDNN is optional too: without the nvidia-cudnn wheel beside PyTorch (or
VG_FAKECUDA_CUDNN naming a libcudnn.so.M whose ../include has cudnn.h),
CUDNN_INC is empty and the cuDNN stand-in is not built.
"""
import importlib.util
import os
import re
import sys
from pathlib import Path


def fail(message):
    sys.exit("find_cuda.py: " + message)


def torch_cuda_major():
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        fail("PyTorch is not installed for %s (make's TORCH_PYTHON names the Python to ask)"
             % sys.executable)
    version_py = Path(list(spec.submodule_search_locations)[0]) / "version.py"
    match = re.search(r"^cuda\b[^=]*=\s*['\"](\d+)\.", version_py.read_text(), re.M)
    if not match:
        fail("this PyTorch (%s) is built without CUDA" % version_py.parent)
    return match.group(1)


def wheel_runtime(major):
    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations) if spec else []
    for root in roots:
        for lib in sorted(Path(root).glob("*/lib/libcudart.so.%s" % major)):
            inc = lib.parent.parent / "include"
            if (inc / "cuda_runtime_api.h").is_file() and (inc / "cuda.h").is_file():
                return inc, lib
    fail("no CUDA %s runtime wheel with headers under %s (pip's nvidia-cuda-runtime)"
         % (major, roots or "site-packages/nvidia"))


def cublas_in(root, major):
    """(include, libcublas, libcublasLt) of a wheel directory, or None."""
    lib, lt = root / "lib" / ("libcublas.so.%s" % major), root / "lib" / ("libcublasLt.so.%s" % major)
    inc = root / "include"
    if lib.is_file() and lt.is_file() and (inc / "cublas_api.h").is_file() \
            and (inc / "cublasLt.h").is_file():
        return inc, lib, lt
    return None


def wheel_cublas(major):
    given = os.environ.get("VG_FAKECUDA_CUBLAS")
    if given:
        found = cublas_in(Path(given), major)
        if not found:
            fail("VG_FAKECUDA_CUBLAS=%s has no lib/libcublas.so.%s, lib/libcublasLt.so.%s, "
                 "include/cublas_api.h and include/cublasLt.h" % (given, major, major))
        return found
    spec = importlib.util.find_spec("nvidia")
    for root in list(spec.submodule_search_locations) if spec else []:
        for lib in sorted(Path(root).glob("*/lib/libcublas.so.%s" % major)):
            found = cublas_in(lib.parent.parent, major)
            if found:
                return found
    return None


def wheel_cudnn():
    """The cuDNN wheel's (include directory, libcudnn.so.M), or None."""
    given = os.environ.get("VG_FAKECUDA_CUDNN")
    if given:
        libs = [Path(given)]
    else:
        spec = importlib.util.find_spec("nvidia")
        roots = list(spec.submodule_search_locations) if spec else []
        libs = [lib for root in roots for lib in sorted(Path(root).glob("cudnn/lib/libcudnn.so.*"))]
    for lib in libs:
        inc = lib.parent.parent / "include"
        if re.fullmatch(r"libcudnn\.so\.\d+", lib.name) and (inc / "cudnn.h").is_file():
            return inc, lib
    if given:
        fail("%s is not a libcudnn.so.M with ../include/cudnn.h" % given)
    return None


def main():
    inc, lib = os.environ.get("VG_FAKECUDA_INCLUDE"), os.environ.get("VG_FAKECUDA_CUDART")
    if inc or lib:
        if not (inc and lib):
            fail("set VG_FAKECUDA_INCLUDE and VG_FAKECUDA_CUDART together")
        inc, lib = Path(inc), Path(lib)
    else:
        inc, lib = wheel_runtime(torch_cuda_major())
    match = re.fullmatch(r"libcudart\.so\.(\d+)", lib.name)
    if not match or not lib.is_file():
        fail("%s is not a libcudart.so.N" % lib)
    print("CUDA_INC := %s" % inc.resolve())
    print("CUDART_LIB := %s" % lib.resolve())
    print("CUDA_MAJOR := %s" % match.group(1))
    cublas = wheel_cublas(match.group(1))
    inc, lib, lt = (p.resolve() for p in cublas) if cublas else ("", "", "")
    print("CUBLAS_INC := %s" % inc)
    print("CUBLAS_LIB := %s" % lib)
    print("CUBLASLT_LIB := %s" % lt)
    cudnn = wheel_cudnn()
    print("CUDNN_INC := %s" % (cudnn[0].resolve() if cudnn else ""))
    print("CUDNN_LIB := %s" % (cudnn[1].resolve() if cudnn else ""))
    print("CUDNN_MAJOR := %s" % (cudnn[1].name.rsplit(".", 1)[1] if cudnn else ""))


if __name__ == "__main__":
    main()
