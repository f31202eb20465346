"""The standard remedies for an out-of-memory, applied from outside to the
user's unchanged program in a dry run's child (dryrun --remedies; the
parent's side is remedies.py), and what the program does of its own:

- autocast: the whole program under torch.autocast("cuda", dtype), set as
  the default of the main thread and of the threads the program starts
  (torch.set_autocast_enabled/dtype), with the cast cache off: a default
  that never exits would keep every cast weight; the program's own autocast
  regions keep their own settings;
- checkpoint: activation checkpointing at each model's first forward: a
  Hugging Face model through its own activation_checkpointing_enable()
  (gradient_checkpointing_enable() before transformers 5), any other
  nn.Module through PyTorch's checkpoint wrapper on its repeated blocks
  (the members of a ModuleList or Sequential of two or more modules of one
  class that have modules of their own: the outermost such);
- optimizer: torch.optim.Adam and AdamW, as the program builds them,
  replaced by bitsandbytes' 8-bit Adam/AdamW ("8bit") or built with
  fused=True ("fused": no foreach temporaries).

Each records whether it applied and, where not, why: the parent's table
says so. REMEDIES_ENV (contract.py) holds the remedies, comma-separated:
"autocast:float16", "autocast:bfloat16", "checkpoint", "optimizer:8bit",
"optimizer:fused"; "autocast:float16@regions" runs only the program's own
autocast regions whose dtype is full width (float32) in float16, and sets
no default: the change a program with such a region needs.
"""
import functools
import sys
import traceback
import weakref

KINDS = ("autocast", "checkpoint", "optimizer")


def parse(spec):
    """{"autocast": "float16", "checkpoint": True, ...} from the env's text."""
    out = {}
    for item in filter(None, (s.strip() for s in (spec or "").split(","))):
        kind, _, arg = item.partition(":")
        if kind not in KINDS:
            raise ValueError(f"unknown remedy {item!r}")
        out[kind] = arg or True
    return out


class Observed:
    """What the program does of its own, recorded in every run of a dry
    run with remedies (and applied to, where asked)."""

    def __init__(self):
        self.autocast_regions = 0      # the program's own enabled CUDA autocast regions in a 16-bit dtype
        self.full_width = None         # ... and those in a full-width dtype (float32): {"line", "dtype", "regions"}
        self.autocast_off_regions = 0  # and those that turn it off (torch.autocast(..., enabled=False))
        self.models = []               # per top-level model at its first forward: what it is
        self.trainer = False           # a first forward from Hugging Face's Trainer
        self.checkpoint = None         # the checkpoint remedy's record
        self.autocast = None           # the autocast remedy's record
        self.optimizer = None          # the optimizer remedy's record
        self.optimizers_built = []     # torch Adam/AdamW built by the remedy (their class names)
        self.optimizer_classes = []    # every optimizer the program built, by class name, first seen first
        self.optimizer_site = None     # where the program built its first Adam or AdamW: {"file", "line", "class"}

    def figures(self):
        return {"program_autocast_regions": self.autocast_regions, "program_full_width_autocast": self.full_width,
                "program_autocast_off_regions": self.autocast_off_regions, "models": self.models,
                "trainer": self.trainer, "applied": {k: v for k, v in (("autocast", self.autocast),
                                                                        ("checkpoint", self.checkpoint),
                                                                        ("optimizer", self.optimizer)) if v},
                "adam_built": self.optimizers_built, "optimizer_classes": self.optimizer_classes,
                "optimizer_site": self.optimizer_site}


def _outside_site_packages(filename):
    return not any(part in filename for part in ("site-packages", "dist-packages", "<frozen"))


