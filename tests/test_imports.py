"""The import graph follows the pipeline: no module imports, at the top or inside a function, a
module that (directly or not) imports it back.

The graph is read with `ast` from every file of the package (eager_neuron/, kernels/ and cache/,
which install as eager_neuron.kernels and eager_neuron.cache), including imports inside
functions, plus the family modules eager_neuron/ops.py imports by name (its TABLE). ALLOWED lists
the edges that still close a cycle (none today), each with the file's owner and the way out; the
list may only shrink (test_allowed_edges_still_exist fails on a stale entry, so it is removed).
A module below another in the pipeline that must call it back is handed the callable at import
(tensor.set_dispatcher, lower/host.set_kernel_path) instead of importing it.
"""

from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = {"eager_neuron": "eager_neuron", "kernels": "eager_neuron.kernels",
            "cache": "eager_neuron.cache"}

_E, _L = "eager_neuron.", "eager_neuron.lower."
ALLOWED: set = set()
# work in progress of other helpers: may not exist yet, so exempt from the staleness check; the
# lead removes these when that work lands
WIP: set = set()


def modules() -> dict:
    """{module name: file path} for every .py file of the package."""
    out = {}
    for folder, package in PACKAGES.items():
        base = os.path.join(ROOT, folder)
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for f in filenames:
                if not f.endswith(".py"):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, f), base)[:-3].replace(os.sep, ".")
                rel = rel.removesuffix("__init__").rstrip(".")
                out[package + ("." + rel if rel else "")] = os.path.join(dirpath, f)
    return out


def _targets(mods: dict, module: str, node) -> list:
    """The project modules one import statement loads (the deepest that exists)."""
    out = []
    if isinstance(node, ast.Import):
        for alias in node.names:
            name = alias.name
            while name and name not in mods:
                name = name.rpartition(".")[0]
            if name:
                out.append(name)
        return out
    if node.level:
        base = module if mods[module].endswith("__init__.py") else module.rpartition(".")[0]
        parts = base.split(".")[:len(base.split(".")) - (node.level - 1)]
        target = ".".join(parts + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    for alias in node.names:
        if f"{target}.{alias.name}" in mods:
            out.append(f"{target}.{alias.name}")
        elif target in mods:
            out.append(target)
    return out


def _ops_families(path: str) -> list:
    """The family modules ops.py imports by name: the keys of TABLE and DYNAMIC_ONLY."""
    out = []
    for node in ast.parse(open(path).read()).body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            if getattr(target, "id", None) == "TABLE" and isinstance(node.value, ast.Dict):
                out += [k.value for k in node.value.keys]
            if getattr(target, "id", None) == "DYNAMIC_ONLY":
                out += [e.value for e in node.value.elts]
    return out


def graph() -> dict:
    """{module: {module it imports}} over top-level and function-level imports."""
    mods = modules()
    g = {m: set() for m in mods}
    for module, path in mods.items():
        for node in ast.walk(ast.parse(open(path).read(), path)):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                g[module].update(t for t in _targets(mods, module, node) if t != module)
    ops = "eager_neuron.ops"
    if ops in mods:
        g[ops].update(_L + f for f in _ops_families(mods[ops]) if _L + f in mods)
    return g


def cycles(g: dict) -> list:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]
    for root in g:
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(g[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_import_graph_is_acyclic():
    g = graph()
    for src, dst in ALLOWED | WIP:
        g.get(src, set()).discard(dst)
    found = cycles(g)
    lines = []
    for comp in found:
        members = set(comp)
        lines.append(" <-> ".join(comp))
        lines += [f"    {m} -> {sorted(g[m] & members)}" for m in comp]
    assert not found, "import cycles:\n" + "\n".join(lines)


def test_allowed_edges_still_exist():
    # an allowed edge that is gone must leave the list (the list only shrinks)
    g = graph()
    stale = sorted((s, d) for s, d in ALLOWED if d not in g.get(s, set()))
    assert not stale, f"remove from ALLOWED: {stale}"


def test_the_checker_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_top_level_kernels_name_is_not_taken_from_the_checkout(tmp_path):
    """Python run from the checkout's top directory has it on sys.path, where kernels/ (our
    eager_neuron.kernels) imported as a top-level `kernels` shadowed PyPI's `kernels` package,
    which transformers >= 5.25 imports. Imported under that name it now hands the name to the
    package on the rest of sys.path, or is absent; eager_neuron.kernels is unaffected."""
    import subprocess
    import sys

    def run(code, **env):
        return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                              text=True, env=dict(os.environ, **env))

    # absent, or the installed distribution (transformers >= 5.25 pulls PyPI's in), never ours
    r = run("import kernels; print(kernels.__file__)")
    if r.returncode:
        assert "ModuleNotFoundError: No module named 'kernels'" in r.stderr, r.stderr[-500:]
    else:
        assert not os.path.abspath(r.stdout.strip()).startswith(
            os.path.join(ROOT, "kernels") + os.sep), r.stdout
    pkg = tmp_path / "kernels"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("WHO = 'the installed kernels'\n")
    (pkg / "sub.py").write_text("X = 7\n")
    r = run("import kernels, kernels.sub, torch, eager_neuron\n"
            "from eager_neuron.kernels import elementwise\n"
            "print(kernels.WHO, kernels.sub.X, elementwise.__name__,\n"
            "      (torch.ones(2, device='neuron') + 1).sum().item())",
            PYTHONPATH=str(tmp_path))
    assert r.returncode == 0, r.stderr[-800:]
    assert r.stdout.split() == ["the", "installed", "kernels", "7",
                                "eager_neuron.kernels.elementwise", "4.0"], r.stdout
