"""Record what vLLM's own `serve` parser makes of KV-cache argv lines -> tests/data/vllm/argparse.json.

Tests never import vLLM; they compare the argv sensprof's exporter builds against these recorded parses.
Run in an environment where vLLM is importable (a CPU-only install is enough: only the parser is built):

    python tools/vllm_golden/argparse_fixture.py [--out tests/data/vllm/argparse.json]

The parser is EngineArgs.add_cli_args on vllm.utils.argparse_utils.FlexibleArgumentParser, the same
engine flags `vllm serve` registers. Third-party modules that building the parser imports but that the
install lacks (e.g. xgrammar on a CPU box) are replaced by empty stubs, listed in the fixture.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import types
from unittest import mock

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_OUT = os.path.join(ROOT, "tests", "data", "vllm", "argparse.json")
STUB_ENV = "SENSPROF_VLLM_STUBS"

# argv lines beyond one per dtype: the skip-layer token grammar sensprof relies on, and spellings it avoids
EXTRA_LINES = [
    ["--kv-cache-dtype", "int4_per_token_head", "--kv-cache-dtype-skip-layers", "0", "1", "29"],
    ["--kv-cache-dtype", "fp8", "--kv-cache-dtype-skip-layers", "sliding_window", "3"],
    ["--kv-cache-dtype", "fp8_e4m3", "--kv-cache-dtype-skip-layers", "sliding_window"],
    ["--kv-cache-dtype", "fp8_e5m2", "--kv-cache-dtype-skip-layers", "2"],
    ["--kv-cache-dtype", "int8_per_token_head", "--kv-cache-dtype-skip-layers", "0", "2"],
    ["--kv-cache-dtype", "fp8_per_token_head", "--kv-cache-dtype-skip-layers", "1"],
    ["--kv-cache-dtype", "fp8", "--kv-cache-dtype-skip-layers", "0,1"],
    ["--kv-cache-dtype", "fp8", "--kv-cache-dtype-skip-layers"],
    ["--kv-cache-dtype", "int4"],
    ["--kv-cache-dtype", "fp8_e4m3_cal"],
    ["--kv-cache-dtype", "q8_0"],
    ["--kv-cache-dtype", "FP8"],
    ["--calculate-kv-scales"],
]


class _StubFinder:
    """Imports of the listed top-level packages (and their submodules) yield empty stub modules."""

    def __init__(self, names):
        self.names = set(names)

    def find_spec(self, fullname, path=None, target=None):
        import importlib.machinery

        if fullname.split(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = types.ModuleType(spec.name)
        mod.__path__ = []
        mod.__getattr__ = lambda attr: mock.MagicMock(name=f"{spec.name}.{attr}")
        return mod

    def exec_module(self, module):
        pass


def build_parser():
    """vLLM's engine-argument parser. An absent third-party import is stubbed and the script re-runs
    itself (vLLM registers torch types at import, so it cannot be imported twice in one process)."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # building the device config must not need a GPU
    stubbed = [m for m in os.environ.get(STUB_ENV, "").split(",") if m]
    sys.meta_path.insert(0, _StubFinder(stubbed))
    try:
        from vllm.engine.arg_utils import EngineArgs
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        return EngineArgs.add_cli_args(FlexibleArgumentParser(prog="vllm serve")), stubbed
    except ModuleNotFoundError as e:
        top = (e.name or "").split(".")[0]
        if not top or top == "vllm" or top in stubbed or len(stubbed) >= 40:
            raise
        os.environ[STUB_ENV] = ",".join([*stubbed, top])
        os.execv(sys.executable, [sys.executable, *sys.argv])


def parse(parser, argv: list[str]) -> dict:
    import contextlib
    import io

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(argv)
    except SystemExit:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        return {"argv": argv, "accepted": False, "error": lines[-1] if lines else "rejected"}
    except Exception as e:  # noqa: BLE001 - record whatever vLLM raises
        return {"argv": argv, "accepted": False, "error": f"{type(e).__name__}: {e}"}
    out = {"argv": argv, "accepted": True, "kv_cache_dtype": ns.kv_cache_dtype,
           "kv_cache_dtype_skip_layers": ns.kv_cache_dtype_skip_layers}
    try:  # the parser takes any string (custom dtypes register later); CacheConfig validates it
        from vllm.config.cache import CacheConfig

        CacheConfig(cache_dtype=ns.kv_cache_dtype, kv_cache_dtype_skip_layers=ns.kv_cache_dtype_skip_layers)
        out["cache_config_valid"] = True
    except Exception as e:  # noqa: BLE001
        out["cache_config_valid"] = False
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip() and "errors.pydantic.dev" not in ln]
        out["cache_config_error"] = next((ln for ln in lines if "Invalid" in ln), lines[-1] if lines else "")[:300]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args()
    parser, stubbed = build_parser()
    import vllm
    from vllm.config.cache import CacheDType
    from typing import get_args

    dtypes = list(get_args(CacheDType))
    lines = [["--kv-cache-dtype", d] for d in dtypes] + EXTRA_LINES
    fixture = {
        "vllm_version": getattr(vllm, "__version__", "unknown"),
        "parser": "vllm.engine.arg_utils.EngineArgs.add_cli_args(vllm.utils.argparse_utils.FlexibleArgumentParser())",
        "cache_dtypes": dtypes,
        "stubbed_modules": stubbed,
        "parses": [parse(parser, argv) for argv in lines],
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(fixture, f, indent=1)
        f.write("\n")
    ok = sum(p["accepted"] for p in fixture["parses"])
    print(f"wrote {args.out}: vLLM {fixture['vllm_version']}, {ok}/{len(lines)} lines accepted, stubbed {stubbed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
