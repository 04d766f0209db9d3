"""The modules' old names (before the stage folders) import the moved modules themselves.

`import sensprof.planner`, `from sensprof.validate import measure`, `mock.patch("sensprof.profile.X")` and a pickle
that recorded `sensprof.table` keep working: a finder on sys.meta_path answers each old name with the module under
its new name, so sys.modules holds one module object under both names (never a copy, and no file at the old path).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys

STAGES = {
    "profiling": ("profile", "hooks", "suffix", "outputs", "taps", "screen", "distributed", "table"),
    "planning": ("planner", "budget", "pricing", "selection", "refine", "sweep", "plan"),
    "validation": ("validate", "validate_engine", "engine_checks"),
}
ALIASES = {f"sensprof.{m}": f"sensprof.{stage}.{m}" for stage, modules in STAGES.items() for m in modules}
# modules written inside the stage folders after the move: they never had an old name
BORN_IN_STAGE = ("sensprof.planning.uniforms", "sensprof.planning.prediction", "sensprof.validation.baselines",
                 "sensprof.profiling.merge_windows", "sensprof.profiling.route")


class AliasLoader(importlib.abc.Loader):
    """Hands the import system the module already imported under its new name."""

    def __init__(self, target: str):
        self.target = target
        self.spec = None

    def create_module(self, spec):
        module = importlib.import_module(self.target)
        self.spec = module.__spec__
        return module

    def exec_module(self, module):
        # the import system has just set the alias's spec on the module: it keeps its own (its name, file, reload)
        module.__spec__ = self.spec


class AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        new = ALIASES.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, AliasLoader(new))


def install_aliases() -> None:
    """Put the finder first on sys.meta_path, once (a stale file at an old path then never shadows the module)."""
    if not any(isinstance(f, AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, AliasFinder())
