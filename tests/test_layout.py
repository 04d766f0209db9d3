"""The house rules of the package layout: every module imports only its own layer or lower ones (the data
flow profile -> table -> plan -> export/runtime, with the API and the CLI on top), the modules import one another
without a circle (within a layer too), no module imports another's private names, and the CLI module only parses
and prints.

Every import counts, function-level ones included: an import deferred into a function still makes the module
depend on what it imports, and is the usual way a circle hides."""

from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "sensprof")

# lowest first; a module may import from its own layer or any lower one. An entry names a top-level module or
# package of sensprof; a dotted entry (e.g. "engines.run") ranks a subpackage or module on its own (the longest
# entry that a module's name starts with wins).
LAYERS = [
    ["errors", "constants", "_aliases"],  # _aliases: the moved modules' old names (sensprof.planner, ...)
    ["profiling", "planning", "validation"],  # the stage folders' __init__.py: docstrings only, they import nothing
    ["files", "specs", "gguf_files", "reaper", "corpus"],  # corpus: the built-in texts, read by name  # reaper: what sensprof starts dies with it; gguf_files: a GGUF file parsed once (models and engines.llamacpp read it)
    ["engines"],  # what serving engines store: catalogs as data (no torch) and emulations; schemes.py asks them
    ["", "schemes", "memory", "scheme_tables", "planning.budget", "planning.pricing",
     "planning.prediction", "rope", "rotation", "data", "quant",
     "profiling.screen", "metrics"],
    ["artifacts", "targets", "planning.planner", "planning.uniforms", "profiling.table", "models", "hub"],
    ["profiling.hooks", "profiling.taps", "profiling.outputs", "profiling.suffix", "planning.plan", "export"],
    ["profiling.profile", "validation.validate", "validation.validate_engine", "validation.engine_checks",
     "validation.baselines",
     "planning.selection", "planning.refine", "planning.sweep", "summary", "runtime", "evaluate", "report"],
    ["profiling.distributed"],  # sensprof profile --ray: runs sensprof.profiling.profile's cells on Ray workers
    ["api"],
    ["cli", "cli_args", "__main__"],
]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}


def _modules() -> dict[str, str]:
    out = {}
    for folder, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                out[rel.removesuffix("__init__").rstrip(".")] = path
    return out


MODULES = _modules()


def _rank(module: str) -> int:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in RANK:
            return RANK[".".join(parts[:n])]
    raise AssertionError(f"sensprof.{module} is in no layer of tests/test_layout.py: add it to LAYERS")


def _imports(module: str, source: str | None = None):
    """(imported sensprof module, names, line) for every import of `module`, function-level ones too."""
    path = MODULES.get(module, "")
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(open(path).read() if source is None else source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module == "sensprof" or (node.module or "").startswith("sensprof."):
                target = node.module.removeprefix("sensprof").lstrip(".")
            else:
                continue
            yield target, [a.name for a in node.names], node.lineno
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "sensprof" or a.name.startswith("sensprof."):
                    yield a.name.removeprefix("sensprof").lstrip("."), [], node.lineno


def _edges(module: str):
    """(imported module, line) for every sensprof module that importing `module` makes Python run: the module
    imported (`from . import x` names a module), and the packages above it that `module` is not inside of (their
    __init__.py runs first); the root package is left out, as every module runs it."""
    for target, names, line in _imports(module):
        full = [f"{target}.{n}".lstrip(".") for n in names]
        for imported in [f for f in full if f in MODULES] or [target]:
            yield imported, line
            parts = imported.split(".")
            for n in range(1, len(parts)):
                package = ".".join(parts[:n])
                if module != package and not module.startswith(package + "."):
                    yield package, line


GRAPH = {m: {t for t, _ in _edges(m) if t != m} for m in MODULES}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as a sorted list."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
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
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_go_down_the_layers(module):
    for imported, line in _edges(module):
        assert _rank(imported) <= _rank(module), (
            f"sensprof.{module} (layer {_rank(module)}) imports sensprof.{imported} (layer {_rank(imported)}) "
            f"at line {line}")


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_import_names_a_module_that_is_there(module):
    """A relative import written for another folder (`from .errors import` in planning/) names no module: caught
    here for function-level imports too, which importing the module would not run."""
    for target, _, line in _imports(module):
        assert target in MODULES, f"sensprof.{module} imports sensprof.{target} at line {line}, which is no module"


def test_no_import_circles():
    """No module reaches itself through its imports, whatever the layers say."""
    circles = _cycles(GRAPH)
    assert not circles, "import circles: " + "; ".join(" <-> ".join(f"sensprof.{m}" for m in c) for c in circles)


def test_the_checks_see_function_level_imports_and_circles():
    """The checker itself: an import inside a function is an edge, and a circle of three is found."""
    source = "def f():\n    from .schemes import get_scheme\n    if True:\n        import sensprof.memory\n"
    assert list(_imports("plan", source)) == [("schemes", ["get_scheme"], 2), ("memory", [], 4)]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_private_names_cross_modules(module):
    for target, names, _ in _imports(module):
        private = [n for n in names if n.startswith("_") and n != "__version__"]
        assert not private, f"sensprof.{module} imports {private} from sensprof.{target}"


def test_the_cli_only_parses_calls_the_api_and_prints():
    """cli.py imports nothing but the API, the error type and what it prints with (summary and eval tables)."""
    allowed = {"", "api", "errors", "cli_args", "summary", "evaluate.run", "evaluate.lm_eval_run"}
    used = {target for target, _, _ in _imports("cli")}
    assert used <= allowed, used - allowed
    source = open(MODULES["cli"]).read()
    assert "_option_string_actions" not in source and "run_profile" not in source
