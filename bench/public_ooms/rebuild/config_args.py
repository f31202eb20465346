"""A model's published config given on the command line as key=value
pairs: each value read as a Python literal (4096, 1e-6, True, None, a
list), else kept as the text (a name such as "silu")."""
import ast

__all__ = ["config_kwargs"]


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
