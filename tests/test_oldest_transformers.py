"""sensprof on the oldest transformers that pyproject.toml admits, not only on the newest one this Python has.

The GPU machine has transformers 5.17 and the CI machine the newest release, and the two differ where sensprof meets
transformers: 5.24 renamed the attention's cache argument (`past_key_values` -> `cache`), and GGUF loading, the
attention interface and the Cache classes move between releases. tools/engines/install.sh makes a venv with that
transformers over this Python's packages; this runs the tests of those meeting points in it."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = "oldest-transformers"

# Where sensprof meets transformers: loading every architecture and the real GGUF models, the attention taps and
# hooks, the profile, and the planned cache (prefill, decode, sliding windows).
MEETING_POINTS = (
    "tests/profiling/test_hooks.py",
    "tests/profiling/test_taps.py",
    "tests/profiling/test_profile.py",
    "tests/runtime/test_cache.py",
    "tests/runtime/test_attention.py",
    "tests/runtime/test_prefill.py",
    "tests/test_real_model.py",
)


def floor() -> str:
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        found = re.search(r'"transformers>=([0-9.]+)"', f.read())
    assert found, "pyproject.toml names no \"transformers>=X\" floor"
    return found.group(1)


def oldest_python() -> str:
    """The venv's Python; missing, the test is skipped, unless SENSPROF_REQUIRE_ENGINES=1 (CI installs it)."""
    from sensprof.engines.run.python import engine_home

    python = os.path.join(engine_home(), VENV, "bin", "python")
    if not os.path.exists(python):
        why = f"no {python}: run `bash tools/engines/install.sh oldest-transformers`"
        if os.environ.get("SENSPROF_REQUIRE_ENGINES") == "1":
            pytest.fail(f"SENSPROF_REQUIRE_ENGINES=1 but {why}")
        pytest.skip(why)
    return python


def _in_venv(python: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT}  # this checkout's sensprof, whatever the editable install points at
    return subprocess.run([python, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_venv_holds_the_floor_and_this_checkouts_sensprof():
    python = oldest_python()
    r = _in_venv(python, "-c", "import sensprof, transformers; print(transformers.__version__); "
                 "print(sensprof.__file__)", timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    version, where = r.stdout.split()
    from packaging.version import Version

    assert Version(version) == Version(floor()), f"the venv has transformers {version}; rerun install.sh"
    assert os.path.dirname(os.path.dirname(where)) == ROOT


def test_the_cache_argument_is_the_one_that_version_names():
    """The rename the runtime bridges: a Llama's forward takes `past_key_values` before 5.24 and `cache` from it."""
    python = oldest_python()
    code = ("from tests.conftest import make_tiny_model; from sensprof.runtime.generate import cache_kwarg; "
            "import transformers; print(transformers.__version__, cache_kwarg(make_tiny_model('llama')))")
    r = _in_venv(python, "-c", code, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    version, kwarg = r.stdout.split()[-2:]
    from packaging.version import Version

    assert kwarg == ("cache" if Version(version) >= Version("5.24") else "past_key_values")


def test_where_sensprof_meets_transformers_passes_on_the_oldest_admitted():
    python = oldest_python()
    r = _in_venv(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *MEETING_POINTS,
                 timeout=1500)
    tail = (r.stdout + r.stderr)[-4000:]
    assert r.returncode == 0, f"transformers {floor()}:\n{tail}"
    assert re.search(r"\d+ passed", r.stdout) and " failed" not in r.stdout, tail
