"""Compiled CPU versions of the reference kernels, same signatures (contract.py; the source is cpu_kernels.c).

The C source is compiled on first use with the machine's C compiler (`$CC`, else cc / gcc / clang) and
cached under $SENSPROF_CACHE (default ~/.cache/sensprof) by a hash of the source, flags, compiler and CPU,
then loaded with ctypes: no torch headers, well under a second to build. ctypes checks nothing against the
C prototypes, so every function's argument and return types are declared in SIGNATURES (a test compares
them with cpu_kernels.c), and a library whose sp_abi_version() is not ABI_VERSION is refused.
Built with OpenMP where the compiler has it, a decode call runs on torch's own OpenMP threads (threading();
SENSPROF_OPENMP=0 builds without, on the C code's own pool). `available()` says why the kernels cannot be used
(no compiler, a failed or stale build), and `select` then falls back to the reference. decode_attention reads
every PackedRead layout itself (the KIVI layouts through their fused loops, the others tile by tile), with the
read mask and RoPE.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from ...engines.vllm.per_token_head import largest_pow2_divisor, rht_signs
from . import reference
from .contract import PackedRead, kivi_keys, kivi_values
from .reference import pack_bitplanes  # noqa: F401  (the store packs the other codecs; no faster in C)

NAME = "cpu"
NEEDS_POWER_OF_TWO_HEAD_DIM = False
SOURCE = Path(__file__).with_name("cpu_kernels.c")
_FLAGS = ["-O3", "-std=gnu11", "-pthread", "-fPIC", "-shared", "-ffp-contract=off", "-fno-math-errno", "-fopenmp-simd"]
# tried in order: -march=native where the compiler knows it; OpenMP (torch's threads, see threading()) where it has it,
# unless $SENSPROF_OPENMP is 0 (the C code's own thread pool then)
_VARIANTS = (["-march=native", "-fopenmp"], ["-march=native"], [])
_MAX_TOKEN_DIM = 1024  # sp_quantize_pack_tokens keeps one row of codes on the stack
_MAX_PACKED_DIM = 1024  # sp_decode_packed: SP_MAXCHUNKS * 8
ABI_VERSION = 6  # = SP_ABI_VERSION in cpu_kernels.c: bump both whenever a signature below changes

_P, _I64, _F32, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int


def _params(names: str, ctype) -> list:
    return [(name, ctype) for name in names.split()]


# Every exported C function: (return type, [(parameter, type)] in the prototype's order). Pointers and the
# int64 stride arrays are c_void_p: the wrappers below pass tensors' data pointers.
SIGNATURES = {
    "sp_abi_version": (_INT, []),
    "sp_init": (None, []),
    "sp_threading": (_INT, []),
    "sp_decode_attention": (_INT, _params("B Hq H D T Tt", _I64)
                            + _params("q kc kcs ks kss kz kzs vc vcs vs vss vz vzs kt vt mask", _P)
                            + _params("bits_k bits_v gk gv", _I64) + _params("scaling", _F32)
                            + _params("out", _P) + _params("threads", _I64)),
    "sp_decode_packed": (_INT, _params("B Hq H D T Tt", _I64) + _params("q kp kf", _P) + _params("koff", _F32)
                         + _params("vp vf", _P) + _params("voff", _F32) + _params("kt vt mask", _P)
                         + _params("scaling", _F32) + _params("out", _P) + _params("threads", _I64)),
    "sp_unpack_float": (None, _params("B H T D bits", _I64) + _params("codes cs", _P) + _params("offset", _F32)
                        + _params("out", _P)),
    "sp_dequantize": (None, _params("B H T D bits", _I64) + _params("codes cs scale zero", _P)
                      + _params("channel group", _I64) + _params("offset", _F32) + _params("out", _P)),
    "sp_quantize_pack_tokens": (None, _params("N D g bits", _I64) + _params("x codes scale zero", _P)),
    "sp_quantize_pack_channels": (_INT, _params("N T D G bits", _I64) + _params("x codes scale zero", _P)),
    "sp_quantize_int4_rht": (None, _params("N D rnd", _I64) + _params("x signs codes word", _P)),
}


class BuildError(RuntimeError):
    pass


def _compiler() -> str:
    cc = os.environ.get("CC")
    if cc:
        found = shutil.which(cc)
        if not found:
            raise BuildError(f"the C compiler $CC={cc!r} was not found")
        return found
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return found
    raise BuildError("no C compiler found (cc, gcc or clang; or set $CC)")


def _cpu_id() -> str:
    """What -march=native depends on, so a cache shared between machines never loads a foreign build."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return "\n".join(sorted({ln for ln in lines if ln.startswith(("model name", "flags", "Features"))}))
    except OSError:
        return platform.processor() + platform.machine()


