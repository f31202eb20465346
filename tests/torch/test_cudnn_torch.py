"""The real PyTorch's cuDNN paths on the fake CUDA with the cuDNN stand-in
(csrc/phantom/cudnn_*.c, build/fakecuda/libcudnn.so.N): convolutions
through the v8 API (cudnn-frontend's heuristics, plans and execute), batch
norm and RNNs through the legacy API, and cuDNN attention through the
frontend's graph API run, with kernels doing nothing, and their workspaces
come from PyTorch's allocator.

Each case runs in a fresh interpreter (test_fakecuda_torch.run). The
stand-in counts the calls that would launch work (vg_phantom_cudnn_calls),
so that a case proves cuDNN ran rather than a fallback; a call it does not
implement prints "... is not implemented" on stderr, which no case here may
produce.
"""
import importlib.util
import textwrap

import pytest

from fakegpu import EPILOGUE, run as run_vramguard
from test_fakecuda_torch import MiB, preload, run, values

# torch_version: runs in the CUDA 12 tier too (docs/development.md)
pytestmark = [pytest.mark.torch, pytest.mark.torch_version]

# After test_fakecuda_torch.PRELUDE: the stand-in's counters.
CUDNN = """
import torch.nn.functional as F
dnn = fake
dnn.vg_phantom_cudnn_calls.argtypes = [ctypes.c_char_p]
dnn.vg_phantom_cudnn_calls.restype = ctypes.c_long
def calls(name):
    return dnn.vg_phantom_cudnn_calls(name.encode())
dnn.vg_phantom_cudnn_unsupported_calls.restype = ctypes.c_long
assert torch.backends.cudnn.is_available() and torch.backends.cudnn.enabled
"""

# Scripts end with os._exit: an autograd worker thread still dropping the
# last graph task while the interpreter finalizes can die in pthread_exit
# ("terminate called without an active exception", SIGABRT), a race of
# PyTorch's at exit that the fake's speed makes likely.
QUICK_EXIT = """
import os
sys.stdout.flush()
os._exit(0)
"""

UNIMPLEMENTED = """
print("unimplemented=%d" % dnn.vg_phantom_cudnn_unsupported_calls())
"""


@pytest.fixture(autouse=True)
def _stand_in_built():
    if "libcudnn" not in preload():
        pytest.skip("the cuDNN stand-in is not built (no cuDNN wheel beside this PyTorch)")


def cudnn_run(code, **env):
    v = values(run(CUDNN + textwrap.dedent(code) + UNIMPLEMENTED + QUICK_EXIT, **env))
    assert v["unimplemented"] == "0"
    return v


def test_conv2d_forward_backward_fp32_bf16_and_channels_last():
    v = cudnn_run("""
        conv = torch.nn.Conv2d(16, 32, 3, padding=1).cuda()
        x = torch.randn(8, 16, 32, 32, device="cuda", requires_grad=True)
        y = conv(x)
        y.sum().backward()
        print("fp32=%s %s %s %s" % (tuple(y.shape), y.dtype, tuple(x.grad.shape), tuple(conv.weight.grad.shape)))
        print("fp32_executes=%d" % calls("cudnnBackendExecute"))
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = conv(x)
        y.float().sum().backward()
        print("bf16=%s" % y.dtype)
        xc = x.detach().to(memory_format=torch.channels_last).requires_grad_()
        conv = conv.to(memory_format=torch.channels_last)
        y = conv(xc)
        y.sum().backward()
        print("channels_last=%s" % y.is_contiguous(memory_format=torch.channels_last))
        print("executes=%d" % calls("cudnnBackendExecute"))
        torch.cuda.synchronize()
    """)
    assert v["fp32"] == "(8, 32, 32, 32) torch.float32 (8, 16, 32, 32) (32, 16, 3, 3)"
    assert int(v["fp32_executes"]) == 3   # forward, backward data, backward filter
    assert v["bf16"] == "torch.bfloat16"
    assert v["channels_last"] == "True"
    assert int(v["executes"]) == 9


def test_batchnorm2d_train_and_eval():
    v = cudnn_run("""
        bn = torch.nn.BatchNorm2d(16).cuda()
        x = torch.randn(4, 16, 8, 8, device="cuda", requires_grad=True)
        y = bn(x)
        y.sum().backward()
        print("train=%d,%d" % (calls("cudnnBatchNormalizationForwardTraining"),
                               calls("cudnnBatchNormalizationBackward")))
        bn.eval()
        with torch.no_grad():
            y = bn(x)
        print("eval=%d %s" % (calls("cudnnBatchNormalizationForwardInference"), tuple(y.shape)))
        bn.train()                                   # channels last: cuDNN's persistent mode
        y = bn(x.detach().to(memory_format=torch.channels_last))
        print("persistent=%d" % calls("cudnnBatchNormalizationForwardTraining"))
    """)
    assert v["train"] == "1,1"
    assert v["eval"] == "1 (4, 16, 8, 8)"
    assert v["persistent"] == "2"


def test_sdpa_cudnn_attention_bf16_forward_backward():
    v = cudnn_run("""
        from torch.nn.attention import sdpa_kernel, SDPBackend
        q, k, v = (torch.randn(2, 4, 128, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            o = F.scaled_dot_product_attention(q, k, v)
            print("forward=%s %s %d" % (tuple(o.shape), o.dtype, calls("cudnnBackendExecute")))
            o.sum().backward()
            print("backward=%s %d" % (tuple(q.grad.shape), calls("cudnnBackendExecute")))
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.125)
            o.sum().backward()
            print("causal_dropout=%d" % calls("cudnnBackendExecute"))
    """)
    assert v["forward"] == "(2, 4, 128, 64) torch.bfloat16 1"
    assert v["backward"] == "(2, 4, 128, 64) 2"
    assert v["causal_dropout"] == "4"


