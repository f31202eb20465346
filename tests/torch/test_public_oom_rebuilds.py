"""The public reports' rebuild scripts (bench/public_ooms/rebuild/): the parts of
them that stand in for something (a checkpoint's files, a package's import, a
program's resize, .cuda()'s moves, from_pretrained's dtypes, a read-back), each
held to what it stands in for."""
import importlib
import json
import os
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.torch

REBUILD = Path(__file__).resolve().parents[2] / "bench" / "public_ooms" / "rebuild"
torch = accelerate_dispatch = model_code_to_cuda = sam_u_specify = dreambooth = standins = None


@pytest.fixture(autouse=True)
def _libraries():
    """Imported when a test runs, not when the file is collected: where
    PyTorch is not installed, `import torch` would find tests/torch (a
    folder on sys.path) and leave a module of that name behind."""
    global torch, accelerate_dispatch, model_code_to_cuda, sam_u_specify, dreambooth, standins
    torch = pytest.importorskip("torch")
    if str(REBUILD) not in sys.path:
        sys.path.insert(0, str(REBUILD))
    accelerate_dispatch = importlib.import_module("accelerate_dispatch")
    model_code_to_cuda = importlib.import_module("model_code_to_cuda")
    sam_u_specify = importlib.import_module("sam_u_specify")
    dreambooth = importlib.import_module("dreambooth")  # diffusers only where a run needs it
    standins = importlib.import_module("standins")


@pytest.mark.parametrize("height, width, fitted", [
    (1450, 2068, (897, 1280)),   # the bear: the long side to the limit, the short one truncated
    (2068, 1450, (1280, 897)),   # the same image standing
    (1280, 1280, (1280, 1280)),  # at the limit: untouched
    (720, 960, (720, 960)),      # under it: untouched
    (1281, 100, (1280, 99)),
])
def test_the_program_resize_to_its_max_input_size(height, width, fitted):
    assert sam_u_specify.fitted(height, width, 1280) == fitted


def masked_model():
    """Two linear layers and a uint8 buffer, as GPT-NeoX's causal masks are."""
    model = torch.nn.Module()
    model.register_buffer("mask", torch.ones(3, 3, dtype=torch.uint8))
    model.a = torch.nn.Linear(4, 8)
    model.b = torch.nn.Linear(8, 2, bias=False)
    return model


def two_shards(state):
    """transformers' shard_checkpoint's contract: ({file: {name: tensor}}, index)."""
    names = list(state)
    shards = {"pytorch_model-00001-of-00002.bin": {n: state[n] for n in names[:2]},
              "pytorch_model-00002-of-00002.bin": {n: state[n] for n in names[2:]}}
    return shards, {"weight_map": {n: f for f, shard in shards.items() for n in shard}}


