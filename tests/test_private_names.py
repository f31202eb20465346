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


def private_attributes(package=PACKAGE):
    """["module reads origin._name"] for every private name read through
    another vramguard module bound by an import (`from ..torch import
    install as _torch; _torch._x`)."""
    known = modules(package)
    found = []
    for name, (path, is_package) in sorted(known.items()):
        if path is None:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        bound = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                origin = _origin(name, is_package, node)
                bound.update({a.asname or a.name: f"{origin}.{a.name}" for a in node.names
                              if f"{origin}.{a.name}" in known})
            elif isinstance(node, ast.Import):
                bound.update({a.asname: a.name for a in node.names if a.asname and a.name in known})
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
                module = bound[node.value.id]
                private = node.attr.startswith("_") and not node.attr.startswith("__")
                if private and module != name and f"{module}.{node.attr}" not in known:
                    found.append(f"{name} reads {module}.{node.attr}")
    return sorted(set(found))


def test_no_module_imports_a_private_name_of_another():
    assert private_imports() == []


def test_no_module_reads_a_private_name_of_another():
    assert private_attributes() == []


def test_the_check_sees_a_private_import(tmp_path):
    pkg = tmp_path / "vramguard"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("_secret = 1\n")
    (pkg / "b.py").write_text("from .a import _secret\nfrom . import a as _a\n")
    (pkg / "_mod.py").write_text("")
    (pkg / "c.py").write_text("from . import _mod\n")
    (pkg / "d.py").write_text("from . import a as _a\n_a._secret\n")
    assert private_imports(pkg) == ["vramguard.b imports vramguard.a._secret"]
    assert private_attributes(pkg) == ["vramguard.d reads vramguard.a._secret"]