def install(torch, spec, is_user_file=_outside_site_packages, show_file=lambda name: name):
    """Watch the program and apply the remedies `spec` names; returns the
    Observed record the child reads into its result. is_user_file(name):
    whether a source file is the program's own (not a library's);
    show_file(name): the file as the report names it."""
    remedies = parse(spec)
    seen = Observed()
    half = remedies.get("autocast")
    regions_only = isinstance(half, str) and half.endswith("@regions")
    half = half[:-len("@regions")] if regions_only else half
    _watch_autocast(torch, seen, is_user_file, show_file, half)
    _watch_optimizer_classes(torch, seen, is_user_file)
    _watch_models(torch, seen, remedies.get("checkpoint"), is_user_file)
    _watch_optimizers(torch, seen, remedies.get("optimizer"))
    if half and regions_only:  # applied where the program enters one of its float32 regions
        seen.autocast = {"applied": False, "why": "the program entered none of its own autocast regions in float32"}
    elif half:
        _autocast_everywhere(torch, seen, half)
    return seen


# ---------------------------------------------------------------- autocast

def _is_compiling(torch):
    compiler = getattr(torch, "compiler", None)
    return getattr(compiler, "is_compiling", None) or (lambda: False)


#: Autocast dtypes a card computes at full width: a region in one of them is
#: no mixed precision, whatever torch.autocast says (a config's float32).
FULL_WIDTH = ("float32", "float64")


def _watch_autocast(torch, seen, is_user_file, show_file, half=None):
    """Counts the program's own CUDA autocast regions: in a 16-bit dtype,
    off, or in a full-width dtype (its first line named). With the
    autocast remedy (`half`, a dtype's name), a full-width region of the
    program's runs in `half` instead: the region the remedy is about."""
    cls = torch.amp.autocast_mode.autocast
    original = cls.__enter__
    if getattr(original, "_vramguard_watch", False):
        return

    users = {}  # file name -> whether it is the user's

    def caller():
        frame = sys._getframe(2)
        name = frame.f_code.co_filename
        if name not in users:
            users[name] = is_user_file(name)
        return users[name], f"{show_file(name)}:{frame.f_lineno}"

    compiling = _is_compiling(torch)
    half_dtype = getattr(torch, str(half), None) if half else None
    original_init = cls.__init__

    @functools.wraps(original_init)
    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        frame = sys._getframe(1)  # the program's own line that built it (`ctx = torch.autocast(...)`)
        while frame is not None and not is_user_file(frame.f_code.co_filename):
            frame = frame.f_back
        if frame is not None:
            self._vramguard_made_at = f"{show_file(frame.f_code.co_filename)}:{frame.f_lineno}"

    @functools.wraps(original)
    def __enter__(self):
        if not compiling() and getattr(self, "device", None) == "cuda":
            dtype = str(getattr(self, "fast_dtype", "")).replace("torch.", "")
            if getattr(self, "_enabled", False) and dtype in FULL_WIDTH:
                mine, line = caller()
                if mine:
                    _full_width_region(seen, line, dtype, getattr(self, "_vramguard_made_at", None))
                    if isinstance(half_dtype, torch.dtype):
                        self.fast_dtype = half_dtype
                        if not (seen.autocast or {}).get("applied"):
                            seen.autocast = {"applied": True, "dtype": str(half), "where": "the program's regions"}
            elif getattr(self, "_enabled", False):
                seen.autocast_regions += 1
            elif caller()[0]:  # a library's own fp32 region (Llama's rotary embedding) is not the program's
                seen.autocast_off_regions += 1
        return original(self)

    __enter__._vramguard_watch = True
    cls.__enter__ = __enter__
    cls.__init__ = __init__


def _full_width_region(seen, line, dtype, made_at):
    """The first full-width region entered: the line that enters it, the line
    that built it (a config's `ctx = torch.autocast(..., dtype=ptdtype)`, entered
    elsewhere), its dtype; and how often the program entered one."""
    if seen.full_width is None:
        seen.full_width = {"line": line, "made_at": made_at or line, "dtype": dtype, "regions": 0}
    seen.full_width["regions"] += 1


