"""No module imports another's private name: a name with a leading
underscore is its own module's business. What another module needs has a
public name (torch/state.py's install state, the device-heap accessors of
torch/install.py). Read from the source with ast, as test_layers.py reads
the imports; a module whose name starts with an underscore (_core, _presets)
is a module, not a private name."""
import ast

from test_layers import PACKAGE, _targets, modules


def _origin(name, is_package, node):
    if not node.level:
        return node.module or ""
    base = name.split(".") if is_package else name.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def private_imports(package=PACKAGE):
    """["module imports origin._name"] for every private name imported from another vramguard module."""
    known = modules(package)
    found = []
    for name, (path, is_package) in sorted(known.items()):
        if path is None:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if not isinstance(node, ast.ImportFrom) or not _targets(name, is_package, node, known):
                continue
            origin = _origin(name, is_package, node)
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                if private and f"{origin}.{alias.name}" not in known:
                    found.append(f"{name} imports {origin}.{alias.name}")
    return found


def test_no_module_imports_a_private_name_of_another():
    assert private_imports() == []


def test_the_check_sees_a_private_import(tmp_path):
    pkg = tmp_path / "vramguard"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("_secret = 1\n")
    (pkg / "b.py").write_text("from .a import _secret\nfrom . import a as _a\n")
    (pkg / "_mod.py").write_text("")
    (pkg / "c.py").write_text("from . import _mod\n")
    assert private_imports(pkg) == ["vramguard.b imports vramguard.a._secret"]
