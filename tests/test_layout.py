"""The house rules of the package layout: every module imports only its own layer or lower ones (the data
flow profile -> table -> plan -> export/runtime, with the API and the CLI on top), no module imports another's
private names, and the CLI module only parses and prints."""

from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "sensprof")

# lowest first; a module may import from its own layer or any lower one
LAYERS = [
    ["errors", "constants"],
    ["files", "specs"],
    ["", "schemes", "memory", "budget", "rope", "data", "quant", "screen", "metrics", "engines"],
    ["artifacts", "targets", "planner", "table", "models", "hub"],
    ["hooks", "taps", "outputs", "suffix", "plan", "export"],
    ["profile", "validate", "refine", "sweep", "summary", "runtime", "evaluate", "report"],
    ["distributed"],  # sensprof profile --ray: runs sensprof.profile's cells on Ray workers
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
    head = module.split(".")[0]
    if head not in RANK:
        raise AssertionError(f"sensprof.{module} is in no layer of tests/test_layout.py: add it to LAYERS")
    return RANK[head]


def _imports(module: str):
    """(imported sensprof module, names) for every `from ... import` of `module`, function-level ones too."""
    path = MODULES[module]
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("sensprof"):
                target = node.module.removeprefix("sensprof").lstrip(".")
            else:
                continue
            yield target, [a.name for a in node.names]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_go_down_the_layers(module):
    for target, names in _imports(module):
        for name in names:
            full = f"{target}.{name}".lstrip(".")
            imported = full if full in MODULES else target  # `from . import x` names a module
            assert _rank(imported) <= _rank(module), (
                f"sensprof.{module} (layer {_rank(module)}) imports sensprof.{imported} (layer {_rank(imported)})")


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_private_names_cross_modules(module):
    for target, names in _imports(module):
        private = [n for n in names if n.startswith("_") and n != "__version__"]
        assert not private, f"sensprof.{module} imports {private} from sensprof.{target}"


def test_the_cli_only_parses_calls_the_api_and_prints():
    """cli.py imports nothing but the API, the error type and what it prints with (summary and eval tables)."""
    allowed = {"", "api", "errors", "cli_args", "summary", "evaluate.run", "evaluate.lm_eval_run"}
    used = {target for target, _ in _imports("cli")}
    assert used <= allowed, used - allowed
    source = open(MODULES["cli"]).read()
    assert "_option_string_actions" not in source and "run_profile" not in source