def _autocast_everywhere(torch, seen, dtype_name):
    dtype = getattr(torch, str(dtype_name), None)
    if not isinstance(dtype, torch.dtype):
        seen.autocast = {"applied": False, "why": f"no dtype {dtype_name!r} in this PyTorch"}
        return
    try:
        torch.set_autocast_enabled("cuda", True)
        torch.set_autocast_dtype("cuda", dtype)
        torch.set_autocast_cache_enabled(False)
    except (AttributeError, TypeError, RuntimeError) as exc:  # before torch 2.4: no per-device setters
        seen.autocast = {"applied": False, "why": f"this PyTorch cannot set autocast's default ({exc})"}
        return
    _in_new_threads(torch, dtype)
    seen.autocast = {"applied": True, "dtype": str(dtype_name)}  # the program's full-width regions: full_width


def _in_new_threads(torch, dtype):
    """Autocast's state is per thread: the threads the program starts (a
    training loop on one, as some frameworks and notebook tools run it) get
    the same default. PyTorch's autograd threads run the backward, which
    autocast does not touch."""
    import threading

    original = threading.Thread.run
    if getattr(original, "_vramguard_autocast", False):
        return

    @functools.wraps(original)
    def run(self):
        torch.set_autocast_enabled("cuda", True)
        torch.set_autocast_dtype("cuda", dtype)
        torch.set_autocast_cache_enabled(False)
        return original(self)

    run._vramguard_autocast = True
    threading.Thread.run = run


# ---------------------------------------------------------------- checkpointing

def _hf_model(module):
    """The Hugging Face model in `module` (itself, or the one a wrapper such
    as peft's holds), or None."""
    for m in module.modules():
        if hasattr(m, "supports_gradient_checkpointing") and (
                hasattr(m, "activation_checkpointing_enable") or hasattr(m, "gradient_checkpointing_enable")):
            return m
    return None


def _hf_checkpointing_on(model):
    return any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())


def _repeated_blocks(torch, root):
    """The outermost ModuleList or Sequential whose members (two or more) are
    all of one class that has modules of its own: their members, and the
    class name; ([], None) when there is none."""
    nn = torch.nn
    blocks, names = [], set()
    inside = set()
    for m in root.modules():
        if id(m) in inside:
            continue
        if isinstance(m, (nn.ModuleList, nn.Sequential)):
            kids = list(m.children())
            kinds = {type(k) for k in kids}
            if len(kids) >= 2 and len(kinds) == 1 and any(True for _ in kids[0].children()):
                blocks += kids
                names.add(type(kids[0]).__name__)
                for k in kids:
                    inside.update(id(x) for x in k.modules())
    return blocks, ", ".join(sorted(names)) or None


def _already_wrapped(root):
    return any(type(m).__name__ == "CheckpointWrapper" for m in root.modules())


def _checkpoint_model(torch, module, seen):
    hf = _hf_model(module)
    if hf is not None:
        name = type(hf).__name__
        if not hf.supports_gradient_checkpointing:
            return {"applied": False, "model": name, "how": "huggingface",
                    "why": f"{name} does not support gradient checkpointing (supports_gradient_checkpointing is False)"}
        if _hf_checkpointing_on(hf):
            return {"applied": False, "model": name, "how": "huggingface", "already": True,
                    "why": "the program already turns it on"}
        method = ("activation_checkpointing_enable" if hasattr(hf, "activation_checkpointing_enable")
                  else "gradient_checkpointing_enable")
        try:
            getattr(hf, method)()
        except Exception as exc:  # a model that refuses it
            return {"applied": False, "model": name, "how": "huggingface",
                    "why": f"{name}.{method}() failed: {type(exc).__name__}: {exc}"}
        return {"applied": True, "model": name, "how": "huggingface", "method": method}
    name = type(getattr(module, "_orig_mod", module)).__name__  # a compiled module's own class
    if _already_wrapped(module):
        return {"applied": False, "model": name, "how": "wrapper", "already": True,
                "why": "the program already wraps blocks in PyTorch's checkpoint wrapper"}
    blocks, block_class = _repeated_blocks(torch, module)
    if not blocks:
        return {"applied": False, "model": name, "how": "wrapper",
                "why": f"no repeated blocks in {name} (a ModuleList or Sequential of two or more "
                       "modules of one class, each with modules of its own)"}
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper)

    ids = {id(b) for b in blocks}
    apply_activation_checkpointing(
        module, checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
        check_fn=lambda m: id(m) in ids)
    return {"applied": True, "model": name, "how": "wrapper", "blocks": len(blocks), "block_class": block_class,
            "block_sites": [_block_site(c) for c in dict.fromkeys(type(b) for b in blocks)]}


