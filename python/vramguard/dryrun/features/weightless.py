"""Models without their weights: `dryrun --no-weights`.

A phantom GPU drops every copy into its memory, so the values of a
checkpoint's tensors never matter to a dry run; only their names, shapes and
dtypes do. Under --no-weights, Hugging Face's `from_pretrained` (a model's
class or an Auto class) loads from a *stand-in* of the checkpoint instead of
the checkpoint: its small files (config.json, generation_config.json, the
shard index, remote code) as they are, and each safetensors file with its
real header and its data left as a hole of the same length (a sparse file:
a few kilobytes on disk whatever the model's size, read back as zeros).
Loading then makes every allocation it would make (quantization at load
included: bitsandbytes' 4-bit and 8-bit run as they would), without reading
13 GB of a 7B model into host memory or downloading them.

Where the checkpoint comes from:
- a local folder: the headers are read from its safetensors files;
- a Hub id: config and small files are fetched, and the safetensors headers
  by range requests (huggingface_hub.get_safetensors_metadata), nothing else.

A checkpoint with no safetensors files (only pickled .bin files) cannot be
stood in for without reading it: that load is refused with one line saying so.
Stand-ins are made once per dry run, in its output folder, and shared by its
runs (made in a temporary folder, then renamed into place).
"""
import json
import os
import re
import shutil
import struct
import tempfile

from ..._files import write_atomically
from ..contract import NO_WEIGHTS_ENV
from .base import Feature

#: Set by the dry run under --no-weights for its runs: the folder where stand-ins are made.

__all__ = ["NO_WEIGHTS_ENV", "WeightlessLoads", "write_sparse_safetensors", "sparse_checkpoint_from_config", "standin_folder"]

#: Files that hold weights: never copied, never downloaded.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".onnx",
                   ".pkl", ".npz", ".ot")
#: A small file larger than this is not a config: refused rather than copied.
SMALL_FILE_LIMIT = 64 << 20
#: Headers larger than this are refused (safetensors' own limit is 100 MB).
HEADER_LIMIT = 100 << 20

_TORCH_TO_SAFETENSORS = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
    "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
}


class WeightlessError(Exception):
    """A checkpoint that cannot be stood in for; one line says why."""


# ------------------------------------------------------------------ sparse files

