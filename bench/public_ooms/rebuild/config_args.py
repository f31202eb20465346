"""A model's published config given on the command line as key=value
pairs: each value read as a Python literal (4096, 1e-6, True, None, a
list), else kept as the text (a name such as "silu"); and the dtypes the
scripts take by name."""
import ast

import torch

__all__ = ["DTYPES", "config_kwargs"]

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def config_kwargs(pairs):
    """{key: value} of ["key=value", ...]."""
    kwargs = {}
    for pair in pairs:
        key, _, text = pair.partition("=")
        try:
            kwargs[key] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            kwargs[key] = text
    return kwargs