def _from_trainer():
    return any("/transformers/trainer" in f.filename for f in traceback.extract_stack())


def _watch_models(torch, seen, checkpoint, is_user_file=_outside_site_packages):
    """At each model's first forward (the outermost module called that no
    earlier one contains): what it is; and the checkpoint remedy at its
    first forward in training (an evaluation may come first)."""
    observed, outermost, tried = weakref.WeakSet(), weakref.WeakSet(), weakref.WeakSet()
    compiling = _is_compiling(torch)

    def first_forward(module, args):
        # Dynamo traces global hooks into the graphs it builds: this one's
        # bookkeeping is not for tracing (is_compiling() reads True there,
        # and the rest is left out); the compiled module's own call, eager,
        # has done it
        if compiling():
            return None
        if module not in observed:
            observed.update(module.modules())
            outermost.add(module)
            _observe(module, seen, is_user_file)
        # a model: a module first called from outside any other (its blocks are not models)
        if checkpoint and module in outermost and module not in tried and module.training and any(
                p.requires_grad for p in module.parameters()):
            tried.update(module.modules())
            record = _checkpoint_model(torch, module, seen)
            # the first trained model's record, unless a later one's applied where it did not
            if seen.checkpoint.get("untrained") or (record.get("applied") and not seen.checkpoint.get("applied")):
                seen.checkpoint = record
        return None

    torch.nn.modules.module.register_module_forward_pre_hook(first_forward)
    if checkpoint:
        seen.checkpoint = {"applied": False, "untrained": True,
                           "why": "no model was trained (no forward of a module in training mode with parameters "
                                  "that need gradients)"}


def _observe(module, seen, is_user_file):
    if not seen.trainer and _from_trainer():
        seen.trainer = True
    hf = _hf_model(module)
    seen.models.append({"class": type(module).__name__, "huggingface": hf is not None,
                        "checkpointing": bool(hf is not None and _hf_checkpointing_on(hf)) or _already_wrapped(module),
                        "site": _model_site(module, is_user_file)})


def _model_site(module, is_user_file):
    """Where the program holds the model it first calls: the outermost of the
    program's own frames on the stack with a variable bound to it (the
    function that made it and runs the loop, or the script's top level), its
    line there and the variable's name; None when no frame of the
    program's names it. What a patch that changes the model is written at."""
    site = None
    frame = sys._getframe(2)
    while frame is not None:
        if is_user_file(frame.f_code.co_filename):
            for name, value in list(frame.f_locals.items()):
                if value is module or getattr(value, "_orig_mod", None) is module:
                    site = {"file": frame.f_code.co_filename, "line": frame.f_lineno, "name": name}
                    break
        frame = frame.f_back
    return site


def _block_site(block_class_object):
    """A block class as a patch names it: its module (None where it is the
    script's own) and its name."""
    module = getattr(block_class_object, "__module__", None)
    return {"module": None if module == "__main__" else module, "name": block_class_object.__qualname__}


# ---------------------------------------------------------------- the optimizer

