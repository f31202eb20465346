"""A library's module patched right after it runs: the dry run's child
installs its adjustments before the script, which may import the library
later (or never). One finder on sys.meta_path per caller, for the names it
asks; modules already imported are patched at once."""
import importlib.abc
import sys


def patch_after_import(names, patch):
    """patch(name) for each of `names` (in their order) already imported,
    and for each of the others right after it runs."""
    for name in names:
        if name in sys.modules:
            patch(name)
    sys.meta_path.insert(0, _AfterImport(frozenset(names), patch))


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, names, patch):
        self.names, self.patch = names, patch

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.names:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _Loader(spec.loader, self.patch)
                return spec
        return None


class _Loader(importlib.abc.Loader):
    def __init__(self, loader, patch):
        self.loader, self.patch = loader, patch

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.patch(module.__name__)
