"""GPU presets: budget="T4" and friends, wherever a size is taken.

A preset's total is what CUDA reports for the card (cudaDeviceProp.totalGlobalMem,
which is torch.cuda.get_device_properties(i).total_memory and the "total
capacity" of PyTorch's out-of-memory message), not the marketing figure: a
"16 GB" T4 reports 14.74 GiB. Its usable bytes, the figure a preset stands for,
are that total less CONTEXT_ALLOWANCE for the CUDA context, rounded down to
whole 2 MiB segments: what an allocator can reserve for tensors once the
process runs.
"""
from dataclasses import dataclass

from ._core import SEGMENT_GRANULE

__all__ = ["GpuPreset", "PRESETS", "CONTEXT_ALLOWANCE", "find_preset", "preset_names", "autocast_dtype"]

MiB = 1 << 20

#: Device memory the CUDA context takes before any tensor exists: the
#: driver's per-context state and the kernels loaded into it. About 300 to
#: 400 MiB with PyTorch and CUDA's lazy module loading (CUDA 11.7 and later,
#: as PyTorch's maintainers put it in pytorch/pytorch#107667 and #20532); the
#: top of that range is taken, so that a preset errs on the safe side.
CONTEXT_ALLOWANCE = 400 * MiB


@dataclass(frozen=True)
class GpuPreset:
    """One GPU: `total_bytes` as CUDA reports it, `source` where that number
    was read, and `usable_bytes` for tensors (see the module). The rest is
    what a phantom of the card reports to PyTorch, which picks kernels by it
    (SDPA's backend, cuBLAS's workspace): `cuda_name` (the device name CUDA
    gives), `compute_capability`, `sm_count`, and `vmm` (the driver's virtual
    memory management, which expandable segments and the arena need), and
    `l2_cache_bytes`: Inductor's benchmarks of compiled kernels allocate a
    buffer of the L2's size to flush it, device memory a compiled program's
    peak can hold (0: not known, the phantom's default, an H100's 50 MiB)."""

    name: str
    total_bytes: int
    source: str
    cuda_name: str = ""
    compute_capability: tuple = (0, 0)
    sm_count: int = 0
    vmm: bool = True
    #: what the CUDA context holds on this card: CONTEXT_ALLOWANCE unless
    #: measured on it
    context_bytes: int = CONTEXT_ALLOWANCE
    l2_cache_bytes: int = 0

    @property
    def usable_bytes(self):
        return (self.total_bytes - self.context_bytes) // SEGMENT_GRANULE * SEGMENT_GRANULE

    def __str__(self):
        gib = 1 << 30
        return (f"{self.name}: {self.usable_bytes / gib:.2f} GiB usable "
                f"of {self.total_bytes / gib:.2f} GiB ({self.total_bytes:,} bytes)")




