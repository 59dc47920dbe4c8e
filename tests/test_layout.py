"""The source tree's layout: a short top level of packages, no import circle (type-only imports included), no lazy
import of the package, the DRAM level out of the algorithms, files and kernels of bounded size."""

import ast
import re
import sys
import warnings
from fnmatch import fnmatch
from pathlib import Path

import pytest
from setuptools.config.pyprojecttoml import read_configuration

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"iosim": ROOT / "iosim", "iosim.kernels": ROOT / "kernels"}


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (kernels/ installs as iosim.kernels)."""
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            name = ".".join((package, *parts[:-1])) if parts[-1] == "__init__" else ".".join((package, *parts))
            found[name] = path
    return found


def module_imports(tree: ast.Module):
    """Every import at the module's top level, those under ``if TYPE_CHECKING:`` included: a type-only import is
    still a dependency, and a circle through one marks a concept in the wrong module."""
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.If, ast.Try)):
            yield from (n for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom)))


def targets(node, name: str, known) -> set[str]:
    """The package modules one import statement loads."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in known}
    base = node.module or ""
    if node.level:
        package = name if (PACKAGES.get(name) or name in PACKAGES) else name.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    found = {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known}
    if base in known and len(found) < len(node.names):
        found.add(base)
    return found


def import_graph() -> dict[str, set[str]]:
    known = modules()
    graph = {}
    for name, path in known.items():
        tree = ast.parse(path.read_text())
        graph[name] = set().union(*(targets(n, name, known) for n in module_imports(tree))) - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_graph_holds_the_modules_it_should():
    graph = import_graph()
    assert "iosim.core.tiling" in graph["iosim.tilings.policies"] and "iosim.api" in graph["iosim.reports.optimize"]
    assert (
        "iosim.kernels._device" in graph["iosim.kernels.flash"] and "iosim.algorithms.flash" in graph["iosim.registry"]
    )
    # a type-only import is an edge: iosim.core.memory names Blocks only under TYPE_CHECKING
    assert "iosim.core.visits" in graph["iosim.core.memory"]


def test_no_import_circle_not_even_through_type_only_imports():
    assert cycles(import_graph()) == []


# The top of iosim/: the API layer's modules, and a package per layer of docs/architecture.md.
TOP_LEVEL = {"__init__.py", "__main__.py", "api.py", "plans.py", "results.py", "gradients.py", "registry.py",
             "reference.py"}
PACKAGES_OF_IOSIM = {"core", "variants", "algorithms", "tilings", "serving", "models", "reports", "gpu", "cli"}


def test_the_top_of_iosim_is_a_short_list_of_modules_and_the_layers_packages():
    top = ROOT / "iosim"
    files = {p.name for p in top.glob("*.py")}
    folders = {p.name for p in top.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert files == TOP_LEVEL, f"modules at the top of iosim/ beside the listed ones: {sorted(files - TOP_LEVEL)}"
    assert folders == PACKAGES_OF_IOSIM, f"packages: {sorted(folders ^ PACKAGES_OF_IOSIM)}"


def test_no_algorithm_imports_the_gpu_level():
    # the paper's algorithms know nothing of the L2 or of kernels' grids: iosim.gpu reads them, never the reverse
    graph = import_graph()
    reached = {name: sorted(t for t in deps if t.startswith("iosim.gpu")) for name, deps in graph.items()
               if name.startswith("iosim.algorithms")}
    assert {name: deps for name, deps in reached.items() if deps} == {}


def test_no_module_imports_the_package_inside_a_function():
    # a lazy import of iosim is how a cycle hides; third-party ones (rich, matplotlib) only defer start-up cost
    lazy = []
    for name, path in modules().items():
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lazy += [
                    f"{name}:{n.lineno}"
                    for n in ast.walk(fn)
                    if isinstance(n, (ast.Import, ast.ImportFrom))
                    and (
                        getattr(n, "level", 0)
                        or (getattr(n, "module", None) or n.names[0].name).split(".")[0] == "iosim"
                    )
                ]
    assert lazy == []


@pytest.mark.parametrize("folder, limit", [("iosim", 400)])
def test_no_file_is_too_long(folder, limit):
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / folder).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > limit}
    assert long == {}


def test_no_kernel_function_takes_more_than_20_parameters():
    wide = {}
    for path in (ROOT / "kernels").rglob("*.py"):
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, ast.FunctionDef) and (n := len(fn.args.args) + len(fn.args.kwonlyargs)) > 20:
                wide[f"{path.name}:{fn.name}"] = n
    assert wide == {}


def test_every_data_file_of_the_package_is_installed_with_it():
    # a file of the package that is not Python (the committed resource reports the DRAM level reads) reaches a wheel
    # only through pyproject.toml's package-data: missing there, `pip install .` gives an iosim whose sdpa-flash
    # kernel fails on a file that is not there, while the editable install of the tests finds it
    with warnings.catch_warnings():  # setuptools calls its reading of [tool.setuptools] beta
        warnings.simplefilter("ignore")
        declared = read_configuration(ROOT / "pyproject.toml")["tool"]["setuptools"]["package-data"]
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*"):
            if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in path.parts:
                owner = ".".join((package, *path.parent.relative_to(folder).parts))
                assert any(fnmatch(path.name, pattern) for pattern in declared.get(owner, [])), (owner, path, declared)


def test_every_library_the_package_imports_outside_the_kernels_is_a_dependency_of_the_plain_install():
    # `pip install .` (the README's first command) must run every command: a library imported anywhere in iosim but
    # its GPU kernels, at the top of a module or deferred into a function, must be in [project].dependencies. Numba
    # was in the kernels' extra alone while the DRAM level's compiled loops imported it, so `sweep --gpu h100
    # --causal` failed on the plain install
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        project = read_configuration(ROOT / "pyproject.toml")["project"]
    declared = {re.match(r"[A-Za-z0-9_.-]+", d).group().lower().replace("-", "_") for d in project["dependencies"]}
    imported = set()
    for path in PACKAGES["iosim"].rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.partition(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level:
                imported.add(node.module.partition(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - {"iosim"}
    assert third_party and third_party <= declared, (third_party - declared, declared)


def test_every_file_a_kernel_description_names_is_in_the_repository():
    from iosim.gpu.kernels import KERNELS

    named = {(k.name, path.rstrip(".,;:)")) for k in KERNELS.values()
             for path in re.findall(r"(?:experiments|iosim|kernels|docs)/[\w/.-]+\.(?:md|json|py)", k.source)}
    assert named and not [(name, path) for name, path in named if not (ROOT / path).exists()]
