"""What the rebuilds of diffusers' pipelines stand in with, at the libraries' own API: a
tokenizer whose ids have the real one's shapes, and a module on uninitialised host memory."""
import torch
import transformers


class PaddedIds:
    """A tokenizer stand-in: ids of the shape the real one returns for a short prompt
    (padded to max_length with padding="max_length", a few tokens with "longest")."""

    added_tokens_encoder = {}

    def __init__(self, model_max_length):
        self.model_max_length = model_max_length

    def tokenize(self, text):
        return text.split()

    def __call__(self, prompts, padding="longest", max_length=None, return_tensors="pt", **_):
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        words = max(len(p.split()) for p in prompts) + 2  # with the start and end tokens
        length = max_length if padding == "max_length" else min(words, max_length or words)
        ids = torch.zeros(len(prompts), length, dtype=torch.long)
        return transformers.BatchEncoding({"input_ids": ids, "attention_mask": torch.ones_like(ids)})

    def batch_decode(self, ids, **_):
        return [""] * len(ids)


def on_host(module, dtype):
    """The module built on the meta device, given uninitialised host memory in `dtype`. A
    parameter two modules share (T5's embedding, its encoder's and the model's) stays one, as
    from_pretrained keeps it: moving off the meta device would give each module its own."""
    places = {}
    for owner in module.modules():
        for name, param in owner._parameters.items():
            if param is not None:
                places.setdefault(id(param), []).append((owner, name))
    module = module.to(dtype).to_empty(device="cpu").eval()
    for (first, first_name), *others in places.values():
        for owner, name in others:
            owner._parameters[name] = first._parameters[first_name]
    return module
