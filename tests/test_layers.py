"""The package's layers, read from the source (nothing is imported).

Every module under python/vramguard is parsed with ast; each import of
another vramguard module is an edge, whether it sits at the top of the
module or inside a function (a function-level import is a dependency just
the same, only a later one). The tests below assert that

  - the imports form no circle (no strongly connected component of more
    than one module, with or without the function-level edges), and
  - no module imports a module of a higher layer, at any level.

The layers, lowest first (python/vramguard/*/__init__.py say what each is):

  base      _core (the C extension), _version, _presets, _units, _files, _search
  render    figures to text, HTML and matplotlib: no state, no torch
  torch     install(), the hooks, the patched torch.cuda functions
  trace     the trace format, readers, recording, replay, snapshots
  report    summary(), last_oom(), regions and steps, the replay report
  notebook  IPython's OOM handler and meter, recover(), find_max_batch()
  phantom   the phantom GPU: its environment, its build, its settings, the Jupyter kernel
  dryrun    the dry run, its child, its features (python/vramguard/dryrun)
  top       the command line, the loggers' callbacks, the package itself

A module may import its own layer and any lower one. Within a layer the
imports must still form no circle.

Run as a script (python tests/test_layers.py [PACKAGE_DIR]) it prints the
graph's circles: how the numbers in the closing note were taken.
"""
import ast
import os
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "python" / "vramguard"

# Lowest first. A module's layer is its subpackage's, else its own entry.
LAYERS = [
    ("base", {"vramguard._core", "vramguard._version", "vramguard._presets", "vramguard._units", "vramguard._files",
              "vramguard._search"}),
    ("render", {"vramguard.render"}),
    ("torch", {"vramguard.torch"}),
    ("trace", {"vramguard.trace"}),
    ("report", {"vramguard.report"}),
    ("notebook", {"vramguard.notebook"}),
    ("phantom", {"vramguard.phantom"}),
    ("dryrun", {"vramguard.dryrun"}),
    ("top", {"vramguard", "vramguard.__main__", "vramguard.cli", "vramguard.integrations"}),
]

# Built by setup.py from csrc/, not a .py file: a leaf.
EXTENSIONS = {"vramguard._core"}


def modules(package=PACKAGE):
    """{dotted name: (path or None, is a package)} of every module."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent).with_suffix("")
        if "_phantom_src" in rel.parts or "data" in rel.parts[1:]:
            continue
        parts = list(rel.parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        found[".".join(parts)] = (path, is_package)
    for name in EXTENSIONS:
        found.setdefault(name, (None, False))
    return found


def _targets(name, is_package, node, known):
    """The vramguard modules one import statement names."""
    named = []
    if isinstance(node, ast.Import):
        named = [alias.name for alias in node.names]
    else:
        if node.level:
            base = name.split(".") if is_package else name.split(".")[:-1]
            base = base[:len(base) - (node.level - 1)]
            origin = ".".join(base + ([node.module] if node.module else []))
        else:
            origin = node.module or ""
        for alias in node.names:
            submodule = f"{origin}.{alias.name}"
            named.append(submodule if submodule in known else origin)
    out = set()
    for target in named:
        if target.split(".")[0] != "vramguard":
            continue
        while target not in known and "." in target:
            target = target.rsplit(".", 1)[0]
        if target in known and target != name:
            out.add(target)
    return out


def import_graph(package=PACKAGE):
    """{module: (imported at module level, imported only inside functions)}."""
    known = modules(package)
    graph = {}
    for name, (path, is_package) in known.items():
        top, inner = set(), set()
        if path is not None:
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))

            def visit(node, in_function):
                for child in ast.iter_child_nodes(node):
                    nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                    if isinstance(child, (ast.Import, ast.ImportFrom)):
                        (inner if in_function else top).update(_targets(name, is_package, child, known))
                    visit(child, nested)

            visit(tree, False)
        graph[name] = (top, inner - top)
    return graph


def circles(edges):
    """Strongly connected components of more than one module (Tarjan,
    without recursion), each sorted, largest first."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return sorted(out, key=lambda c: (-len(c), c))


def mutual_pairs(edges):
    return sorted({tuple(sorted((a, b))) for a in edges for b in edges[a] if a in edges.get(b, ())})


def layer_of(name):
    """(rank, layer name) of a module: its own entry, else its nearest
    enclosing package's."""
    probe = name
    while True:
        for rank, (layer, members) in enumerate(LAYERS):
            if probe in members:
                return rank, layer
        if "." not in probe:
            return None
        probe = probe.rsplit(".", 1)[0]


def _module_level(graph):
    return {name: top for name, (top, _) in graph.items()}


def _all_levels(graph):
    return {name: top | inner for name, (top, inner) in graph.items()}


# ------------------------------------------------------------------ tests


def test_the_graph_sees_the_package():
    graph = import_graph()
    assert "vramguard" in graph and "vramguard.cli" in graph and "vramguard._core" in graph
    # function-level imports are found, and kept apart from module-level ones
    assert any(inner for _, inner in graph.values())
    assert graph["vramguard"][0] >= {"vramguard._core", "vramguard.torch.install"}


def test_no_import_circle_at_module_level():
    assert circles(_module_level(import_graph())) == []


def test_no_import_circle_counting_function_level_imports():
    assert circles(_all_levels(import_graph())) == []


def test_every_module_has_a_layer():
    assert [name for name in import_graph() if layer_of(name) is None] == []


def test_no_module_imports_a_higher_layer():
    upward = []
    for name, (top, inner) in sorted(import_graph().items()):
        rank, layer = layer_of(name)
        for where, targets in (("module level", top), ("in a function", inner)):
            for target in sorted(targets):
                target_rank, target_layer = layer_of(target)
                if target_rank > rank:
                    upward.append(f"{name} ({layer}) imports {target} ({target_layer}), {where}")
    assert upward == []


def test_the_extension_is_where_setup_py_builds_it():
    """vramguard._core stays at the top of the package: setup.py names it,
    and the C code imports vramguard._units by that name."""
    setup = (PACKAGE.parents[1] / "setup.py").read_text(encoding="utf-8")
    assert '"vramguard._core"' in setup
    assert (PACKAGE / "_units.py").is_file()


def test_setuptools_lists_every_subpackage():
    """A wheel holds the subpackages pyproject.toml lists, and only those."""
    text = (PACKAGE.parents[1] / "pyproject.toml").read_text(encoding="utf-8")
    listed = text.split("packages = [", 1)[1].split("]", 1)[0]
    for init in PACKAGE.rglob("__init__.py"):
        name = ".".join(init.parent.relative_to(PACKAGE.parent).parts)
        if "_phantom_src" in name:
            continue
        assert f'"{name}"' in listed, f"{name} is missing from [tool.setuptools] packages"


def _report(package):
    graph = import_graph(package)
    top_edges = sum(len(top) for top, _ in graph.values())
    inner_edges = sum(len(inner) for _, inner in graph.values())
    print(f"{len(graph)} modules; {top_edges} module-level imports, {inner_edges} more inside functions")
    for title, edges in (("module level", _module_level(graph)), ("all levels", _all_levels(graph))):
        found = circles(edges)
        print(f"{title}: {len(found)} circle(s) (strongly connected components), sizes {[len(c) for c in found]}")
        for component in found:
            print("   ", " ".join(sorted(component)))
        pairs = mutual_pairs(edges)
        print(f"    {len(pairs)} pair(s) importing each other:", ", ".join(f"{a} <-> {b}" for a, b in pairs))


if __name__ == "__main__":
    _report(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else PACKAGE)
