"""openai-whisper's load_model of the report's day (--whisper: the package's tree
at that commit) loading a checkpoint file onto the GPU: torch.load(...,
map_location=device) of the whole checkpoint, Whisper(dims) built on the CPU,
load_state_dict, then model.to(device), the checkpoint still held. The checkpoint
is ours, of the released one's layout: {"dims", "model_state_dict"} with every
tensor of Whisper(dims).state_dict() in fp16 (zeros; written into the run's
folder), so torch.load places the same tensors on the GPU in the same order.

Stand-ins for two imports that loading never calls: numba (word timestamps'
kernels) and ffmpeg (reading audio).

    python whisper_load.py --whisper DIR --dims medium
"""
import argparse
import os
import sys
import tempfile
import types

import torch

# ModelDimensions of the released checkpoints (their "dims" entries)
DIMS = {
    "medium": dict(n_mels=80, n_audio_ctx=1500, n_audio_state=1024, n_audio_head=16, n_audio_layer=24,
                   n_vocab=51865, n_text_ctx=448, n_text_state=1024, n_text_head=16, n_text_layer=24),
    "large": dict(n_mels=80, n_audio_ctx=1500, n_audio_state=1280, n_audio_head=20, n_audio_layer=32,
                  n_vocab=51865, n_text_ctx=448, n_text_state=1280, n_text_head=20, n_text_layer=32),
}


def install_stand_ins():
    sys.modules["numba"] = types.SimpleNamespace(jit=lambda *a, **k: (lambda f: f), njit=lambda *a, **k: (lambda f: f))
    sys.modules["ffmpeg"] = types.ModuleType("ffmpeg")


def write_checkpoint(whisper, dims, path):
    # on the CPU: the model's sparse alignment-heads buffer has no meta kernel
    shapes = {name: (t.shape, t.dtype) for name, t in
              whisper.model.Whisper(whisper.model.ModelDimensions(**dims)).state_dict().items()}
    state = {name: torch.zeros(shape, dtype=torch.float16 if dtype.is_floating_point else dtype)
             for name, (shape, dtype) in shapes.items()}
    torch.save({"dims": dims, "model_state_dict": state}, path)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--whisper", required=True, help="the whisper package's tree at the report's commit")
    p.add_argument("--dims", choices=DIMS, required=True)
    p.add_argument("--device", default="cuda")
    a = p.parse_args()
    install_stand_ins()
    sys.path.insert(0, a.whisper)
    import whisper

    folder = os.environ.get("VRAMGUARD_DRYRUN_DIR") or tempfile.mkdtemp()
    path = os.path.join(folder, f"{a.dims}.pt")
    write_checkpoint(whisper, DIMS[a.dims], path)
    try:
        whisper.load_model(path, device=a.device)
    finally:
        os.remove(path)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
