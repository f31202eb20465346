"""`dryrun --no-weights`: Hugging Face models loaded from a stand-in of their
checkpoint (vramguard.dryrun.features.weightless): the real safetensors headers, the
data a hole. The stand-in's files and headers, a Hub id served through
huggingface_hub's own metadata types, a folder with no safetensors refused,
and dry runs whose figures equal those of the real load."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.torch

torch = transformers = safetensors_torch = None


@pytest.fixture(autouse=True)
def _libraries():
    """Imported when a test runs, not when the file is collected: where
    PyTorch is not installed, `import torch` would find tests/torch (a
    folder on sys.path) and leave a module of that name behind."""
    global torch, transformers, safetensors_torch
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    safetensors_torch = pytest.importorskip("safetensors.torch")

from test_dryrun import _env  # noqa: E402  (the dry run's environment, shared)

from vramguard.dryrun.features import weightless  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30


def _tiny_llama(folder, layers=2):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=1000, hidden_size=128, intermediate_size=344,
                                   num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4)
    transformers.LlamaForCausalLM(cfg).to(torch.float16).save_pretrained(folder)
    return folder


def _disk_bytes(folder):
    return sum(os.stat(os.path.join(root, f)).st_blocks * 512
               for root, _, files in os.walk(folder) for f in files)


# ------------------------------------------------------------------ the files

def test_a_sparse_safetensors_file_has_the_real_header_and_no_data_on_disk(tmp_path):
    header = weightless.header_from_tensors({"w": (torch.float16, (4096, 11008)), "b": (torch.float32, (7,))})
    path = tmp_path / "m.safetensors"
    weightless.write_sparse_safetensors(path, header)
    assert weightless.read_safetensors_header(path) == header
    assert header["w"]["data_offsets"] == [0, 4096 * 11008 * 2]
    assert header["b"]["data_offsets"] == [4096 * 11008 * 2, 4096 * 11008 * 2 + 28]
    size = path.stat().st_size
    assert size >= 4096 * 11008 * 2 + 28 and path.stat().st_blocks * 512 < 64 * 1024
    # safetensors' own reader takes it, and reads the hole as zeros
    with safetensors_torch.safe_open(str(path), framework="pt") as f:
        w = f.get_tensor("w")
        assert w.shape == (4096, 11008) and w.dtype == torch.float16 and not w.any()
        assert f.get_tensor("b").shape == (7,)


def test_a_local_folder_stand_in_copies_small_files_and_leaves_other_weights_out(tmp_path):
    src = _tiny_llama(tmp_path / "model")
    (src / "tokenizer.json").write_text('{"version": "1.0"}')
    (src / "pytorch_model.bin").write_bytes(b"\0" * 4096)
    folder = Path(weightless.standin_folder(str(src), str(tmp_path / "cache")))
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "generation_config.json",
                                                        "model.safetensors", "tokenizer.json"]
    assert (folder / "config.json").read_text() == (src / "config.json").read_text()
    real = weightless.read_safetensors_header(src / "model.safetensors")
    assert weightless.read_safetensors_header(folder / "model.safetensors") == real
    assert (folder / "model.safetensors").stat().st_size == (src / "model.safetensors").stat().st_size
    assert _disk_bytes(folder) < 64 * 1024
    # made once: a second call reuses it
    assert weightless.standin_folder(str(src), str(tmp_path / "cache")) == str(folder)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [folder.name]


def test_a_folder_without_safetensors_is_refused_in_one_line(tmp_path):
    src = tmp_path / "old"
    src.mkdir()
    (src / "config.json").write_text("{}")
    (src / "pytorch_model.bin").write_bytes(b"\0" * 64)
    with pytest.raises(weightless.WeightlessError, match="has no safetensors files") as info:
        weightless.standin_folder(str(src), str(tmp_path / "cache"))
    assert "\n" not in str(info.value)
    assert not any((tmp_path / "cache").iterdir())  # nothing half-made left behind


def test_a_file_that_is_not_safetensors_is_refused(tmp_path):
    bad = tmp_path / "model.safetensors"
    bad.write_bytes((1 << 40).to_bytes(8, "little"))
    with pytest.raises(weightless.WeightlessError, match="not a safetensors file"):
        weightless.read_safetensors_header(bad)
    bad.write_bytes(b"\x05")
    with pytest.raises(weightless.WeightlessError, match="shorter than"):
        weightless.read_safetensors_header(bad)


def test_a_hub_id_is_stood_in_for_from_its_headers_alone(tmp_path, monkeypatch):
    """The Hub's answers, in huggingface_hub's own types, served from a local
    checkpoint: the stand-in has its small files and the same headers, and
    no weight file was downloaded."""
    hub = pytest.importorskip("huggingface_hub")
    from huggingface_hub.utils import SafetensorsFileMetadata, SafetensorsRepoMetadata, TensorInfo

    src = _tiny_llama(tmp_path / "served")
    (src / "pytorch_model.bin").write_bytes(b"\0" * 64)
    real = weightless.read_safetensors_header(src / "model.safetensors")
    downloaded = []

    def list_repo_files(self, repo_id, revision=None, **kw):
        assert repo_id == "someone/tiny-llama"
        return sorted(p.name for p in src.iterdir())

    def get_safetensors_metadata(self, repo_id, revision=None, **kw):
        tensors = {k: TensorInfo(dtype=v["dtype"], shape=v["shape"], data_offsets=tuple(v["data_offsets"]))
                   for k, v in real.items() if k != "__metadata__"}
        files = {"model.safetensors": SafetensorsFileMetadata(metadata=real["__metadata__"], tensors=tensors)}
        return SafetensorsRepoMetadata(metadata=None, sharded=False, files_metadata=files,
                                       weight_map={k: "model.safetensors" for k in tensors})

    def hf_hub_download(repo_id, filename, revision=None, token=None, **kw):
        downloaded.append(filename)
        return str(src / filename)

    monkeypatch.setattr(hub.HfApi, "list_repo_files", list_repo_files)
    monkeypatch.setattr(hub.HfApi, "get_safetensors_metadata", get_safetensors_metadata)
    monkeypatch.setattr(hub, "hf_hub_download", hf_hub_download)
    folder = Path(weightless.standin_folder("someone/tiny-llama", str(tmp_path / "cache")))
    assert sorted(downloaded) == ["config.json", "generation_config.json"]
    assert weightless.read_safetensors_header(folder / "model.safetensors") == real
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder))
    assert sum(p.numel() for p in model.parameters()) == sum(
        p.numel() for p in transformers.AutoModelForCausalLM.from_pretrained(str(src)).parameters())


def test_a_model_config_becomes_a_checkpoint_of_its_shapes(tmp_path):
    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                                   num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32)
    folder = weightless.sparse_checkpoint_from_config(cfg, str(tmp_path / "llama7b"), dtype=torch.float16)
    index = json.loads((Path(folder) / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert files == [f"model-{i:05d}-of-00007.safetensors" for i in range(1, 8)]  # 13.5 GB in shards of 2 GiB
    tensors = {}
    for name in files:
        header = weightless.read_safetensors_header(os.path.join(folder, name))
        assert os.path.getsize(os.path.join(folder, name)) <= weightless.SHARD_BYTES + (1 << 20)
        tensors.update((k, v) for k, v in header.items() if k != "__metadata__")
        assert all(index["weight_map"][k] == name for k in header if k != "__metadata__")
    assert set(tensors) == set(index["weight_map"])
    params = sum(int(torch.Size(v["shape"]).numel()) for v in tensors.values())
    assert params == 6_738_415_616  # Llama-2-7B's parameter count
    assert index["metadata"]["total_size"] == params * 2
    assert {v["dtype"] for v in tensors.values()} == {"F16"}
    assert _disk_bytes(folder) < 1 << 20


def test_a_small_model_config_is_one_file(tmp_path):
    cfg = transformers.LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=4)
    folder = Path(weightless.sparse_checkpoint_from_config(cfg, str(tmp_path / "tiny")))
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]


# ------------------------------------------------------------------ dry runs

LOAD = """
    import sys, torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float16).cuda()
    ids = torch.randint(0, 1000, (2, 32), device="cuda")
    model(ids).logits.float().sum().backward()
