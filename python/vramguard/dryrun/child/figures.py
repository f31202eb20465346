"""The figures a child reads from its process and the libraries it loaded,
beside PyTorch's own: the host's peak memory, vramguard's heap policy,
whether PyTorch has kernels for the card, cuDNN's benchmark mode kept off,
torch.compile, the CUDA context's share."""
import os
import resource
import sys
import warnings

__all__ = ["card_arch", "compiled", "context_bytes", "cudnn_benchmark_kept_off", "heap_policy", "peak_rss_bytes"]


def peak_rss_bytes():
    """This process's peak resident set so far: VmHWM (Linux), else
    getrusage's ru_maxrss (KiB on Linux)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def heap_policy():
    """"arena" or "segments": the vramguard heap this run used."""
    try:
        from ...torch.state import install_state

        return "segments" if install_state.get("arena") is False else "arena"
    except Exception:
        return "arena"


def card_arch(torch):
    """Whether this PyTorch has kernels for the phantom's card: its compute
    capability (VG_FAKECUDA_CC), the architectures the wheel was built for
    (torch.cuda.get_arch_list(), read without starting CUDA) and PyTorch's
    own test of whether any runs on it. None where PyTorch cannot say."""
    cc = os.environ.get("VG_FAKECUDA_CC", "")
    try:
        major, minor = (int(x) for x in cc.split("."))
        arch_list = list(torch.cuda.get_arch_list())
        code_ccs = [torch.cuda._extract_arch_version(a) for a in arch_list]
        compatible = torch.cuda._code_compatible_with_device
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            runs = any(compatible(10 * major + minor, code) for code in code_ccs)
    except Exception:
        return None
    if not arch_list:
        return None
    return {"capability": cc, "arch_list": arch_list, "runs": bool(runs)}


def cudnn_benchmark_kept_off():
    """How often vramguard turned the script's cudnn.benchmark = True off."""
    module = sys.modules.get("vramguard.torch.cudnn")
    return int(getattr(module, "kept_off", 0) or 0) if module is not None else 0


def compiled():
    """Whether torch.compile ran (TorchDynamo compiled frames), and Triton."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    frames = 0
    if dynamo is not None:
        try:
            counters = dynamo.counters
            frames = sum(counters["frames"].values()) + sum(counters["stats"].values())
        except Exception:
            frames = 0
    return {"torch_compile": bool(frames), "triton": "triton" in sys.modules}


def context_bytes():
    try:
        return int(os.environ.get("VG_FAKECUDA_CONTEXT", "0"))
    except ValueError:
        return None