def cache_dir() -> Path:
    root = os.environ.get("SENSPROF_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "sensprof")
    return Path(root) / "kernels"


def _build(cc: str) -> Path:
    try:
        source = SOURCE.read_bytes()
    except OSError as e:
        raise BuildError(f"the kernel source is missing ({e}); reinstall sensprof") from e
    why = "no writable cache folder"
    no_openmp = os.environ.get("SENSPROF_OPENMP") == "0"
    for extra in (v for v in _VARIANTS if not (no_openmp and "-fopenmp" in v)):
        flags = _FLAGS + extra
        key = hashlib.sha256(b"\0".join([source, " ".join(flags).encode(), cc.encode(), _cpu_id().encode()]))
        for folder in (cache_dir(), Path(tempfile.gettempdir()) / f"sensprof-kernels-{os.getuid()}"):
            target = folder / f"cpu_kernels-{key.hexdigest()[:16]}.so"
            if target.exists():
                return target
            try:
                folder.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
                os.close(fd)
            except OSError:
                continue  # an unwritable cache: try the next folder
            try:
                done = subprocess.run([cc, *flags, "-o", tmp, str(SOURCE), "-lm"], capture_output=True, text=True,
                                      timeout=120)
                if done.returncode == 0:
                    os.replace(tmp, target)  # atomic: a concurrent build never loads half a file
                    return target
                why = (done.stderr.strip().splitlines() or ["no output"])[-1]
            except (OSError, subprocess.TimeoutExpired) as e:
                why = str(e)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            break  # the compiler failed: retry with fewer flags
    raise BuildError(f"compiling {SOURCE.name} failed: {why}")


@functools.lru_cache(maxsize=1)
def _load():
    """The compiled library, or the BuildError that says why there is none."""
    try:
        path = _build(_compiler())
        lib = ctypes.CDLL(str(path))
    except BuildError as e:
        return e
    except OSError as e:
        return BuildError(f"loading the compiled kernels failed: {e}")
    try:
        for name, (restype, params) in SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, [ctype for _, ctype in params]
    except AttributeError as e:
        return BuildError(f"{path} is a stale build ({e}); delete it")
    version = lib.sp_abi_version()
    if version != ABI_VERSION:
        return BuildError(f"{path} is a stale build (ABI version {version}, this sensprof needs {ABI_VERSION}); "
                          "delete it")
    lib.sp_init()
    return lib


def available() -> str | None:
    """None when the compiled kernels load, else why not (one line)."""
    lib = _load()
    return str(lib) if isinstance(lib, BuildError) else None


def _lib():
    lib = _load()
    if isinstance(lib, BuildError):
        raise lib
    return lib


def _threads() -> int:
    """As many threads as torch uses for its own ops (torch.set_num_threads), passed on every call."""
    return torch.get_num_threads()


def threading() -> str:
    """Whose threads run a decode call's items: "openmp" (the calling thread's OpenMP team: torch's own threads,
    where the build has OpenMP and torch's libgomp is the one loaded) or "pthreads" (the C code's one pool, grown
    to the count a call asks for, which starts no threads per call)."""
    return "openmp" if _lib().sp_threading() else "pthreads"


def _ptr(t: torch.Tensor):
    return ctypes.c_void_p(t.data_ptr())


def _strides(t: torch.Tensor):
    return (ctypes.c_int64 * t.dim())(*t.stride())


def _row_major(t: torch.Tensor) -> torch.Tensor:
    """The C code indexes with strides but needs the last dim contiguous."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _readable(*tensors) -> bool:
    return all(t.device.type == "cpu" for t in tensors)


def unpack_float(packed: torch.Tensor, bits: int, offset: float = 0.0) -> torch.Tensor:
    if packed.dim() != 5 or not _readable(packed):
        return reference.unpack_float(packed, bits, offset)
    packed = _row_major(packed)
    _, b, h, t, nb = packed.shape
    out = torch.empty(b, h, t, nb * 8, dtype=torch.float32)
    _lib().sp_unpack_float(b, h, t, nb * 8, bits, _ptr(packed), _strides(packed), float(offset), _ptr(out))
    return out


def _dequantize(codes, scale, zero, bits, group, offset, channel):
    _, b, h, t, nb = codes.shape
    codes = _row_major(codes)
    scale = scale.float().contiguous()
    zero = None if zero is None else zero.float().contiguous()
    out = torch.empty(b, h, t, nb * 8, dtype=torch.float32)
    _lib().sp_dequantize(b, h, t, nb * 8, bits, _ptr(codes), _strides(codes), _ptr(scale),
                         None if zero is None else _ptr(zero), int(channel), group, float(offset), _ptr(out))
    return out


def dequantize_tokens(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None, bits: int, group: int,
                      offset: float = 0.0) -> torch.Tensor:
    if not _readable(codes):
        return reference.dequantize_tokens(codes, scale, zero, bits, group, offset)
    return _dequantize(codes, scale, zero, bits, group, offset, channel=False)


def dequantize_channels(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None, bits: int, group: int,
                        offset: float = 0.0) -> torch.Tensor:
    if not _readable(codes) or codes.shape[3] % group:
        return reference.dequantize_channels(codes, scale, zero, bits, group, offset)
    return _dequantize(codes, scale, zero, bits, group, offset, channel=True)


def quantize_pack_tokens(x: torch.Tensor, bits: int, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n, d = x.shape
    if not _readable(x) or d > _MAX_TOKEN_DIM or d % group or d % 8:
        return reference.quantize_pack_tokens(x, bits, group)
    x = x.float().contiguous()
    codes = torch.empty(bits, n, d // 8, dtype=torch.uint8)
    scale = torch.empty(n, d // group, dtype=torch.float16)
    zero = torch.empty(n, d // group, dtype=torch.float16)
    _lib().sp_quantize_pack_tokens(n, d, group, bits, _ptr(x), _ptr(codes), _ptr(scale), _ptr(zero))
    return codes, scale, zero


def quantize_pack_channels(x: torch.Tensor, bits: int, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n, t, d = x.shape
    if not _readable(x) or t % group or d % 8:
        return reference.quantize_pack_channels(x, bits, group)
    x = x.float().contiguous()
    codes = torch.empty(bits, n, t, d // 8, dtype=torch.uint8)
    scale = torch.empty(n, t // group, d, dtype=torch.float16)
    zero = torch.empty(n, t // group, d, dtype=torch.float16)
    if _lib().sp_quantize_pack_channels(n, t, d, group, bits, _ptr(x), _ptr(codes), _ptr(scale), _ptr(zero)):
        raise MemoryError("sp_quantize_pack_channels could not allocate its work space")
    return codes, scale, zero


# a model dtype as the C code names it: sp_quantize_int4_rht's rounding (rnd), SP_R_DENSE's element type
_FLOAT_KINDS = {torch.float32: 1, torch.float16: 2, torch.bfloat16: 3}


def quantize_pack_int4_rht(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n, d = x.shape
    if not _readable(x) or x.dtype not in _FLOAT_KINDS or d % 8 or d > _MAX_TOKEN_DIM:
        return reference.quantize_pack_int4_rht(x)
    xf = x.float().contiguous()
    signs = rht_signs(largest_pow2_divisor(d)).float().contiguous()
    codes = torch.empty(4, n, d // 8, dtype=torch.uint8)
    word = torch.empty(n, dtype=torch.float32)
    _lib().sp_quantize_int4_rht(n, d, _FLOAT_KINDS[x.dtype], _ptr(xf), _ptr(signs), _ptr(codes), _ptr(word))
    return codes, word


# The fields of a PackedRead as sp_decode_packed reads them (the SP_R_* enum of cpu_kernels.c, in its order)
_READ_FIELDS = 26
_LUT_DTYPES = (torch.float16, torch.float32)
# fp8's own code tables (the C code converts those bytes without a gather), as int32 bit patterns (NaNs included)
_FP8_TABLES = {kind: torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).float().view(torch.int32)
               for kind, dtype in ((1, torch.float8_e4m3fn), (2, torch.float8_e5m2))}


def _fp8_kind(r: PackedRead, lut: torch.Tensor) -> int:
    if r.packing != "bytes" or r.offset is not None or lut.numel() != 256:
        return 0
    bits = lut.view(torch.int32)
    return next((kind for kind, table in _FP8_TABLES.items() if torch.equal(bits, table)), 0)


def _param(x: torch.Tensor | None) -> torch.Tensor | None:
    """Scales and zero-points are read as fp16 or fp32 with any strides (0 for a constant): others as fp32."""
    return x if x is None or x.dtype in _LUT_DTYPES else x.float()


def _describe(r: PackedRead, b: int, h: int, t: int, d: int):
    """(pointers, fields, offset, tensors to keep alive) of a read for sp_decode_packed, or None where the C code
    cannot read it (then the reference does)."""
    codes, scale, zero = _row_major(r.codes), _param(r.scale), _param(r.zero)
    affine = r.offset is not None
    lut = r.lut.float().contiguous()
    dense = r.packing == "dense"
    if dense:
        if codes.dtype not in _FLOAT_KINDS or tuple(codes.shape) != (b, h, t, d):
            return None
    elif (codes.dtype != torch.uint8 or not 1 <= r.bits <= 8 or r.token_group < 1 or r.channel_group < 1
            or (not affine and lut.numel() < (256 if r.packing == "bytes" else 2 ** r.bits))):
        return None
    if r.wide and (r.packing != "planes" or affine or r.bits > 6 or r.wide % 8 or r.wide > d
                   or lut.numel() < 2 ** (r.bits + 1) + 2 ** r.bits):
        return None
    if r.word and (r.token_group != 1 or r.channel_group != d or zero is not None or scale.dtype != torch.float32):
        return None  # a word is one fp32 per token and head
    groups = (-(-t // r.token_group), -(-d // r.channel_group))
    for x in (scale, zero):  # every index the kernel forms stays inside the tensor
        if x is not None and (x.dim() != 4 or tuple(x.shape[:2]) != (b, h) or x.shape[2] < groups[0]
                              or x.shape[3] < groups[1]):
            return None
    if dense:  # strides in bytes: the C code steps a byte pointer
        cs = (0, *(x * codes.element_size() for x in codes.stride()[:3]))
    elif r.packing == "bytes":
        if tuple(codes.shape) != (b, h, t, d):
            return None
        cs = (0, *codes.stride()[:3])
    else:
        if tuple(codes.shape) != (r.bits, b, h, t, d // 8):
            return None
        cs = codes.stride()[:4]
    cos = sin = None
    rope, rs = 0, (0, 0)
    if r.rope is not None:
        cos, sin = (_row_major(x.float()) for x in r.rope)
        rope = 2 * cos.shape[-1]
        if (cos.shape != sin.shape or tuple(cos.shape) != (b, t, rope // 2) or rope > d or cos.stride() != sin.stride()):
            return None
        rs = cos.stride()[:2]
    zs = (0, 0, 0, 0) if zero is None else zero.stride()
    fields = (int(r.packing == "bytes"), r.bits, r.token_group, r.channel_group, int(affine),
              int(scale.dtype == torch.float32), int(zero is not None and zero.dtype == torch.float32), rope,
              *cs, *scale.stride(), *zs, *rs, _fp8_kind(r, lut), int(r.word), _FLOAT_KINDS.get(codes.dtype, 0) * dense,
              r.wide)
    assert len(fields) == _READ_FIELDS
    keep = (codes, lut, scale, zero, cos, sin)
    ptrs = (ctypes.c_void_p * 6)(*[None if x is None else x.data_ptr() for x in keep])
    return ptrs, (ctypes.c_int64 * _READ_FIELDS)(*fields), float(r.offset or 0.0), keep


def _memo(r: PackedRead, key: str, make):
    """make(r), computed once per read: a layer hands the kernel the same reads on every step until they change."""
    if key not in r.memo:
        r.memo[key] = make(r)
    return r.memo[key]


def _kivi_args(r: PackedRead) -> tuple[tuple, tuple]:
    """(pointers and strides of a KIVI read's codes, scale and zero as sp_decode_attention takes them, the tensors
    they point into: kept alive with them)."""
    tensors = tuple(_row_major(x) for x in (r.codes, r.scale, r.zero))
    return tuple(a for x in tensors for a in (_ptr(x), _strides(x))), tensors


def decode_attention(q: torch.Tensor, k: PackedRead, v: PackedRead, k_tail: torch.Tensor, v_tail: torch.Tensor, *,
                     scaling: float, mask: torch.Tensor | None = None) -> torch.Tensor:
    """KIVI layouts (contract.kivi_keys / kivi_values) through sp_decode_attention's fused loops; any other layout
    through sp_decode_packed (tiles of dequantized tokens); the reference for what neither reads (GPU tensors, a
    head dim that is not a multiple of 8, a lut too short for the codes)."""
    b, hq, d = q.shape
    hkv, t, tt = k_tail.shape[1], k.tokens, k_tail.shape[2]
    tensors = [q, k.codes, v.codes, k_tail, v_tail] + ([] if mask is None else [mask])
    fallback = (not _readable(*tensors) or v.tokens != t or hq % hkv or d % 8 or k.head_dim != d or v.head_dim != d
                or d > _MAX_PACKED_DIM or v.rope is not None  # RoPE is the keys' (the reference rotates anything)
                or (mask is not None and tuple(mask.shape) != (b, t + tt)))
    if fallback:
        return reference.decode_attention(q, k, v, k_tail, v_tail, scaling=scaling, mask=mask)
    q = q.float().contiguous()
    k_tail, v_tail = k_tail.float().contiguous(), v_tail.float().contiguous()
    read_mask = None if mask is None else mask.to(torch.uint8).contiguous()
    mp = None if read_mask is None else _ptr(read_mask)
    out = torch.empty(b, hq, d, dtype=torch.float32)
    if kivi_keys(k) and kivi_values(v):
        rc = _lib().sp_decode_attention(
            b, hq, hkv, d, t, tt, _ptr(q), *_memo(k, "kivi", _kivi_args)[0], *_memo(v, "kivi", _kivi_args)[0],
            _ptr(k_tail), _ptr(v_tail), mp, k.bits, v.bits, k.token_group, v.channel_group, float(scaling),
            _ptr(out), _threads())
    else:
        kr, vr = (_memo(r, "packed", lambda r: _describe(r, b, hkv, t, d)) for r in (k, v))
        if kr is None or vr is None:
            return reference.decode_attention(q, k, v, k_tail, v_tail, scaling=scaling, mask=mask)
        rc = _lib().sp_decode_packed(b, hq, hkv, d, t, tt, _ptr(q), kr[0], kr[1], kr[2], vr[0], vr[1], vr[2],
                                     _ptr(k_tail), _ptr(v_tail), mp, float(scaling), _ptr(out), _threads())
    if rc:
        raise MemoryError("the decode kernel could not allocate its work space")
    return out