"""


def _dryrun(tmp_path, name, *args):
    script = tmp_path / "load.py"
    script.write_text(textwrap.dedent(LOAD))
    cmd = [sys.executable, "-m", "vramguard", "dryrun", "--json", "--quiet", "--no-snapshot",
           "--out", str(tmp_path / name), *args, str(script)]
    return cmd


def _run(cmd, tmp_path, extra_args):
    proc = subprocess.run(cmd + extra_args, capture_output=True, text=True, cwd=tmp_path, env=_env(),
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.torch_version
def test_a_dry_run_without_weights_measures_what_the_real_load_does(tmp_path):
    src = _tiny_llama(tmp_path / "model")
    common = ["--gpu", "T4", "--allocator", "native,vramguard"]
    real = _run(_dryrun(tmp_path, "real", *common), tmp_path, [str(src)])
    stood = _run(_dryrun(tmp_path, "stood", *common, "--no-weights"), tmp_path, [str(src)])
    for allocator in ("native", "vramguard"):
        for key in ("peak_allocated_bytes", "peak_reserved_bytes"):
            assert stood[allocator][key] == real[allocator][key] > 0, (allocator, key)
        assert real[allocator]["weightless_loads"] is None
        (load,) = stood[allocator]["weightless_loads"]
        assert load["source"] == str(src) and load["tensors"] == 21
    from vramguard.dryrun import format_report

    assert (f"Weights not loaded (--no-weights): {src} (21 tensors) loaded from a stand-in of the checkpoint"
            in format_report(stood))
    assert "--no-weights" not in format_report(real)


def test_no_weights_with_no_hugging_face_load_says_so(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text("import torch\nx = torch.empty(1 << 20, device='cuda')\n")
    proc = subprocess.run([sys.executable, "-m", "vramguard", "dryrun", "--quiet", "--no-snapshot", "--memory",
                           "2GiB", "--allocator", "vramguard", "--no-weights", "--out", str(tmp_path / "o"),
                           str(script)], capture_output=True, text=True, cwd=tmp_path, env=_env(), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ("--no-weights was given, but the script loaded no model through Hugging Face's from_pretrained"
            in proc.stdout)


def test_a_7b_model_loads_without_its_weights_in_little_host_memory(tmp_path):
    """Llama-2-7B's shapes in fp16 (13.5 GB of weights): loaded onto a phantom
    A100 from a stand-in made of its config alone, the dry run's whole output
    folder a few hundred kilobytes and its host memory under 2 GiB."""
    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                                   num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32)
    folder = weightless.sparse_checkpoint_from_config(cfg, str(tmp_path / "llama7b"), dtype=torch.float16)
    script = tmp_path / "load7b.py"
    script.write_text(textwrap.dedent("""
        import sys, torch
        from transformers import AutoModelForCausalLM
        AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float16, device_map="cuda")
    """))
    out = _run([sys.executable, "-m", "vramguard", "dryrun", "--json", "--quiet", "--no-snapshot", "--gpu",
                "A100-80GB", "--allocator", "vramguard", "--no-weights", "--out", str(tmp_path / "o"),
                str(script)], tmp_path, [folder])
    run = out["vramguard"]
    # every parameter in fp16, and the rotary embedding's two buffers (inv_freq and its
    # original: 64 fp32 each, one 512-byte block each), which are not in the checkpoint
    assert run["peak_allocated_bytes"] == 6_738_415_616 * 2 + 2 * 512
    assert out["host_peak_rss_bytes"] < 2 * GiB
    assert _disk_bytes(tmp_path / "o") + _disk_bytes(folder) < 50 * 10**6