def write_sparse_safetensors(path, header):
    """Write a safetensors file at `path` with `header` (the parsed JSON
    header: {name: {"dtype", "shape", "data_offsets"}, "__metadata__": ...})
    and its data region left as a hole: the file has its full length and
    reads as zeros, and takes a few kilobytes on disk."""
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the writer's alignment: data starts 8-aligned
    end = max((int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"), default=0)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        f.truncate(8 + len(encoded) + end)


def read_safetensors_header(path):
    """The parsed JSON header of a safetensors file; WeightlessError when it is not one."""
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise WeightlessError(f"{path}: not a safetensors file (shorter than its header's length)")
            (length,) = struct.unpack("<Q", raw)
            if length > HEADER_LIMIT:
                raise WeightlessError(f"{path}: not a safetensors file (a header of {length} bytes)")
            header = json.loads(f.read(length))
    except (OSError, ValueError) as exc:
        raise WeightlessError(f"{path}: cannot read its safetensors header ({exc})") from None
    if not isinstance(header, dict):
        raise WeightlessError(f"{path}: not a safetensors file (its header is not a JSON object)")
    return header


def header_from_tensors(tensors, metadata=None):
    """A safetensors header for {name: (dtype name, shape)} in that order,
    tensors laid out one after another as safetensors' writer lays them."""
    import math

    header = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        code = _TORCH_TO_SAFETENSORS.get(str(dtype).replace("torch.", ""))
        if code is None:
            raise WeightlessError(f"{name}: dtype {dtype} has no safetensors code")
        nbytes = math.prod(shape) * _itemsize(code)
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    return header


def _itemsize(code):
    return {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "F16": 2, "BF16": 2, "I16": 2}.get(code, 1)


#: The largest shard sparse_checkpoint_from_config writes: loading maps each
#: file whole, and a host refuses to map one much larger than its memory
#: (a 12.8B model's 25.8 GB in one file, on 24 GiB), sparse or not.
SHARD_BYTES = 2 << 30


def sparse_checkpoint_from_config(config, folder, dtype=None, shard_bytes=SHARD_BYTES, model_class=None):
    """A stand-in checkpoint of a Hugging Face model that never had weights:
    the model built from `config` on the meta device (no memory), its state
    dict's names, shapes and dtypes written as a sparse model.safetensors
    (or, past `shard_bytes`, shards of at most that much, each tensor whole,
    and model.safetensors.index.json, as Hugging Face shards a checkpoint),
    with config.json beside it. `dtype` (a torch dtype) overrides the
    parameters' dtype, as a released checkpoint in fp16 or bf16 has it.
    `model_class`: the transformers class whose from_config builds it
    (default AutoModelForCausalLM). Returns `folder`."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = (model_class or AutoModelForCausalLM).from_config(config)
    tensors = {}
    for name, tensor in model.state_dict().items():
        wanted = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
        tensors[name] = (wanted, tuple(tensor.shape))
    os.makedirs(folder, exist_ok=True)
    config.save_pretrained(folder)
    shards = _shards(tensors, shard_bytes)
    if len(shards) == 1:
        write_sparse_safetensors(os.path.join(folder, "model.safetensors"), header_from_tensors(tensors))
        return folder
    weight_map, total = {}, 0
    for number, shard in enumerate(shards, 1):
        name = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        write_sparse_safetensors(os.path.join(folder, name), header_from_tensors(shard))
        weight_map.update(dict.fromkeys(shard, name))
        total += sum(_nbytes(*spec) for spec in shard.values())
    write_atomically(os.path.join(folder, "model.safetensors.index.json"),
                     json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
    return folder


def _nbytes(dtype, shape):
    import math

    return math.prod(shape) * _itemsize(_TORCH_TO_SAFETENSORS.get(str(dtype).replace("torch.", ""), "U8"))


def _shards(tensors, shard_bytes):
    """{name: (dtype, shape)} cut, in order, into dicts of at most
    `shard_bytes` each (a tensor larger than that alone in its own)."""
    shards, size = [{}], 0
    for name, spec in tensors.items():
        nbytes = _nbytes(*spec)
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = spec
        size += nbytes
    return shards


# ------------------------------------------------------------------ stand-ins

def _is_weight_file(name):
    return name.endswith(WEIGHT_SUFFIXES)


def _standin_local(source, target):
    """Fill `target` with a stand-in of the local folder `source`."""
    count = 0
    for root, dirs, files in os.walk(source):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        rel = os.path.relpath(root, source)
        os.makedirs(os.path.join(target, rel), exist_ok=True)
        for name in files:
            src = os.path.join(root, name)
            dst = os.path.join(target, rel, name)
            if name.endswith(".safetensors"):
                write_sparse_safetensors(dst, read_safetensors_header(src))
                count += 1
            elif not _is_weight_file(name) and os.path.getsize(src) <= SMALL_FILE_LIMIT:
                shutil.copyfile(src, dst)
    if not count:
        raise WeightlessError(f"{source} has no safetensors files: --no-weights stands in only for safetensors "
                              "checkpoints (a pickled .bin checkpoint would have to be read); load it without "
                              "--no-weights")


def _standin_hub(repo_id, target, revision=None, token=None):
    """Fill `target` with a stand-in of the Hub model `repo_id`: its small
    files downloaded, its safetensors files from their headers alone."""
    try:
        from huggingface_hub import HfApi, hf_hub_download
    except ImportError:
        raise WeightlessError("huggingface_hub is not installed: a Hub id cannot be stood in for") from None
    api = HfApi(token=token)
    try:
        files = api.list_repo_files(repo_id, revision=revision)
        meta = api.get_safetensors_metadata(repo_id, revision=revision)
    except Exception as exc:  # network, a private repo, a repo with no safetensors
        raise WeightlessError(f"{repo_id}: its safetensors headers could not be read from the Hub "
                              f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None
    for name in files:
        if _is_weight_file(name):
            continue
        path = hf_hub_download(repo_id, name, revision=revision, token=token)
        os.makedirs(os.path.dirname(os.path.join(target, name)) or target, exist_ok=True)
        shutil.copyfile(path, os.path.join(target, name))
    for name, info in meta.files_metadata.items():
        header = {"__metadata__": dict(info.metadata or {})}
        for tname, t in info.tensors.items():
            header[tname] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": list(t.data_offsets)}
        os.makedirs(os.path.dirname(os.path.join(target, name)) or target, exist_ok=True)
        write_sparse_safetensors(os.path.join(target, name), header)


def standin_folder(name_or_path, cache_dir, *, revision=None, token=None):
    """The folder of a stand-in for `name_or_path` (a local folder or a Hub
    id) under `cache_dir`, made on first use."""
    local = os.path.isdir(name_or_path)
    source = os.path.realpath(name_or_path) if local else str(name_or_path)
    key = re.sub(r"[^A-Za-z0-9._-]+", "--", source.strip("/"))[-150:]
    if revision and not local:
        key += "@" + re.sub(r"[^A-Za-z0-9._-]+", "-", str(revision))
    target = os.path.join(cache_dir, key)
    if os.path.isdir(target):
        return target
    os.makedirs(cache_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".making-", dir=cache_dir)
    try:
        if local:
            _standin_local(source, tmp)
        else:
            _standin_hub(source, tmp, revision=revision, token=token)
        try:
            os.rename(tmp, target)
        except OSError:  # another run made it first: theirs is the same
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


# ------------------------------------------------------------------ the loads

class WeightlessLoads:
    """Hugging Face's from_pretrained, redirected to stand-ins made under
    `cache_dir`; `loads` lists what was loaded so (for the report)."""

    def __init__(self, cache_dir):
        self.cache_dir = os.path.abspath(cache_dir)
        self.loads = []

    def redirect(self, name_or_path, kwargs):
        """The stand-in's folder for a from_pretrained call's first argument
        (its hub keywords read, and `subfolder` applied), or the argument
        itself when it is already a stand-in."""
        if name_or_path is None:
            return None
        path = os.fspath(name_or_path)
        if os.path.abspath(path).startswith(self.cache_dir + os.sep):
            return path
        subfolder = kwargs.pop("subfolder", None) or ""
        source = os.path.join(path, subfolder) if (subfolder and os.path.isdir(path)) else path
        if subfolder and not os.path.isdir(path):
            kwargs["subfolder"] = subfolder  # a Hub subfolder: its files sit under it in the stand-in
        folder = standin_folder(source, self.cache_dir, revision=kwargs.get("revision"), token=kwargs.get("token"))
        self.loads.append({"source": path + (f"/{subfolder}" if subfolder else ""), "standin": folder,
                           "tensors": _count_tensors(folder)})
        # The stand-in is a local folder: no Hub revision or download applies to it.
        for key in ("revision", "force_download"):
            kwargs.pop(key, None)
        return folder

    def install(self):
        """Patch transformers' from_pretrained (models' and Auto classes');
        False when transformers is not installed."""
        try:
            from transformers import modeling_utils
            from transformers.models.auto import auto_factory
        except ImportError:
            return False
        for owner in (modeling_utils.PreTrainedModel, auto_factory._BaseAutoModelClass):
            self._patch(owner)
        return True

    def _patch(self, owner):
        original = owner.__dict__["from_pretrained"].__func__
        loads = self

        def from_pretrained(cls, pretrained_model_name_or_path=None, *args, **kwargs):
            try:
                folder = loads.redirect(pretrained_model_name_or_path, kwargs)
            except WeightlessError as exc:
                raise WeightlessError(f"--no-weights: {exc}") from None
            return original(cls, folder, *args, **kwargs)

        from_pretrained.__doc__ = original.__doc__
        from_pretrained.__wrapped__ = original
        owner.from_pretrained = classmethod(from_pretrained)


def _count_tensors(folder):
    n = 0
    for root, _, files in os.walk(folder):
        for name in files:
            if name.endswith(".safetensors"):
                n += sum(1 for k in read_safetensors_header(os.path.join(root, name)) if k != "__metadata__")
    return n


# ------------------------------------------------------------------ the report

def weightless_notes(weights, runs):
    """The report's lines on --no-weights: which checkpoints were stood in
    for, or that the option was given and nothing loaded through it."""
    if weights:
        return []
    from ...render.words import count

    loads = {}
    for run in runs:
        for load in run.get("weightless_loads") or ():
            loads.setdefault(load["source"], load["tensors"])
    if not loads:
        return ["--no-weights was given, but the script loaded no model through Hugging Face's "
                "from_pretrained: every figure is the program's as written."]
    names = "; ".join(f"{source} ({count(n, 'tensor')})" for source, n in loads.items())
    return [f"Weights not loaded (--no-weights): {names} loaded from a stand-in of the checkpoint (the "
            "same tensors' names, shapes and dtypes, read as zeros): the memory figures are the real "
            "load's; values computed from the weights are not."]


class _Weightless(Feature):
    name = "weightless"

    def env(self, options):
        return {} if options.weights else {NO_WEIGHTS_ENV: os.path.join(options.out_dir, "weightless")}

    def install(self, run):
        if not os.environ.get(NO_WEIGHTS_ENV):
            return None
        loads = WeightlessLoads(os.environ[NO_WEIGHTS_ENV])
        loads.install()
        return loads

    def figures(self, loads, run):
        return {"weightless_loads": loads.loads if loads is not None else None}

    def notes(self, result, runs):
        return weightless_notes(result.get("weights", True), runs)


FEATURE = _Weightless()
