"""The package's version, here so that the modules that need it (the OOM
shim's cache key, torch/hooks.py) need not import the package itself."""
__version__ = "0.1.0"