def test_rnns_forward_backward():
    """nn.LSTM (bidirectional, projected, half), nn.GRU, nn.RNN with dropout,
    packed sequences: PyTorch lays its parameters over cuDNN's weight space,
    asserting where each matrix lies, then runs the cuDNN RNN calls."""
    v = cudnn_run("""
        nn = torch.nn
        cases = {"lstm": (nn.LSTM(32, 64, 2, bidirectional=True), False),
                 "lstm_proj": (nn.LSTM(32, 64, 2, proj_size=16), False),
                 "lstm_half": (nn.LSTM(32, 64, 1), True),
                 "gru": (nn.GRU(32, 64, 1, batch_first=True), False),
                 "rnn_dropout": (nn.RNN(32, 64, 2, dropout=0.25), False)}
        for name, (m, half) in cases.items():
            m = m.cuda()
            x = torch.randn(10, 4, 32, device="cuda")
            if half:
                m, x = m.half(), x.half()
            y, _ = m(x.requires_grad_())
            y.float().sum().backward()
            print("%s=%s %s" % (name, tuple(y.shape), tuple(x.grad.shape)))
        packed = nn.utils.rnn.pack_padded_sequence(torch.randn(10, 4, 32, device="cuda"), [10, 8, 5, 3])
        y, _ = nn.LSTM(32, 64).cuda()(packed)
        print("packed=%s" % (tuple(y.data.shape),))
        print("passes=%d,%d,%d" % (calls("cudnnRNNForward"), calls("cudnnRNNBackwardData_v8"),
                                   calls("cudnnRNNBackwardWeights_v8")))
    """)
    assert v["lstm"] == "(10, 4, 128) (10, 4, 32)"
    assert v["lstm_proj"] == "(10, 4, 16) (10, 4, 32)"
    assert v["lstm_half"] == "(10, 4, 64) (10, 4, 32)"
    assert v["gru"] == "(10, 4, 64) (10, 4, 32)"
    assert v["rnn_dropout"] == "(10, 4, 64) (10, 4, 32)"
    assert v["packed"] == "(26, 64)"
    assert v["passes"] == "6,5,5"


def test_workspace_knob_reaches_pytorchs_allocator():
    """A plan's workspace is what PyTorch allocates around cudnnBackendExecute:
    with VG_PHANTOM_CUDNN_WORKSPACE=64MiB the convolution's peak is 64 MiB
    higher than with the default 0, to the byte."""
    code = """
        conv = torch.nn.Conv2d(8, 8, 3, padding=1).cuda()
        x = torch.randn(2, 8, 16, 16, device="cuda")
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        y = conv(x)
        print("peak=%d" % (torch.cuda.max_memory_allocated() - base))
    """
    none = cudnn_run(code)
    some = cudnn_run(code, VG_PHANTOM_CUDNN_WORKSPACE="64MiB")
    assert int(some["peak"]) - int(none["peak"]) == 64 * MiB


def test_resnet18_training_step():
    """torchvision's resnet18, one SGD step: 20 convolutions (forward 20,
    backward data 19 (the image needs no gradient), backward filter 20) and
    20 batch norms on cuDNN; in fp32, because under bf16 autocast batch norm
    gets bf16 inputs with fp32 weights, which PyTorch (and so a real GPU)
    runs without cuDNN."""
    if importlib.util.find_spec("torchvision") is None:
        pytest.skip("torchvision is not installed")
    v = cudnn_run("""
        import torchvision
        model = torchvision.models.resnet18(weights=None).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(4, 3, 64, 64, device="cuda")
        model(x).sum().backward()
        opt.step()
        print("executes=%d" % calls("cudnnBackendExecute"))
        print("bn=%d,%d" % (calls("cudnnBatchNormalizationForwardTraining"),
                            calls("cudnnBatchNormalizationBackward")))
    """)
    assert v["executes"] == "59"
    assert v["bn"] == "20,20"


def test_under_vramguards_allocator():
    """The same paths with vramguard installed: cuDNN's outputs and the plans'
    workspaces (1 MiB each here) come from vramguard's heap."""
    out = run_vramguard("""
        vramguard.install(budget="256MiB")
        conv = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.BatchNorm2d(16)).cuda()
        x = torch.randn(4, 3, 32, 32, device="cuda", requires_grad=True)
        conv(x).sum().backward()
        torch.cuda.synchronize()
        out["grad"] = list(x.grad.shape)
        out["allocated"] = [torch.cuda.memory_allocated(), heap()["allocated_bytes.all.current"]]
        out["ever_allocated"] = heap()["allocated_bytes.all.allocated"]
        out["executes"] = fake.vg_phantom_cudnn_calls(b"cudnnBackendExecute")
    """, EPILOGUE, QUICK_EXIT, VG_PHANTOM_CUDNN_WORKSPACE="1MiB")
    assert out["grad"] == [4, 3, 32, 32]
    assert out["allocated"][0] == out["allocated"][1] > 0
    assert out["executes"] == 3           # forward, backward data, backward filter
    assert out["ever_allocated"] >= 3 * MiB
