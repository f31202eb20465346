"""A package of a program's own folders, made without running its __init__.py:
the rebuilds import a program's model files, and an __init__ that imports the
rest of the program (its UI, its data tools) would need what they never use."""
import sys
import types

__all__ = ["bare_package"]


def bare_package(name, folders):
    """`name` as a package whose modules are found in `folders` (a relative import
    resolves among them), in sys.modules; the existing one where there is one."""
    if name not in sys.modules:
        package = types.ModuleType(name)
        package.__path__ = list(folders)
        sys.modules[name] = package
    return sys.modules[name]
