"""The moved modules' old names (sensprof.planner, sensprof.validate, ... before profiling/, planning/, validation/)
still import, as the very module under its new name: users' imports, monkeypatch and mock targets, and pickles
that recorded an old name keep working, with no file left at the old path (sensprof/_aliases.py)."""

from __future__ import annotations

import importlib
import os
import pickle
import subprocess
import sys
from unittest import mock

import pytest

import sensprof
from sensprof._aliases import ALIASES, BORN_IN_STAGE

PACKAGE = os.path.dirname(sensprof.__file__)


def test_the_table_names_every_module_of_the_stage_folders():
    moved = {f"sensprof.{stage}.{f[:-3]}" for stage in ("profiling", "planning", "validation")
             for f in os.listdir(os.path.join(PACKAGE, stage)) if f.endswith(".py") and f != "__init__.py"}
    assert set(ALIASES.values()) | set(BORN_IN_STAGE) == moved and not set(ALIASES.values()) & set(BORN_IN_STAGE)
    for old in ALIASES:
        assert not os.path.exists(os.path.join(PACKAGE, old.split(".")[1] + ".py")), f"a file is left at {old}"


@pytest.mark.parametrize("old", sorted(ALIASES))
def test_an_old_name_is_the_moved_module(old):
    new = ALIASES[old]
    module = importlib.import_module(old)
    assert module is importlib.import_module(new) is sys.modules[old] is sys.modules[new]
    assert module.__name__ == module.__spec__.name == new  # the module keeps its own name (pickles, reload)
    assert getattr(sensprof, old.split(".")[1]) is module  # `from sensprof import planner` and sensprof.planner


def test_old_names_in_from_imports():
    from sensprof.planning.planner import problem_from_table
    from sensprof.planner import problem_from_table as old
    from sensprof.profiling.table import load_profile
    from sensprof.table import load_profile as old_table
    from sensprof.validate import measure as old_measure
    from sensprof.validation.validate import measure

    assert old is problem_from_table and old_table is load_profile and old_measure is measure


def test_patching_through_an_old_name_patches_the_module(monkeypatch):
    import sensprof.planning.planner as planner
    import sensprof.validation.validate as validate

    sentinel = object()
    monkeypatch.setattr("sensprof.planner.NONE", sentinel)
    assert planner.NONE is sentinel
    with mock.patch("sensprof.validate.measure", "patched"):
        assert validate.measure == "patched"
    assert validate.measure is not None and validate.measure != "patched"


def test_a_pickle_that_recorded_an_old_name_loads():
    from sensprof.profiling.table import load_profile

    assert pickle.loads(b"csensprof.table\nload_profile\n.") is load_profile
    assert pickle.loads(pickle.dumps(load_profile)) is load_profile


def test_api_profile_stays_the_function():
    """sensprof.profile (the module's old name) and sensprof.api.profile (the command) do not collide."""
    import sensprof.profile
    from sensprof import api

    assert callable(api.profile) and api.profile.__module__ == "sensprof.api"
    assert sensprof.profile is sys.modules["sensprof.profiling.profile"]


def test_an_old_name_imported_first_in_a_fresh_process():
    """Before anything imported the new names: the old one loads the module once, under both names."""
    code = ("import sys; import sensprof.validate_engine as old, sensprof.plan as plan; "
            "from sensprof.validation import validate_engine as new; "
            "assert old is new and sys.modules['sensprof.validate_engine'] is new, (old, new); "
            "assert plan is sys.modules['sensprof.planning.plan']; "
            "assert sum(1 for m in sys.modules.values() if getattr(m, '__name__', '') == new.__name__) == 2")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
