"""Re-run vLLM 0.33's own KV-cache Triton kernels on the best device there is (CUDA, else the CPU under the
Triton interpreter) WITHOUT the vllm package, and compare every output byte for byte with the saved fixtures
(tests/data/vllm/per_token_head.pt, tests/data/vllm/turboquant.pt) and with sensprof's own emulations.

The kernel files come from the wheel (tools/vllm_golden/extract_kernels.sh WHEEL .vllm_kernels). This script
builds a throwaway ``vllm`` package in a temp dir: the extracted kernel modules as they are, plus stubs for the
few things they import from the rest of vLLM (triton_utils -> the real triton/tl, platforms.current_platform,
envs, logger) and, copied definition by definition out of the extracted source files, KVQuantMode /
get_kv_quant_mode / is_quantized_kv_cache, get_kv_cache_dtype_handler (no plugin registered),
get_fp8_min_max and turboquant_attn._build_hadamard_cached. ``current_platform`` follows the device: on CUDA it
answers like vLLM's CudaPlatform (is_cuda, the real compute capability; no hadacore op, that is in vllm._C), on
the CPU like its CpuPlatform, which is what the golden runs saw.

The writes are those of tools/vllm_golden/per_token_head.py and turboquant.py, on the same inputs
(golden_common.py, which those scripts import too; importing the scripts themselves would import vllm and set
CUDA_VISIBLE_DEVICES to ""). On the CPU the fp8 cast is what each golden script used: torch's RNE+saturating cast swapped into the
interpreter for the per-token-head / plain fp8 writes, the interpreter's own cast for TurboQuant (whose fixture
keeps the interpreter's k8v4 fp8 key bytes, marked not golden); a second k8v4 store with the swapped cast is
checked against sensprof. On CUDA nothing is swapped: the GPU's own conversion is what is being checked.

Differences that are expected on a GPU are recorded as ``info`` rows and kept out of ``all_equal``:
  - the k8v4 fp8 key bytes (and the k8v4 k_deq that decodes them) against the fixture, which holds the
    interpreter's bytes; the gating reference for them on CUDA is sensprof's cvt.rn.satfinite emulation;
  - int4 with the rotation done on the device (vLLM's tier-2 Triton bf16 matmul here; real vLLM on sm80+ uses
    the hadacore op from vllm._C, which cannot run without vLLM's compiled extension). The gating int4 rows
    on CUDA rotate on the CPU with vLLM's own single_rht (its tier-3 butterfly, as in the fixture) and run
    vLLM's int4 write kernel on the GPU.
  - decode attention outputs are floating-point reductions (host BLAS for q @ Pi^T, then the kernel's exp/sums):
    checked to 2e-3 on CUDA (as the tests do) and to 1e-4 on the CPU, where they are bit-exact on the fixture's
    machine but 1 fp16 ulp off in 3 of 2048 elements (d=256) on others; the bitwise count is always reported.

Usage, from the repo root:

    # CPU, proves the shim is faithful (every write / dequant row bit-exact):
    TRITON_INTERPRET=1 python tools/vllm_golden/on_gpu.py --kernels .vllm_kernels --out /tmp/gold_cpu.json
    # GPU:
    python tools/vllm_golden/on_gpu.py --kernels .vllm_kernels --out gold_gpu.json

The JSON is rewritten after every case, so a run cut short still leaves what it did.
JSON: all_equal = every 'exact' row bitwise equal and no case raised; all_ok = every gating row ('exact' and
'close:TOL') passed; complete = no case skipped by --time-budget (cases run in order: the --quick set first).
Exit status: 0 when all_equal, all_ok and complete, 1 otherwise, 2 when the shim could not be built.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback

T0 = time.time()
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
FIX_PTH = os.path.join(REPO, "tests", "data", "vllm", "per_token_head.pt")
FIX_TQ = os.path.join(REPO, "tests", "data", "vllm", "turboquant.pt")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", required=True, help="DEST of extract_kernels.sh (holds vllm/...)")
    ap.add_argument("--out", required=True, help="JSON report")
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                    help="auto: CUDA if available and TRITON_INTERPRET is not 1, else CPU + interpreter")
    ap.add_argument("--quick", action="store_true",
                    help="only head dims 128 and 96 (per-token-head) and 128 (TurboQuant)")
    ap.add_argument("--time-budget", type=float, default=None,
                    help="seconds from start after which remaining cases are skipped (recorded); "
                         "default 90 on CUDA, none on CPU; 0 = none")
    ap.add_argument("--keep-shim", action="store_true", help="do not delete the temp shim package")
    return ap.parse_args(argv)


ARGS = parse_args()

import torch  # noqa: E402  (does not import triton)

if ARGS.device == "auto":
    interp_env = os.environ.get("TRITON_INTERPRET", "0").strip().lower() not in ("", "0", "false")
    KIND = "cuda" if torch.cuda.is_available() and not interp_env else "cpu"
else:
    KIND = ARGS.device
if KIND == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"  # must precede `import triton`
else:
    os.environ.pop("TRITON_INTERPRET", None)
DEV = torch.device("cuda" if KIND == "cuda" else "cpu")
BUDGET = ARGS.time_budget if ARGS.time_budget is not None else (90.0 if KIND == "cuda" else 0.0)

import numpy as np  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

# ----------------------------------------------------------------------------------------------- the shim

REAL_MODULES = [  # imported as extracted
    "v1/attention/ops/triton_reshape_and_cache_flash.py",
    "v1/attention/ops/int4_per_token_head.py",
    "v1/attention/ops/triton_attention_helpers.py",
    "v1/attention/ops/triton_unified_attention.py",
    "v1/attention/ops/triton_turboquant_store.py",
    "v1/attention/ops/triton_turboquant_decode.py",
    "v1/attention/ops/triton_decode_attention.py",
    "model_executor/layers/quantization/turboquant/__init__.py",
    "model_executor/layers/quantization/turboquant/centroids.py",
    "model_executor/layers/quantization/turboquant/config.py",
    "utils/math_utils.py",
]

STUB_INIT = '''"""Shim built by tools/vllm_golden/on_gpu.py: NOT vLLM. Holds a few of vLLM 0.33.0's kernel modules as
extracted from its wheel, and stubs for what they import."""
__version__ = "0.33.0"
IS_SENSPROF_SHIM = True
'''

STUB_TRITON_UTILS = '''"""Stub of vllm/triton_utils/__init__.py: the real triton (vLLM's HAS_TRITON branch);
the kernels here import only ``tl`` and ``triton``. VLLM_TRITON_FORCE_FIRST_CONFIG is off by default, so no
autotuner patch."""
import triton
import triton.language as tl

HAS_TRITON = True
try:
    import triton.language.extra.libdevice as tldevice
except Exception:  # pragma: no cover
    tldevice = None
LOG2E = 1.4426950408889634
LOGE2 = 0.6931471805599453
'''

STUB_PLATFORMS = '''"""Stub of vllm.platforms: ``current_platform`` with the methods the extracted kernels call,
following vllm/platforms/interface.py; device kind fixed when the shim was built: {kind!r}.
cuda: like CudaPlatform (is_cuda, is_cuda_alike, torch's compute capability). cpu: like CpuPlatform (no
capability, so has_device_capability() is False), as in the golden runs."""
from typing import NamedTuple

import torch

_KIND = {kind!r}


class DeviceCapability(NamedTuple):
    major: int
    minor: int

    def as_version_str(self) -> str:
        return f"{{self.major}}.{{self.minor}}"

    def to_int(self) -> int:
        assert 0 <= self.minor < 10
        return self.major * 10 + self.minor


class _ShimPlatform:
    device_type = "cuda" if _KIND == "cuda" else "cpu"
    device_name = device_type
    dispatch_key = "CUDA" if _KIND == "cuda" else "CPU"

    def is_cuda(self):
        return _KIND == "cuda"

    def is_rocm(self):
        return False

    def is_xpu(self):
        return False

    def is_tpu(self):
        return False

    def is_cpu(self):
        return _KIND == "cpu"

    def is_cuda_alike(self):
        return _KIND == "cuda"

    def is_fp8_fnuz(self):
        return False

    def fp8_dtype(self):
        return torch.float8_e4m3fn

    def get_device_capability(self, device_id=0):
        if _KIND != "cuda":
            return None
        return DeviceCapability(*torch.cuda.get_device_capability(device_id))

    def has_device_capability(self, capability, device_id=0):
        cur = self.get_device_capability(device_id=device_id)
        if cur is None:
            return False
        if isinstance(capability, tuple):
            return cur >= capability
        return cur.to_int() >= capability

    def is_device_capability(self, capability, device_id=0):
        cur = self.get_device_capability(device_id=device_id)
        if cur is None:
            return False
        if isinstance(capability, tuple):
            return cur == capability
        return cur.to_int() == capability

    def is_device_capability_family(self, capability, device_id=0):
        cur = self.get_device_capability(device_id=device_id)
        if cur is None:
            return False
        return (cur.to_int() // 10) == (capability // 10)

    def __getattr__(self, name):
        raise AttributeError(f"vllm shim: current_platform.{{name}} is not stubbed")


current_platform = _ShimPlatform()
'''

STUB_ENVS = '''"""Stub of vllm.envs: the defaults of the variables the extracted kernels read (vllm/envs.py)."""
import os

VLLM_BATCH_INVARIANT = bool(int(os.getenv("VLLM_BATCH_INVARIANT", "0")))
VLLM_TRITON_FORCE_FIRST_CONFIG = False


def __getattr__(name):
    raise AttributeError(f"vllm shim: envs.{name} is not stubbed")
'''

STUB_LOGGER = '''"""Stub of vllm.logger: init_logger -> a stdlib logger with vLLM's *_once helpers."""
import logging

_seen = set()


class _Logger(logging.Logger):
    def _once(self, level, msg, *args):
        key = (level, msg, args)
        if key not in _seen:
            _seen.add(key)
            self.log(level, msg, *args)

    def debug_once(self, msg, *args, **kw):
        self._once(logging.DEBUG, msg, *args)

    def info_once(self, msg, *args, **kw):
        self._once(logging.INFO, msg, *args)

    def warning_once(self, msg, *args, **kw):
        self._once(logging.WARNING, msg, *args)


def init_logger(name):
    return _Logger(name)
'''


STUB_PACKAGING_VERSION = '''"""Fallback for packaging.version (only if packaging is not installed): parse() of a
release string, enough for triton_decode_attention's ``version.parse(triton.__version__) < version.parse("3.2.0")``."""
import re


def parse(s):
    return tuple(int(x) for x in re.findall(r"\\d+", str(s).split("+")[0])[:3])
'''


def _defs_from(path: str, names: list[str]) -> str:
    """The exact source text of top-level definitions ``names`` (class / function / assignment) in ``path``."""
    src = open(path).read()
    tree = ast.parse(src)
    lines = src.splitlines(keepends=True)
    found = {}
    for node in tree.body:
        nm = getattr(node, "name", None)
        if nm is None and isinstance(node, (ast.Assign, ast.AnnAssign)):
            tgt = node.targets[0] if isinstance(node, ast.Assign) else node.target
            nm = getattr(tgt, "id", None)
        if nm in names:
            start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            found[nm] = "".join(lines[start - 1:node.end_lineno])
    missing = [n for n in names if n not in found]
    if missing:
        raise RuntimeError(f"{path}: no top-level {missing}")
    return "\n\n".join(found[n] for n in names) + "\n"


def build_shim(kernels: str) -> str:
    src = os.path.join(os.path.abspath(kernels), "vllm")
    if not os.path.isdir(src):
        raise FileNotFoundError(f"{src} missing: run tools/vllm_golden/extract_kernels.sh WHEEL {kernels}")
    root = tempfile.mkdtemp(prefix="vllm_shim_")
    pkg = os.path.join(root, "vllm")

    def write(rel, text):
        p = os.path.join(pkg, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write(text)

    for rel in REAL_MODULES:
        os.makedirs(os.path.dirname(os.path.join(pkg, rel)), exist_ok=True)
        shutil.copyfile(os.path.join(src, rel), os.path.join(pkg, rel))
    write("__init__.py", STUB_INIT)
    write("triton_utils/__init__.py", STUB_TRITON_UTILS)
    write("platforms/__init__.py", STUB_PLATFORMS.format(kind=KIND))
    write("envs.py", STUB_ENVS)
    write("logger.py", STUB_LOGGER)
    kvi = os.path.join(src, "v1", "kv_cache_interface.py")
    write("v1/kv_cache_interface.py",
          '"""Copied from vllm/v1/kv_cache_interface.py by on_gpu.py (these definitions only)."""\n'
          "from __future__ import annotations\n\nfrom enum import Enum, IntEnum\n\nimport torch\n\n\n"
          + _defs_from(kvi, ["KVQuantMode", "get_kv_quant_mode", "is_quantized_kv_cache"]))
    write("config/__init__.py", "")
    write("config/cache.py",
          '"""From vllm/config/cache.py: the handler lookup, with the registry as vLLM starts it (empty: no\n'
          'plugin has registered a kv-cache dtype handler)."""\nfrom __future__ import annotations\n\n'
          "_KV_CACHE_DTYPE_HANDLERS: dict = {}\n\n\n"
          + _defs_from(os.path.join(src, "config", "cache.py"), ["get_kv_cache_dtype_handler"]))
    write("model_executor/layers/quantization/utils/quant_utils.py",
          '"""From vllm/model_executor/layers/quantization/utils/quant_utils.py (these definitions only)."""\n'
          "import torch\n\nfrom vllm.platforms import current_platform\n\n"
          "FP8_DTYPE = current_platform.fp8_dtype()\n\n\n"
          + _defs_from(os.path.join(src, "model_executor", "layers", "quantization", "utils",
                                    "quant_utils.py"), ["get_fp8_min_max"]))
    import importlib.util

    if importlib.util.find_spec("packaging") is None:  # triton_decode_attention imports packaging.version
        os.makedirs(os.path.join(root, "packaging"))
        open(os.path.join(root, "packaging", "__init__.py"), "w").close()
        with open(os.path.join(root, "packaging", "version.py"), "w") as f:
            f.write(STUB_PACKAGING_VERSION)
        META["packaging_stubbed"] = True
    for dirpath, _, files in os.walk(pkg):  # namespace dirs -> empty packages (never vLLM's heavy __init__s)
        if "__init__.py" not in files:
            open(os.path.join(dirpath, "__init__.py"), "w").close()
    return root


def hadamard_fn(kernels: str):
    """vLLM's turboquant_attn._build_hadamard_cached, exec'd from its source as the golden script does."""
    path = os.path.join(os.path.abspath(kernels), "vllm", "v1", "attention", "backends", "turboquant_attn.py")
    tree = ast.parse(open(path).read())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_build_hadamard_cached")
    fn.decorator_list = []
    ns = {"torch": torch, "math": math}
    exec(compile(ast.Module([fn], []), path, "exec"), ns)
    return lambda d: ns["_build_hadamard_cached"](d, str(DEV))


# ------------------------------------------------------------------- fp8 cast of the interpreter (CPU only)

CAST = {"rne": False}
if KIND == "cpu":
    import triton.runtime.interpreter as interp

    _orig_convert = interp._convert_float
    _FP8 = {tl.float8e4nv: torch.float8_e4m3fn, tl.float8e5: torch.float8_e5m2}

    def _convert_float(data, src, dst, rounding_mode):
        """As in per_token_head.py: torch's RNE cast saturated to the largest finite value (cvt.rn.satfinite)."""
        if CAST["rne"] and dst in _FP8 and src == tl.float32:
            x = torch.from_numpy(np.ascontiguousarray(data).view(np.float32).copy())
            fmax = torch.finfo(_FP8[dst]).max
            return x.clamp(-fmax, fmax).to(_FP8[dst]).view(torch.uint8).numpy().reshape(data.shape)
        return _orig_convert(data, src, dst, rounding_mode)

    interp._convert_float = _convert_float


@contextlib.contextmanager
def rne_cast(on: bool):
    old = CAST["rne"]
    CAST["rne"] = on
    try:
        yield
    finally:
        CAST["rne"] = old


@contextlib.contextmanager
def cpu_capability_patch():
    """per_token_head.py's fp8_write patches (CPU only): CpuPlatform reports no sm89, and the launcher calls
    torch.cuda.get_device_capability directly (only to pick a tile size)."""
    if KIND != "cpu":
        yield
        return
    saved_sup, saved_cap = rc._is_supported_kv_cache_dtype, torch.cuda.get_device_capability
    rc._is_supported_kv_cache_dtype = lambda s: True
    torch.cuda.get_device_capability = lambda *a: (9, 0)
    try:
        yield
    finally:
        rc._is_supported_kv_cache_dtype, torch.cuda.get_device_capability = saved_sup, saved_cap


# ------------------------------------------------------------------------------------------- comparisons

RESULTS: list[dict] = []
META: dict = {}
SP: dict = {}  # sensprof's emulation modules, filled in main()


def _bits(x: torch.Tensor) -> torch.Tensor:
    """An integer view with one element per value, for bitwise comparison."""
    x = x.detach().cpu().contiguous()
    if x.dtype.is_floating_point:
        return x.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])
    return x


def compare(case, what, got, want, ref="fixture", expect="exact", deq=None, note=""):
    """Record one comparison. expect: 'exact' (gating, bitwise), 'close:TOL' (gating, max |deq diff| <= TOL),
    'info' (reported only). deq: maps a tensor to float values for the max-abs column (default: float())."""
    got, want = got.detach().cpu(), want.detach().cpu()
    row = {"case": case, "what": what, "ref": ref, "expect": expect, "dtype": str(got.dtype).replace("torch.", ""),
           "shape": list(got.shape), "n": got.numel(), "note": note}
    if got.shape != want.shape or got.dtype != want.dtype:
        row.update(n_diff=None, max_abs=None, exact=False, ok=expect == "info",
                   error=f"shape/dtype {tuple(got.shape)} {got.dtype} vs {tuple(want.shape)} {want.dtype}")
    else:
        ne = _bits(got) != _bits(want)
        row["n_diff"] = int(ne.sum())
        row["exact"] = row["n_diff"] == 0
        f = deq or (lambda t: t.float())
        try:
            a, b = f(got).float(), f(want).float()
            d = (a - b).abs()
            both_nan = a.isnan() & b.isnan()
            d = torch.where(both_nan, torch.zeros_like(d), d)
            row["max_abs"] = float(d.nan_to_num(nan=float("inf")).max()) if d.numel() else 0.0
        except Exception as e:  # noqa: BLE001
            row["max_abs"] = None
            row["note"] = (note + f" (no deq: {e})").strip()
        if expect == "exact":
            row["ok"] = row["exact"]
        elif expect.startswith("close:"):
            row["ok"] = row["max_abs"] is not None and row["max_abs"] <= float(expect.split(":")[1])
        else:
            row["ok"] = True
    RESULTS.append(row)
    status = "ok  " if row["ok"] else "FAIL"
    if expect == "info":
        status = "info"
    nd = "shape!" if row["n_diff"] is None else f"{row['n_diff']}/{row['n']}"
    ma = "-" if row.get("max_abs") is None else f"{row['max_abs']:.3g}"
    print(f"{status} {case:<30} {what:<16} {row['dtype']:<14} vs {ref:<8} [{expect:<10}] diff {nd:<11} "
          f"max|d| {ma}{'  ' + row['note'] if row['note'] else ''}", flush=True)
    return row


def record_error(case, exc):
    tb = traceback.format_exc()
    RESULTS.append({"case": case, "what": "ERROR", "expect": "exact", "ok": False, "exact": False,
                    "error": f"{type(exc).__name__}: {exc}", "traceback": tb})
    print(f"ERR  {case:<30} {type(exc).__name__}: {exc}", flush=True)
    print("     " + tb.strip().splitlines()[-3] if len(tb.strip().splitlines()) >= 3 else "", flush=True)


def guarded(case, step, fn):
    """Run one step of a case; an exception is recorded and the case's other steps still run."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001
        record_error(f"{case} [{step}]", e)
        return None


def write_json(done=False):
    gating = [r for r in RESULTS if r.get("expect") != "info" and r.get("what") != "SKIPPED"]
    exact_rows = [r for r in RESULTS if r.get("expect") == "exact"]
    summary = {
        "rows": len(RESULTS),
        "exact_rows": len(exact_rows),
        "exact_rows_equal": sum(1 for r in exact_rows if r.get("ok")),
        "gating_rows_failed": [f"{r['case']} {r['what']} vs {r.get('ref')}" for r in gating
                               if not r.get("ok") and r.get("what") != "ERROR"],
        "errors": [f"{r['case']}: {r['error']}" for r in RESULTS if r.get("what") == "ERROR"],
        "skipped": [r["case"] for r in RESULTS if r.get("what") == "SKIPPED"],
        "info_rows_differing": [f"{r['case']} {r['what']} vs {r.get('ref')}: {r.get('n_diff')}/{r.get('n')}"
                                for r in RESULTS if r.get("expect") == "info" and not r.get("exact")],
    }
    dec = [r for r in RESULTS if r.get("what") == "decode_out" and r.get("ref") == "fixture"]
    out = dict(META)
    out.update(
        finished=done,
        elapsed_s=round(time.time() - T0, 2),
        complete=done and not summary["skipped"],
        all_equal=bool(RESULTS) and all(r.get("ok") for r in exact_rows) and not summary["errors"],
        all_ok=bool(RESULTS) and all(r.get("ok") for r in gating),
        decode_out_bit_exact=f"{sum(1 for r in dec if r.get('exact'))}/{len(dec)}",
        summary=summary,
        results=RESULTS,
    )
    tmp = ARGS.out + ".tmp"
    os.makedirs(os.path.dirname(os.path.abspath(ARGS.out)), exist_ok=True)
    with open(tmp, "w") as f:
        json.dump(out, f, indent=1, default=str)
    os.replace(tmp, ARGS.out)
    return out


# ----------------------------------------------- inputs: the golden scripts' own (golden_common.py)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden_common import PTH_BLOCK, PTH_DIMS, TQ_BS, TQ_DIMS, TQ_H, TQ_PRESETS, TQ_T  # noqa: E402
from golden_common import per_token_head_inputs as pth_inputs  # noqa: E402
from golden_common import turboquant_inputs as tq_inputs  # noqa: E402
import golden_common  # noqa: E402


# -------------------------------------------------------------- writes (per_token_head.py, on DEV)


def int4_write(k, v, rotate_on_cpu: bool):
    """per_token_head.py ``int4_write``. rotate_on_cpu: vLLM's single_rht on the CPU tensors (its tier-3
    butterfly, what the fixture used), then vLLM's write kernel on DEV -- the body of reshape_and_cache_int4
    with the rotation moved; otherwise reshape_and_cache_int4 itself on DEV."""
    t, h, d = k.shape
    nb = -(-t // PTH_BLOCK)
    kc = torch.zeros(nb, PTH_BLOCK, h, d // 2, dtype=torch.uint8, device=DEV)
    vc = kc.clone()
    ks = torch.zeros(nb, PTH_BLOCK, h, device=DEV)
    vs = ks.clone()
    slots = torch.arange(t, device=DEV)
    if rotate_on_cpu:
        kr = i4.single_rht(k.cpu().float()).to(k.dtype).to(DEV)
        vr = i4.single_rht(v.cpu().float()).to(v.dtype).to(DEV)
        i4._run_reshape_kernel(i4._reshape_cache_int4_kernel, key=kr, value=vr, key_cache=kc, value_cache=vc,
                               k_scale_cache=ks, v_scale_cache=vs, slot_mapping=slots,
                               packing_factor=i4._INT4_PACKING_FACTOR)
    else:
        i4.reshape_and_cache_int4(k.to(DEV), v.to(DEV), kc, vc, slots, k_scale_cache=ks, v_scale_cache=vs)
    return tuple(c.flatten(0, 1)[:t].clone().cpu() for c in (kc, ks, vc, vs))


def int4_readback(packed, scale_zp):
    """per_token_head.py ``int4_readback`` (CPU)."""
    return golden_common.int4_readback(packed, scale_zp, i4.single_rht)


def pth_write(k, v, dtype, mode):
    t, h, d = k.shape
    kc = torch.zeros(1, PTH_BLOCK, h, d, dtype=dtype, device=DEV)
    vc = kc.clone()
    ks = torch.zeros(1, PTH_BLOCK, h, device=DEV)
    vs = ks.clone()
    rc.triton_reshape_and_cache_flash_per_token_head_quant(k.to(DEV), v.to(DEV), kc, vc, ks, vs,
                                                           torch.arange(t, device=DEV), mode)
    return tuple(c[0, :t].clone().cpu() for c in (kc, ks, vc, vs))


def fp8_write(k, v, cache_dtype, k_scale, v_scale):
    t, h, d = k.shape
    kc = torch.zeros(1, PTH_BLOCK, h, d, dtype=torch.uint8, device=DEV)
    vc = kc.clone()
    with cpu_capability_patch():
        rc.triton_reshape_and_cache_flash(k.to(DEV), v.to(DEV), kc, vc, torch.arange(t, device=DEV), cache_dtype,
                                          torch.tensor(k_scale, device=DEV), torch.tensor(v_scale, device=DEV))
    return kc[0, :t].clone().cpu(), vc[0, :t].clone().cpu()


def _bhtd(x):
    return x.transpose(0, 1).unsqueeze(0)


def _thd(x):
    return x.squeeze(0).transpose(0, 1)


# ------------------------------------------------------------------------------------------------ cases


def case_pth_signs(gold):
    for b, s in gold["signs"].items():
        compare("pth/rht_signs", f"b={b}", i4._get_rht_signs(b, 0, torch.device("cpu")), s)
        if SP:
            compare("pth/rht_signs", f"b={b}", SP["pth"].rht_signs(b), s, ref="sensprof")


def case_pth(gold, d, i):
    name = f"pth d={d}"
    case = gold[d]

    def inputs():
        k, v = pth_inputs(d, 100 + i)
        compare(name, "inputs.k", k, case["k"])
        compare(name, "inputs.v", v, case["v"])

    k, v = case["k"], case["v"]
    sp = SP.get("pth")
    f8 = SP.get("f8")
    scale_val = lambda s: (s.view(torch.int32) & -16).view(torch.float32)  # noqa: E731

    def int4():  # gating: the fixture's rotation (CPU butterfly), vLLM's write kernel on DEV
        kc, ks, vc, vs = int4_write(k, v, rotate_on_cpu=KIND == "cuda")
        g = case["int4"]
        for t, codes, sc in (("k", kc, ks), ("v", vc, vs)):
            compare(name, f"int4.{t}_codes", codes, g[f"{t}_codes"])
            compare(name, f"int4.{t}_scale", sc, g[f"{t}_scale"], deq=scale_val)
            compare(name, f"int4.{t}_read", int4_readback(codes, sc), g[f"{t}_read"])
            if sp:
                p, sz = sp.quantize_int4(case[t])
                compare(name, f"int4.{t}_codes", codes, p, ref="sensprof")
                compare(name, f"int4.{t}_scale", sc, sz, ref="sensprof", deq=scale_val)

    def int4dev():  # info: reshape_and_cache_int4 as is on the GPU (rotation there too)
        kc2, ks2, vc2, vs2 = int4_write(k, v, rotate_on_cpu=False)
        g = case["int4"]
        for t, codes, sc in (("k", kc2, ks2), ("v", vc2, vs2)):
            compare(name, f"int4dev.{t}_codes", codes, g[f"{t}_codes"], expect="info",
                    note="rotation on the GPU: vLLM tier-2 Triton bf16 matmul (no hadacore without vllm._C)")
            compare(name, f"int4dev.{t}_read", int4_readback(codes, sc), g[f"{t}_read"], expect="info")
            if sp:
                p, _ = sp.quantize_int4(case[t], rht="hadacore")
                compare(name, f"int4dev.{t}_codes", codes, p, ref="sensprof", expect="info",
                        note="vs sensprof rht='hadacore'")

    def pth_fmt(fmt, dt, mode):
        with rne_cast(True):
            kc, ks, vc, vs = pth_write(k, v, dt, mode)
        g = case[fmt]
        for t, codes, sc in (("k", kc, ks), ("v", vc, vs)):
            deq = lambda c, s=sc: c.float() * s[..., None]  # noqa: E731
            compare(name, f"{fmt}.{t}_codes", codes, g[f"{t}_codes"], deq=deq)
            compare(name, f"{fmt}.{t}_scale", sc, g[f"{t}_scale"])
            if sp:
                c2, s2 = sp.quantize_per_token_head(case[t], fmt)
                compare(name, f"{fmt}.{t}_codes", codes, c2, ref="sensprof", deq=deq)
                compare(name, f"{fmt}.{t}_scale", sc, s2, ref="sensprof")

    def plain(pname, dt, scale):
        with rne_cast(True):
            kc, vc = fp8_write(k, v, dt, scale, scale * 2)
        g = case[f"plain_{pname}"]
        for t, codes, sv in (("k", kc, scale), ("v", vc, scale * 2)):
            deq = lambda c, sv=sv: c.view(torch.float8_e4m3fn).float() * sv  # noqa: E731
            compare(name, f"plain_{pname}.{t}", codes, g[f"{t}_codes"], deq=deq)
            if f8:
                want = f8.quantize_fp8(case[t], g[f"{t}_scale"], "e4m3").view(torch.uint8)
                compare(name, f"plain_{pname}.{t}", codes, want, ref="sensprof", deq=deq)

    guarded(name, "inputs", inputs)
    guarded(name, "int4", int4)
    if KIND == "cuda":
        guarded(name, "int4dev", int4dev)
    guarded(name, "int8", lambda: pth_fmt("int8", torch.int8, KVQuantMode.INT8_PER_TOKEN_HEAD))
    guarded(name, "fp8", lambda: pth_fmt("fp8", torch.float8_e4m3fn, KVQuantMode.FP8_PER_TOKEN_HEAD))
    if d != 96:
        for pname, dt, scale in (("e4m3", "fp8_e4m3", 1.0), ("e4m3_s", "fp8_e4m3", 0.03),
                                 ("e5m2", "fp8_e5m2", 1.0), ("e5m2_s", "fp8_e5m2", 1e-3)):
            guarded(name, f"plain_{pname}", lambda a=(pname, dt, scale): plain(*a))


def _attend(q, k, v, gqa):
    """tests/engines/test_vllm_turboquant.py ``_attend``."""
    d = q.shape[-1]
    k, v = k.repeat_interleave(gqa, 0), v.repeat_interleave(gqa, 0)
    s = (q[:, None, :] * k).sum(-1) / math.sqrt(d)
    return (s.softmax(-1)[..., None] * v).sum(1)


def tq_store(k, v, cfg, Hm, mid):
    cache = torch.zeros(1, TQ_BS, TQ_H, cfg.slot_size_aligned, dtype=torch.uint8, device=DEV)
    slots = torch.arange(TQ_T, dtype=torch.int32, device=DEV)
    triton_turboquant_store(k.to(DEV), v.to(DEV), cache, slots, Hm, mid, mse_bits=cfg.key_mse_bits,
                            key_packed_size=cfg.key_packed_size, value_quant_bits=cfg.value_quant_bits,
                            key_fp8=cfg.key_fp8)
    return cache


def case_tq_inputs(gold, ci, d):
    c = gold["cases"][ci]
    k, v, q = tq_inputs(d, 2000 + ci)
    for nm, x in (("k", k), ("v", v), ("q", q)):
        compare(f"tq d={d}", f"inputs.{nm}", x, c[nm])


def case_tq(gold, ci, d, p, hadamard):
    name = f"tq {p.replace('turboquant_', '')} d={d}"
    c = gold["cases"][ci]
    assert c["d"] == d
    g = c[p]
    k, v, q = c["k"], c["v"], c["q"]
    tq = SP.get("tq")
    cfg = TurboQuantConfig.from_cache_dtype(p, d)
    sizes = (cfg.key_packed_size, cfg.value_packed_size, cfg.slot_size, cfg.slot_size_aligned)
    compare(name, "sizes", torch.tensor(sizes), torch.tensor(tuple(g["sizes"])))
    cent = get_centroids(d, cfg.centroid_bits).float()
    compare(name, "centroids", cent, gold["centroids"][(d, cfg.centroid_bits)])
    if SP.get("cb"):
        compare(name, "centroids", cent, SP["cb"].centroids(d, cfg.centroid_bits), ref="sensprof")
    Hm = hadamard(d)
    cs, _ = cent.sort()
    mid = ((cs[:-1] + cs[1:]) / 2).to(DEV)
    cent_d = cent.to(DEV)

    with rne_cast(False):  # turboquant.py ran with the interpreter's own cast
        cache = tq_store(k, v, cfg, Hm, mid)
    slot = cache[0, :TQ_T].cpu()
    mine = guarded(name, "sensprof store_slot", lambda: tq.store_slot(k, v, p)) if tq else None
    if cfg.key_fp8:
        fp8deq = lambda b: b.contiguous().view(torch.float8_e4m3fn).float()  # noqa: E731
        on_cpu = KIND == "cpu"
        compare(name, "slot[d:]", slot[..., d:], g["slot"][..., d:], note="values, scale, zero")
        compare(name, "slot[:d] key_fp8", slot[..., :d], g["slot"][..., :d], deq=fp8deq,
                expect="exact" if on_cpu else "info",
                note="fixture = interpreter cast" + ("" if on_cpu else " (not golden)"))
        if mine is not None:
            compare(name, "slot[d:]", slot[..., d:], mine[..., d:], ref="sensprof")
            compare(name, "slot[:d] key_fp8", slot[..., :d], mine[..., :d], ref="sensprof", deq=fp8deq,
                    expect="info" if on_cpu else "exact",
                    note="interpreter cast vs cvt.rn.satfinite" if on_cpu else "GPU cast vs cvt.rn.satfinite")
        if on_cpu and mine is not None:
            def rne_store():
                with rne_cast(True):
                    slot_rne = tq_store(k, v, cfg, Hm, mid)[0, :TQ_T].cpu()
                compare(name, "key_fp8[rne-swap]", slot_rne[..., :d], mine[..., :d], ref="sensprof", deq=fp8deq,
                        note="store re-run with torch RNE+sat cast swapped in")

            guarded(name, "rne-swap store", rne_store)
    else:
        compare(name, "slot", slot, g["slot"])
        if mine is not None:
            compare(name, "slot", slot, mine, ref="sensprof")

    bt = torch.zeros(1, 1, dtype=torch.int32, device=DEV)
    k8_gpu = cfg.key_fp8 and KIND == "cuda"

    def dequant():
        kd, vd = golden_common.turboquant_full_dequant(_tq_full_dequant_kv, cache, bt, cent_d, cfg, d)
        kdq, vdq = kd[0, :, :TQ_T].cpu(), vd[0, :, :TQ_T].cpu()
        compare(name, "k_deq", kdq, g["k_deq"], expect="info" if k8_gpu else "exact",
                note="decodes the fixture's non-golden key bytes" if k8_gpu else "")
        compare(name, "v_deq", vdq, g["v_deq"])
        if tq is not None:
            k_rot, v_read = tq.read_slot(slot, p, d, rotated=True)
            compare(name, "k_deq", kdq, k_rot.transpose(0, 1).half(), ref="sensprof",
                    note="sensprof read_slot of this run's bytes")
            compare(name, "v_deq", vdq, v_read.transpose(0, 1).half(), ref="sensprof")

    guarded(name, "dequant", dequant)

    def decode():
        o = triton_turboquant_decode_attention(
            q.to(DEV), cache, bt, torch.tensor([TQ_T], dtype=torch.int32, device=DEV), Hm, cent_d,
            1.0 / math.sqrt(d), mse_bits=cfg.key_mse_bits, key_packed_size=cfg.key_packed_size,
            value_quant_bits=cfg.value_quant_bits, key_fp8=cfg.key_fp8, norm_correction=cfg.norm_correction,
            PiT=Hm, max_num_kv_splits=4,
        ).cpu()
        # decode_out is a floating-point reduction (fp32 q @ Pi^T by the host BLAS, then the interpreter's numpy
        # exp/sum): bit-exact on the fixture's machine, 1 fp16 ulp off in a few elements elsewhere (d=256 here).
        # Its bitwise diff count is reported; the gate is a tolerance: 1e-4 on the CPU, the tests' 2e-3 on CUDA.
        tol = "close:1e-4" if KIND == "cpu" else "close:2e-3"
        compare(name, "decode_out", o, g["decode_out"], expect="info" if k8_gpu else tol,
                note="fixture attends to the interpreter's key bytes" if k8_gpu
                else "float reduction; bitwise count shown")
        if tq is not None:
            qf = q.float()[0]
            if cfg.key_fp8:
                kk = tq.read_slot(slot, p, d)[0].transpose(0, 1)
            else:
                kk = tq.EMULATIONS[f"vllm.{p}.K"](k.transpose(0, 1)[None])[0]
            vv = tq.EMULATIONS[f"vllm.{p}.V"](v.transpose(0, 1)[None])[0]
            ref_o = _attend(qf, kk, vv, gold["GQA"])
            compare(name, "decode_out", o[0].float(), ref_o, ref="sensprof", expect="close:2e-3",
                    note="softmax(q.k)v over sensprof's K/V")

    guarded(name, "decode", decode)


# -------------------------------------------------------------------------------------------------- main


def main():
    global i4, rc, KVQuantMode, get_centroids, TurboQuantConfig, _tq_full_dequant_kv
    global triton_turboquant_decode_attention, triton_turboquant_store, SP
    dev_name = torch.cuda.get_device_name(0) if KIND == "cuda" else (platform.processor() or platform.machine())
    manifest = os.path.join(ARGS.kernels, "MANIFEST.txt")
    META.update(
        device_kind=KIND, device=dev_name,
        capability=list(torch.cuda.get_device_capability(0)) if KIND == "cuda" else None,
        torch=torch.__version__, triton=triton.__version__, numpy=np.__version__,
        python=platform.python_version(), cuda=torch.version.cuda,
        triton_interpret=os.environ.get("TRITON_INTERPRET"), quick=ARGS.quick, time_budget_s=BUDGET,
        kernels_wheel=open(manifest).readline().strip() if os.path.exists(manifest) else None,
        fp8_cast=("CPU: torch RNE+satfinite swapped into the interpreter for per-token-head/plain fp8; "
                  "interpreter's own cast for TurboQuant (as the golden scripts)") if KIND == "cpu"
        else "the GPU's own conversion (nothing swapped)",
    )
    print(f"device {KIND}: {dev_name}  torch {torch.__version__}  triton {triton.__version__}  "
          f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')}", flush=True)
    try:
        shim = build_shim(ARGS.kernels)
        sys.path.insert(0, shim)
        import vllm

        assert getattr(vllm, "IS_SENSPROF_SHIM", False) and vllm.__file__.startswith(shim), vllm.__file__
        from vllm.model_executor.layers.quantization.turboquant.centroids import get_centroids
        from vllm.model_executor.layers.quantization.turboquant.config import TurboQuantConfig
        from vllm.v1.attention.ops import int4_per_token_head as i4
        from vllm.v1.attention.ops import triton_reshape_and_cache_flash as rc
        from vllm.v1.attention.ops.triton_turboquant_decode import (
            _tq_full_dequant_kv,
            triton_turboquant_decode_attention,
        )
        from vllm.v1.attention.ops.triton_turboquant_store import triton_turboquant_store
        from vllm.v1.kv_cache_interface import KVQuantMode

        hadamard = hadamard_fn(ARGS.kernels)
        META["shim"] = shim
        META["hadacore_available"] = bool(i4._hadacore_available())
    except Exception as e:  # noqa: BLE001
        record_error("shim", e)
        write_json(done=True)
        print("could not build/import the shim", file=sys.stderr)
        return 2

    SP = {}
    sys.path.insert(1, REPO)
    for key, mod in (("pth", "sensprof.engines.vllm.per_token_head"), ("f8", "sensprof.engines.vllm.fp8"),
                     ("tq", "sensprof.engines.vllm.turboquant"),
                     ("cb", "sensprof.engines.vllm.turboquant_codebook")):
        try:
            SP[key] = __import__(mod, fromlist=["_"])
        except Exception as e:  # noqa: BLE001
            record_error(f"import {mod}", e)
    print(f"shim at {shim}; sensprof modules: {sorted(SP)}; setup {time.time() - T0:.1f}s", flush=True)

    gold_pth = torch.load(FIX_PTH, weights_only=False)
    gold_tq = torch.load(FIX_TQ, weights_only=False)

    # Order: what --quick keeps first, so a time budget cuts the least important cases.
    q_pth, q_tq = (128, 96), (128,)
    cases = [("pth/rht_signs", lambda: case_pth_signs(gold_pth))]
    pth_order = [d for d in q_pth] + ([] if ARGS.quick else [d for d in PTH_DIMS if d not in q_pth])
    tq_order = list(q_tq) + ([] if ARGS.quick else [d for d in TQ_DIMS if d not in q_tq])
    for d in pth_order[:1]:
        cases.append((f"pth d={d}", lambda d=d: case_pth(gold_pth, d, PTH_DIMS.index(d))))
    for d in tq_order[:1]:
        ci = TQ_DIMS.index(d)
        cases.append((f"tq d={d} inputs", lambda ci=ci, d=d: case_tq_inputs(gold_tq, ci, d)))
        for p in TQ_PRESETS:
            cases.append((f"tq {p} d={d}", lambda ci=ci, d=d, p=p: case_tq(gold_tq, ci, d, p, hadamard)))
    for d in pth_order[1:]:
        cases.append((f"pth d={d}", lambda d=d: case_pth(gold_pth, d, PTH_DIMS.index(d))))
    for d in tq_order[1:]:
        ci = TQ_DIMS.index(d)
        cases.append((f"tq d={d} inputs", lambda ci=ci, d=d: case_tq_inputs(gold_tq, ci, d)))
        for p in TQ_PRESETS:
            cases.append((f"tq {p} d={d}", lambda ci=ci, d=d, p=p: case_tq(gold_tq, ci, d, p, hadamard)))

    for name, fn in cases:
        if BUDGET and time.time() - T0 > BUDGET:
            RESULTS.append({"case": name, "what": "SKIPPED", "expect": "info", "ok": False,
                            "note": f"time budget {BUDGET}s spent"})
            print(f"SKIP {name} (time budget)", flush=True)
            continue
        t = time.time()
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            record_error(name, e)
        print(f"---- {name}: {time.time() - t:.1f}s", flush=True)
        write_json()

    out = write_json(done=True)
    s = out["summary"]
    print(f"\nSUMMARY device={KIND} ({dev_name}) torch {torch.__version__} triton {triton.__version__}: "
          f"{len(RESULTS)} rows, exact rows equal {s['exact_rows_equal']}/{s['exact_rows']}, "
          f"errors {len(s['errors'])}, skipped {len(s['skipped'])}, info rows differing "
          f"{len(s['info_rows_differing'])}; decode_out bit-exact vs fixture {out['decode_out_bit_exact']}; "
          f"all_equal={out['all_equal']} all_ok={out['all_ok']} complete={out['complete']}; "
          f"{out['elapsed_s']}s -> {ARGS.out}", flush=True)
    for line in s["gating_rows_failed"] + s["errors"]:
        print("  FAILED:", line)
    for line in s["info_rows_differing"]:
        print("  info:", line)
    if not ARGS.keep_shim:
        shutil.rmtree(META["shim"], ignore_errors=True)
    return 0 if out["all_equal"] and out["all_ok"] and out["complete"] else 1


if __name__ == "__main__":
    sys.exit(main())
