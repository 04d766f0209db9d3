"""Find an engine format's write/read emulation by name, importing only the family that defines it."""

from __future__ import annotations

import importlib

from ..errors import SensprofError

# Each family module holds EMULATIONS: {"vllm.<format>[.K|.V]": fn(x [B, H, T, D]) -> float32 tensor}
# and/or QUERY_TRANSFORMS: {"<engine>.<name>": fn(q [B, Hq, T, D]) -> the query attention uses}.
FAMILIES = tuple(f"vllm.{f}" for f in ("per_token_head", "fp8", "turboquant", "ultraquant", "nvfp4", "octave")) + (
    "llamacpp.query",)
_CACHE: dict = {}


def _load_all() -> dict:
    if not _CACHE:
        _CACHE.update(EMULATIONS={}, QUERY_TRANSFORMS={})
        for family in FAMILIES:
            mod = importlib.import_module(f"sensprof.engines.{family}")
            for table in ("EMULATIONS", "QUERY_TRANSFORMS"):
                _CACHE[table].update(getattr(mod, table, {}))
    return _CACHE


def _lookup(table: str, name: str):
    found = _load_all()[table]
    if name not in found:
        raise SensprofError(f"no engine emulation named {name!r}; known: {', '.join(sorted(found))}")
    return found[name]


def get_emulation(name: str):
    return _lookup("EMULATIONS", name)


def get_query_transform(name: str):
    if name in _load_all()["EMULATIONS"] and name not in _CACHE["QUERY_TRANSFORMS"]:
        return _CACHE["EMULATIONS"][name]  # e.g. vllm.query_fp8, a plain function of the query
    return _lookup("QUERY_TRANSFORMS", name)


def emulate(scheme, x):
    """What the engine's attention reads back for cached tensor x [B, H, T, D], in x's basis, as x's dtype."""
    table = _load_all()["EMULATIONS"]
    name = f"{scheme.emulation}.{scheme.tensor}"  # a tensor-specific codec, else the one both tensors use
    fn = table[name] if scheme.tensor and name in table else get_emulation(scheme.emulation)
    return fn(x).to(x.dtype)