def _watch_optimizer_classes(torch, seen, is_user_file=_outside_site_packages):
    """Every optimizer's class as it is built (bitsandbytes' too: each calls
    torch.optim.Optimizer.__init__), whether or not it ever steps; and where
    the program built its first Adam or AdamW (a patch's place)."""
    base = torch.optim.Optimizer
    original = base.__init__
    if getattr(original, "_vramguard_watch", False):
        return

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        name = type(self).__name__
        if name not in seen.optimizer_classes:
            seen.optimizer_classes.append(name)
        if seen.optimizer_site is None and name in ("Adam", "AdamW"):
            seen.optimizer_site = _first_user_frame(is_user_file, name)
        return original(self, *args, **kwargs)

    __init__._vramguard_watch = True
    base.__init__ = __init__


def _first_user_frame(is_user_file, what):
    frame = sys._getframe(2)
    while frame is not None and not is_user_file(frame.f_code.co_filename):
        frame = frame.f_back
    return {"file": frame.f_code.co_filename, "line": frame.f_lineno, "class": what} if frame is not None else None


def _bnb_class(name):
    try:
        import bitsandbytes as bnb
    except Exception as exc:  # not installed, or its library does not load
        return None, f"bitsandbytes is not usable here ({type(exc).__name__}: {exc})"
    cls = getattr(bnb.optim, name + "8bit", None)
    return cls, None if cls is not None else f"bitsandbytes has no {name}8bit"


def _stand_in(torch, original, seen, how):
    """torch.optim.Adam or AdamW as the program finds it: building one
    builds the remedy's optimizer instead. isinstance() with it still
    answers for torch's own class (a library's check of the optimizer)."""
    name = original.__name__

    class StandInType(type(original)):
        def __instancecheck__(cls, obj):
            return isinstance(obj, original)

        def __subclasscheck__(cls, sub):
            return issubclass(sub, original)

    class StandIn(original, metaclass=StandInType):
        def __new__(cls, params, *args, **kwargs):
            if cls is not StandIn:  # a program's own subclass: left as it is
                return original.__new__(cls)
            seen.optimizers_built.append(name)
            return _build(original, name, params, args, kwargs, seen, how)

    StandIn.__name__ = StandIn.__qualname__ = name
    StandIn.__module__ = original.__module__
    return StandIn


def _build(original, name, params, args, kwargs, seen, how):
    params = list(params)  # a generator is read once: the fallback needs it again
    if how == "fused":
        try:
            opt = original(params, *args, **dict(kwargs, fused=True, foreach=False))
        except (RuntimeError, ValueError, TypeError) as exc:  # parameters fused cannot take
            seen.optimizer = {"applied": False, "why": f"{name}(fused=True) refused: {exc}"}
            return original(params, *args, **kwargs)
        seen.optimizer = {"applied": True, "to": f"torch.optim.{name}(fused=True)", "from": name}
        return opt
    replacement, why = _bnb_class(name)
    if replacement is None:
        seen.optimizer = {"applied": False, "why": why}
        return original(params, *args, **kwargs)
    seen.optimizer = {"applied": True, "to": f"bitsandbytes.optim.{replacement.__name__}", "from": name}
    return replacement(params, **_adam_kwargs(original, args, kwargs))


def _adam_kwargs(original, args, kwargs):
    """lr, betas, eps and weight_decay as the program gave them (by position
    or name): what bitsandbytes' Adam takes of torch's."""
    import inspect

    try:
        bound = inspect.signature(original.__init__).bind_partial(None, None, *args, **kwargs)
    except TypeError:
        bound = None
    given = dict(bound.arguments) if bound else dict(kwargs)
    return {k: given[k] for k in ("lr", "betas", "eps", "weight_decay") if k in given}


def _watch_optimizers(torch, seen, how):
    if not how:
        return
    for name in ("Adam", "AdamW"):
        original = getattr(torch.optim, name, None)
        if original is not None:
            setattr(torch.optim, name, _stand_in(torch, original, seen, how))
    seen.optimizer = {"applied": False, "why": "the program built no torch.optim.Adam or AdamW"}
