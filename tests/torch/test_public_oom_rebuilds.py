"""The public reports' rebuild scripts (bench/public_ooms/rebuild/): the parts of
them that stand in for something (a checkpoint's files, a package's import, a
program's resize, .cuda()'s moves), each held to what it stands in for."""
import json
import os
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.torch

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "public_ooms" / "rebuild"))
import accelerate_dispatch  # noqa: E402
import model_code_to_cuda  # noqa: E402
import sam_u_specify  # noqa: E402


@pytest.mark.parametrize("height, width, fitted", [
    (1450, 2068, (897, 1280)),   # the bear: the long side to the limit, the short one truncated
    (2068, 1450, (1280, 897)),   # the same image standing
    (1280, 1280, (1280, 1280)),  # at the limit: untouched
    (720, 960, (720, 960)),      # under it: untouched
    (1281, 100, (1280, 99)),
])
def test_the_program_resize_to_its_max_input_size(height, width, fitted):
    assert sam_u_specify.fitted(height, width, 1280) == fitted


class Masked(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 8)
        self.b = torch.nn.Linear(8, 2, bias=False)
        self.register_buffer("mask", torch.ones(3, 3, dtype=torch.uint8))


def two_shards(state):
    """transformers' shard_checkpoint's contract: ({file: {name: tensor}}, index)."""
    names = list(state)
    shards = {"pytorch_model-00001-of-00002.bin": {n: state[n] for n in names[:2]},
              "pytorch_model-00002-of-00002.bin": {n: state[n] for n in names[2:]}}
    return shards, {"weight_map": {n: f for f, shard in shards.items() for n in shard}}


def test_a_checkpoint_stand_in_gives_each_shard_its_tensors_in_the_state_dict_order(tmp_path):
    contents = accelerate_dispatch.write_index(Masked(), str(tmp_path), torch.float16, two_shards)
    index = json.loads((tmp_path / "pytorch_model.bin.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == sorted(os.listdir(tmp_path))[:2]
    assert all((tmp_path / f).stat().st_size == 0 for f in index["weight_map"].values())
    sentinel = object()
    load = accelerate_dispatch.load_stand_in(contents, lambda *a, **k: sentinel)
    first = load(str(tmp_path / "pytorch_model-00001-of-00002.bin"))
    second = load(tmp_path / "pytorch_model-00002-of-00002.bin")
    assert list(first) + list(second) == list(Masked().state_dict())  # a module's own buffer first
    loaded = dict(first, **second)
    assert loaded["mask"].dtype == torch.uint8 and loaded["mask"].shape == (3, 3)  # not floating: as it is
    assert {loaded[n].dtype for n in ("a.weight", "a.bias", "b.weight")} == {torch.float16}  # the saved dtype
    assert loaded["b.weight"].shape == (2, 8)
    assert load(str(tmp_path / "elsewhere.bin")) is sentinel  # any other file: the real torch.load


def test_a_one_file_checkpoint_gets_an_index_of_its_own(tmp_path):
    def one_file(state):
        return {"pytorch_model.bin": dict(state)}, None

    contents = accelerate_dispatch.write_index(Masked(), str(tmp_path), torch.float32, one_file)
    index = json.loads((tmp_path / "pytorch_model.bin.index.json").read_text())
    assert set(index["weight_map"].values()) == {"pytorch_model.bin"}
    assert len(next(iter(contents.values()))) == 4


def test_a_modeling_file_importing_its_config_relatively_loads_as_a_package(tmp_path):
    code, config = tmp_path / "code", tmp_path / "config"
    code.mkdir()
    config.mkdir()
    (config / "configuration_t.py").write_text("class TConfig:\n    def __init__(self, n=3):\n        self.n = n\n")
    (code / "modeling_t.py").write_text(
        "import torch\nfrom .configuration_t import TConfig\n\n"
        "class TModel(torch.nn.Module):\n    def __init__(self, config: TConfig):\n"
        "        super().__init__()\n        self.w = torch.nn.Linear(config.n, config.n)\n")
    folders = [str(code), str(config)]
    config_class = model_code_to_cuda.code_class(folders, "pkg_rebuild_t", "configuration_t", "TConfig")
    model_class = model_code_to_cuda.code_class(folders, "pkg_rebuild_t", "modeling_t", "TModel")
    assert model_class(config_class(n=5)).w.weight.shape == (5, 5)
    with pytest.raises(ImportError):  # the same file off a package: its relative import has no parent
        model_code_to_cuda.code_class([str(code)], None, "modeling_t", "TModel")


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(1024, 256)
        self.body = torch.nn.Linear(256, 256)
        self.head = torch.nn.Linear(256, 1024, bias=False)
        self.head.weight = self.embed.weight


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a (phantom) GPU")
@pytest.mark.parametrize("built_on", ["meta", "cpu"])
def test_a_tied_weight_moves_once_as_cuda_moves_it(built_on):
    with torch.device(built_on):
        model = Tied()
    before = torch.cuda.memory_allocated()
    model_code_to_cuda.move_as_cuda_does(model, torch.float16)
    moved = torch.cuda.memory_allocated() - before
    assert model.head.weight.is_cuda and model.head.weight.data_ptr() == model.embed.weight.data_ptr()
    # the embedding once (1024 x 256), the body's weight and bias, in fp16, each rounded to 512 bytes
    assert moved == 2 * (1024 * 256 + 256 * 256) + 512
    del model
    reference = Tied().to(torch.float16)
    before = torch.cuda.memory_allocated()
    reference.cuda()  # what the helper stands in for
    assert torch.cuda.memory_allocated() - before == moved
    del reference