def test_a_checkpoint_stand_in_gives_each_shard_its_tensors_in_the_state_dict_order(tmp_path):
    contents = accelerate_dispatch.write_index(masked_model(), str(tmp_path), torch.float16, two_shards)
    index = json.loads((tmp_path / "pytorch_model.bin.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == sorted(os.listdir(tmp_path))[:2]
    assert all((tmp_path / f).stat().st_size == 0 for f in index["weight_map"].values())
    sentinel = object()
    load = accelerate_dispatch.load_stand_in(contents, lambda *a, **k: sentinel)
    first = load(str(tmp_path / "pytorch_model-00001-of-00002.bin"))
    second = load(tmp_path / "pytorch_model-00002-of-00002.bin")
    assert list(first) + list(second) == list(masked_model().state_dict())  # a module's own buffer first
    loaded = dict(first, **second)
    assert loaded["mask"].dtype == torch.uint8 and loaded["mask"].shape == (3, 3)  # not floating: as it is
    assert {loaded[n].dtype for n in ("a.weight", "a.bias", "b.weight")} == {torch.float16}  # the saved dtype
    assert loaded["b.weight"].shape == (2, 8)
    assert load(str(tmp_path / "elsewhere.bin")) is sentinel  # any other file: the real torch.load


def test_a_one_file_checkpoint_has_no_index_as_save_pretrained_writes_none(tmp_path):
    def one_file(state):
        return {"pytorch_model.bin": dict(state)}, None

    contents = accelerate_dispatch.write_index(masked_model(), str(tmp_path), torch.float32, one_file)
    assert os.listdir(tmp_path) == ["pytorch_model.bin"]
    assert [name for name, _, _ in contents[os.path.realpath(tmp_path / "pytorch_model.bin")]] == \
        list(masked_model().state_dict())


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


def tied_model():
    """An output layer tied to the input embeddings."""
    model = torch.nn.Module()
    model.embed = torch.nn.Embedding(1024, 256)
    model.body = torch.nn.Linear(256, 256)
    model.head = torch.nn.Linear(256, 1024, bias=False)
    model.head.weight = model.embed.weight
    return model


@pytest.mark.parametrize("built_on", ["meta", "cpu"])
def test_a_tied_weight_moves_once_as_cuda_moves_it(built_on):
    if not torch.cuda.is_available():
        pytest.skip("needs a (phantom) GPU")
    with torch.device(built_on):
        model = tied_model()
    before = torch.cuda.memory_allocated()
    model_code_to_cuda.move_as_cuda_does(model, torch.float16)
    moved = torch.cuda.memory_allocated() - before
    assert model.head.weight.is_cuda and model.head.weight.data_ptr() == model.embed.weight.data_ptr()
    # the embedding once (1024 x 256), the body's weight and bias, in fp16, each rounded to 512 bytes
    assert moved == 2 * (1024 * 256 + 256 * 256) + 512
    del model
    reference = tied_model().to(torch.float16)
    before = torch.cuda.memory_allocated()
    reference.cuda()  # what the helper stands in for
    assert torch.cuda.memory_allocated() - before == moved
    del reference


def test_a_buffer_two_modules_hold_moves_twice_as_cuda_moves_it():
    if not torch.cuda.is_available():
        pytest.skip("needs a (phantom) GPU")

    def shared_buffer():
        model = torch.nn.Module()
        model.a, model.b = torch.nn.Module(), torch.nn.Module()
        table = torch.zeros(1024, 256, dtype=torch.float16)
        model.a.register_buffer("table", table)
        model.b.register_buffer("table", table)
        return model

    before = torch.cuda.memory_allocated()
    reference = shared_buffer().cuda()
    by_cuda = torch.cuda.memory_allocated() - before
    model = model_code_to_cuda.move_as_cuda_does(shared_buffer(), torch.float16)
    assert torch.cuda.memory_allocated() - before - by_cuda == by_cuda == 2 * 1024 * 256 * 2
    del model, reference


def tiny_t5():
    import transformers

    return transformers.T5Config(vocab_size=32, d_model=8, d_kv=4, d_ff=16, num_layers=2, num_heads=2)


def dtypes(module):
    return {name: p.dtype for name, p in module.named_parameters()}


@pytest.mark.parametrize("torch_dtype", [None, "float16", "bfloat16"])
def test_a_component_stand_in_has_the_dtypes_from_pretrained_gives(tmp_path, torch_dtype):
    """T5 loaded with float16 keeps its feed-forward outputs (wo) in fp32, as transformers' own
    from_pretrained does; without a dtype, an fp32 checkpoint loads in fp32."""
    import transformers

    transformers.T5EncoderModel(tiny_t5()).save_pretrained(tmp_path)
    kwargs = {"torch_dtype": getattr(torch, torch_dtype)} if torch_dtype else {}
    real = transformers.T5EncoderModel.from_pretrained(tmp_path, **kwargs)
    stand_in = standins.built({"text_encoder_3": (lambda: transformers.T5EncoderModel(tiny_t5()), None)})
    built = stand_in.__func__(transformers.T5EncoderModel, str(tmp_path), **kwargs)
    assert dtypes(built) == dtypes(real)
    if torch_dtype == "float16":
        assert {d for n, d in dtypes(built).items() if ".wo." in n} == {torch.float32}


def test_a_component_the_script_moves_with_a_dtype_is_built_in_that_dtype():
    make = (lambda: torch.nn.Linear(4, 4), torch.bfloat16)
    stand_in = standins.built({"vae": make}).__func__
    assert {p.dtype for p in stand_in(object, "root", subfolder="vae").parameters()} == {torch.bfloat16}
    # a pipeline's load names its dtype: that one
    assert {p.dtype for p in stand_in(object, "root/vae", torch_dtype=torch.float16).parameters()} == {torch.float16}


def test_two_components_of_one_class_are_told_apart_by_their_subfolder_or_path():
    stand_in = standins.built({"text_encoder": (lambda: torch.nn.Linear(2, 3), None),
                                 "text_encoder_2": (lambda: torch.nn.Linear(5, 7), None)}).__func__
    assert stand_in(object, "root", subfolder="text_encoder_2").weight.shape == (7, 5)
    assert stand_in(object, "root/text_encoder/").weight.shape == (3, 2)
    assert stand_in(object, "root", subfolder="text_encoder").weight.device.type == "cpu"


@pytest.mark.parametrize("args, mixed", [(["--mixed_precision=fp16", "--seed=0"], "fp16"),
                                         (["--seed=0", "--mixed_precision", "bf16"], "bf16"), (["--seed=0"], "no")])
def test_the_scripts_mixed_precision_is_read_as_accelerate_reads_it(args, mixed):
    assert standins.mixed_precision(args) == mixed


def test_an_empty_nonzero_of_a_phantom_tensor_answers_index_0(monkeypatch):
    """On the phantom a comparison reads zeros back, so a search with nonzero() finds nothing;
    the stand-in answers index 0 there, and leaves every other nonzero() as it was."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (the phantom's preload is not in this process)")
    monkeypatch.setattr(torch.Tensor, "nonzero", torch.Tensor.nonzero)  # restored after the test
    schedule = torch.arange(4, device="cuda")
    assert (schedule == 2).nonzero().numel() == 0  # what the phantom reads back
    answered = dreambooth.first_index_for_empty_nonzero()
    assert (schedule == 2).nonzero().tolist() == [[0]] and answered == [1]
    assert (torch.arange(4) == 2).nonzero().tolist() == [[2]]  # the host's: its own answer
    assert len((schedule == 2).nonzero(as_tuple=True)[0]) == 0 and answered == [1]
    assert torch.zeros(0, device="cuda").nonzero().shape == (0, 1) and answered == [1]  # nothing to answer


@pytest.mark.parametrize("tie_word_embeddings", [True, False])
def test_a_parameter_two_modules_share_stays_one_on_the_host(tie_word_embeddings):
    """T5's encoder shares the model's embedding whatever tie_word_embeddings says (T5-XXL's says
    false): one tensor, as from_pretrained leaves it, not two."""
    import transformers

    config = tiny_t5()
    config.tie_word_embeddings = tie_word_embeddings
    with torch.device("meta"):
        model = transformers.T5EncoderModel(config)
    shared = model.shared.weight is model.encoder.embed_tokens.weight
    host = standins.on_host(model, torch.float16)
    assert (host.shared.weight is host.encoder.embed_tokens.weight) is shared
    assert host.shared.weight.device.type == "cpu" and host.shared.weight.dtype == torch.float16
    assert len(list(host.parameters())) == len({id(p) for p in host.parameters()})


def test_the_sdxl_datasets_images_sit_in_a_split_folder_with_their_captions(tmp_path):
    """datasets reads an image folder's metadata.jsonl only beside a split's files: the images
    and their "text" captions go under train/, each image RGB of the size asked."""
    from PIL import Image

    sdxl_lora = importlib.import_module("sdxl_lora")
    folder = sdxl_lora.image_folder(str(tmp_path), 3, 48)
    train = os.path.join(folder, "train")
    lines = [json.loads(line) for line in open(os.path.join(train, "metadata.jsonl"))]
    assert [line["file_name"] for line in lines] == ["0.png", "1.png", "2.png"]
    assert all(line["text"] for line in lines)
    assert sorted(os.listdir(folder)) == ["train"]
    for line in lines:
        with Image.open(os.path.join(train, line["file_name"])) as image:
            assert (image.mode, image.size) == ("RGB", (48, 48))



def test_a_sparse_flow_checkpoint_loads_as_the_published_file_does(tmp_path):
    """flux_reference_load.py's stand-in for FLUX.1's checkpoint: laid out as
    safetensors' save_file lays out a file (by dtype, then by name), so
    load_file reads the module's own names, shapes and dtypes back in the order
    it reads the real file's, all zeros, and load_state_dict takes them
    strictly with assign=True, so every parameter is a tensor the load made."""
    flux_reference_load = importlib.import_module("flux_reference_load")
    from safetensors.torch import load_file, save_file

    with torch.device("meta"):
        module = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.LayerNorm(6), torch.nn.Linear(6, 2))
    module = module.to(torch.bfloat16)
    module[1].float()  # two dtypes: the writer's order is by dtype first
    path = flux_reference_load.sparse_checkpoint(module, str(tmp_path / "flow.sft"))
    sd = load_file(path)
    want = {name: (t.shape, t.dtype) for name, t in module.state_dict().items()}
    assert {name: (t.shape, t.dtype) for name, t in sd.items()} == want
    written = tmp_path / "written.sft"
    save_file({name: torch.zeros(t.shape, dtype=t.dtype) for name, t in module.state_dict().items()}, str(written))
    from vramguard.dryrun.features.weightless import read_safetensors_header

    def layout(file):  # each tensor's place in the file
        return {k: v["data_offsets"] for k, v in read_safetensors_header(file).items() if k != "__metadata__"}

    assert layout(path) == layout(written)
    assert list(sd) == list(load_file(str(written)))
    assert all(not t.any() for t in sd.values())
    module.load_state_dict(sd, strict=True, assign=True)
    assert all(p.data_ptr() == sd[name].data_ptr() for name, p in module.state_dict().items())


def test_the_reference_encoders_tokenizer_stand_in_pads_to_the_asked_length():
    """HFEmbedder pads to max_length: the stand-in's ids have that length."""
    flux_reference_load = importlib.import_module("flux_reference_load")
    tok = flux_reference_load.tokenizer_standin(None, "google/t5-v1_1-xxl", max_length=256)
    ids = tok(["a cat"], truncation=True, max_length=256, padding="max_length", return_tensors="pt")["input_ids"]
    assert tuple(ids.shape) == (1, 256)