# Totals vary by a few MiB with the driver and ECC setting; each is one
# published reading (deviceQuery prints totalGlobalMem in bytes); a source
# names other readings where they differ by more. The L2 sizes are
# deviceQuery's "L2 Cache Size" line, read from _L2_SOURCES.
PRESETS = {p.name: p for p in (
    GpuPreset("T4", 15_828_320_256,
              "Colab's Tesla T4 (ECC on): torch.cuda.get_device_properties(0).total_memory; PyTorch's "
              "out-of-memory messages on Colab read 14.74 GiB (zai-org/CogVideo#741, 2025) and 14.75 GiB "
              "(googlecolab/colabtools#3439, 2023): a few MiB with the driver; a T4 with ECC off reads "
              "15.75 GiB (tensorflow/tensorrt#169)",
              "Tesla T4", (7, 5), 40, l2_cache_bytes=4_194_304),
    GpuPreset("L4", 23_583_784_960,
              "deviceQuery on an NVIDIA L4, driver 12.2 (bottlerocket-os/bottlerocket-kernel-kit#139)",
              "NVIDIA L4", (8, 9), 58, l2_cache_bytes=50_331_648),
    GpuPreset("A100-40GB", 42_298_834_944,
              "deviceQuery on an NVIDIA A100-SXM4-40GB, driver 12.2 (bottlerocket-os/bottlerocket#3873)",
              "NVIDIA A100-SXM4-40GB", (8, 0), 108, l2_cache_bytes=41_943_040),
    GpuPreset("A100-80GB", 84_987_740_160,
              "deviceQuery on an NVIDIA A100-SXM4-80GB, driver 12.2 (maximilianmbeck/vlstm_cuda, "
              "README.md and CUDA_DEVICES_PROPS.md; driver 12.5 reads 81,158 MiB, thamada/nvidia-smi)",
              "NVIDIA A100-SXM4-80GB", (8, 0), 108, l2_cache_bytes=41_943_040),
    GpuPreset("V100-16GB", 16_945_512_448,
              "deviceQuery on a Tesla V100-SXM2-16GB (16,160 MiB, also PyTorch's "
              "total_memory=16160MB in many public logs)",
              "Tesla V100-SXM2-16GB", (7, 0), 80, l2_cache_bytes=6_291_456),
    GpuPreset("H100-80GB", 85_028_896_768,
              "deviceQuery on an NVIDIA H100 80GB HBM3, driver 12.8 (81,090 MiB; "
              "PyTorch logs read 81,082 to 81,090 MiB, driver 12.7 81,106 MiB in "
              "thamada/nvidia-smi nvsim/H100SXMx8_deviceQuery.py)",
              "NVIDIA H100 80GB HBM3", (9, 0), 132, l2_cache_bytes=52_428_800),
    GpuPreset("RTX-3090", 25_327_697_920,
              "deviceQuery on an NVIDIA GeForce RTX 3090, driver 12.6 (24,154 MiB; "
              "thamada/nvidia-smi gls/RTX3090_deviceQuery.py; drivers 11.8 to 12.2 read "
              "24,238 to 24,268 MiB)",
              "NVIDIA GeForce RTX 3090", (8, 6), 82, l2_cache_bytes=6_291_456),
    GpuPreset("RTX-4090", 25_386_352_640,
              "deviceQuery on an NVIDIA GeForce RTX 4090, driver 12.4, Linux (24,210 MiB; "
              "thamada/nvidia-smi gls/RTX4090_deviceQuery.py)",
              "NVIDIA GeForce RTX 4090", (8, 9), 128, l2_cache_bytes=75_497_472),
    GpuPreset("RTX-3060", 12_587_106_304,
              "deviceQuery on an NVIDIA GeForce RTX 3060 (12 GB), driver 12.4, Ubuntu 24.04 (12,004 MiB; "
              "yeswearecoding/yeswearecoding-src.github.io content/en/posts/20241216_benchmarking-llama_cpp.md; "
              "drivers 12.1 and 12.2 read 12,042 and 12,044 MiB, Windows 12,288)",
              "NVIDIA GeForce RTX 3060", (8, 6), 28, l2_cache_bytes=2_359_296),
    GpuPreset("RTX-4060-Ti-16GB", 16_857_038_848,
              "deviceQuery on an NVIDIA GeForce RTX 4060 Ti (16 GB), driver 12.4 (16,076 MiB; "
              "thamada/nvidia-smi package/RTX4060Ti_deviceQuery.py)",
              "NVIDIA GeForce RTX 4060 Ti", (8, 9), 34, l2_cache_bytes=33_554_432),
    GpuPreset("L40S", 47_576_711_168,
              "deviceQuery on an NVIDIA L40S, driver 12.4 (45,373 MiB; alvarobartt/cuda-device-query "
              "README.md; thamada/nvidia-smi nvsim/L40S_deviceQuery.py reads 45,589 MiB)",
              "NVIDIA L40S", (8, 9), 142, l2_cache_bytes=100_663_296),
    GpuPreset("H200", 150_109_880_320,
              "measured by vramguard's GPU script on an NVIDIA H200, driver 580.159.04, torch "
              "2.11.0+cu130 (bench/results/gpu-h200-2026-11-26); its CUDA context held "
              "552,402,944 bytes after torch.cuda.init()",
              "NVIDIA H200", (9, 0), 132, context_bytes=552_402_944, l2_cache_bytes=62_914_560),
)}

#: Where each preset's L2 cache size was read (deviceQuery's output).
_L2_SOURCES = {
    "T4": "sylvia-ymlin/cuda-kernels-from-scratch README.md",
    "L4": "thamada/nvidia-smi gls/L4_deviceQuery.py",
    "A100-40GB": "samridh-dev/votess#10 (an A100 at a 1215 MHz memory clock, the 40 GB part's)",
    "A100-80GB": "thamada/nvidia-smi gls/A100SXMx4_deviceQuery.py; maximilianmbeck/vlstm_cuda CUDA_DEVICES_PROPS.md",
    "V100-16GB": "thamada/gls gls/V100_x8_deviceQuery.py",
    "H100-80GB": "thamada/nvidia-smi nvsim/H100SXMx8_deviceQuery.py",
    "RTX-3090": "thamada/nvidia-smi gls/RTX3090_deviceQuery.py",
    "RTX-4090": "thamada/nvidia-smi gls/RTX4090_deviceQuery.py",
    "RTX-3060": "lshmouse/ai-playground experimental/cuda_example/README.md",
    "RTX-4060-Ti-16GB": "thamada/nvidia-smi package/RTX4060Ti_deviceQuery.py",
    "L40S": "thamada/nvidia-smi nvsim/L40S_deviceQuery.py",
    "H200": "thamada/gls gls/H200_deviceQuery.py",
}

_BY_KEY = {name.upper(): preset for name, preset in PRESETS.items()}


def preset_names():
    return ", ".join(PRESETS)


#: The first compute capability with bfloat16 tensor cores (Ampere).
BF16_FROM = (8, 0)


def autocast_dtype(capability):
    """The 16-bit dtype torch.autocast should use on a card of this compute
    capability: "bfloat16" from 8.0 on, "float16" before (a T4 is 7.5, a
    V100 7.0: float16, with loss scaling)."""
    return "bfloat16" if tuple(capability or (0, 0)) >= BF16_FROM else "float16"


def find_preset(text):
    """The preset named `text` (any case; '_' or ' ' for '-'), or None."""
    if not isinstance(text, str):
        return None
    key = text.strip().upper().replace("_", "-").replace(" ", "-")
    return _BY_KEY.get(key)
