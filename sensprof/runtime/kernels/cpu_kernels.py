"""Compiled CPU versions of the reference kernels, same signatures (contract.py; the source is cpu_kernels.c).

The C source is compiled on first use with the machine's C compiler (`$CC`, else cc / gcc / clang) and
cached under $SENSPROF_CACHE (default ~/.cache/sensprof) by a hash of the source, flags, compiler and CPU,
then loaded with ctypes: no torch headers, well under a second to build. ctypes checks nothing against the
C prototypes, so every function's argument and return types are declared in SIGNATURES (a test compares
them with cpu_kernels.c), and a library whose sp_abi_version() is not ABI_VERSION is refused.
`available()` says why the kernels cannot be used (no compiler, a failed or stale build), and `select`
then falls back to the reference.
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

from . import reference
from .contract import PackedRead, kivi_keys, kivi_values
from .reference import pack_bitplanes  # noqa: F401  (the store packs the other codecs; no faster in C)

NAME = "cpu"
NEEDS_POWER_OF_TWO_HEAD_DIM = False
SOURCE = Path(__file__).with_name("cpu_kernels.c")
_FLAGS = ["-O3", "-std=gnu11", "-pthread", "-fPIC", "-shared", "-ffp-contract=off", "-fno-math-errno", "-fopenmp-simd"]
_NATIVE = ["-march=native"]
_MAX_TOKEN_DIM = 1024  # sp_quantize_pack_tokens keeps one row of codes on the stack
ABI_VERSION = 1  # = SP_ABI_VERSION in cpu_kernels.c: bump both whenever a signature below changes

_P, _I64, _F32, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int


def _params(names: str, ctype) -> list:
    return [(name, ctype) for name in names.split()]


# Every exported C function: (return type, [(parameter, type)] in the prototype's order). Pointers and the
# int64 stride arrays are c_void_p: the wrappers below pass tensors' data pointers.
SIGNATURES = {
    "sp_abi_version": (_INT, []),
    "sp_init": (None, []),
    "sp_decode_attention": (_INT, _params("B Hq H D T Tt", _I64)
                            + _params("q kc kcs ks kss kz kzs vc vcs vs vss vz vzs kt vt", _P)
                            + _params("bits_k bits_v gk gv", _I64) + _params("scaling", _F32)
                            + _params("out", _P) + _params("threads", _I64)),
    "sp_unpack_float": (None, _params("B H T D bits", _I64) + _params("codes cs", _P) + _params("offset", _F32)
                        + _params("out", _P)),
    "sp_dequantize": (None, _params("B H T D bits", _I64) + _params("codes cs scale zero", _P)
                      + _params("channel group", _I64) + _params("offset", _F32) + _params("out", _P)),
    "sp_quantize_pack_tokens": (None, _params("N D g bits", _I64) + _params("x codes scale zero", _P)),
    "sp_quantize_pack_channels": (_INT, _params("N T D G bits", _I64) + _params("x codes scale zero", _P)),
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
    for extra in (_NATIVE, []):  # -march=native where the compiler knows it
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
            break  # the compiler failed: retry without the native flags
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
    """As many threads as torch uses for its own ops (torch.set_num_threads): the C code's one pool grows to
    this count (passed on every call) and starts no threads per call."""
    return torch.get_num_threads()


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


def decode_attention(q: torch.Tensor, k: PackedRead, v: PackedRead, k_tail: torch.Tensor, v_tail: torch.Tensor, *,
                     scaling: float, mask: torch.Tensor | None = None) -> torch.Tensor:
    b, hq, d = q.shape
    hkv, t = k.codes.shape[2], k.tokens
    if (mask is not None or not _readable(q, k.codes, v.codes) or not kivi_keys(k) or not kivi_values(v)
            or v.tokens != t or hq % hkv):
        return reference.decode_attention(q, k, v, k_tail, v_tail, scaling=scaling, mask=mask)
    q = q.float().contiguous()
    k_tail, v_tail = k_tail.float().contiguous(), v_tail.float().contiguous()
    kc, ks, kz, vc, vs, vz = (_row_major(x) for x in (k.codes, k.scale, k.zero, v.codes, v.scale, v.zero))
    out = torch.empty(b, hq, d, dtype=torch.float32)
    rc = _lib().sp_decode_attention(
        b, hq, hkv, d, t, k_tail.shape[2], _ptr(q),
        _ptr(kc), _strides(kc), _ptr(ks), _strides(ks), _ptr(kz), _strides(kz),
        _ptr(vc), _strides(vc), _ptr(vs), _strides(vs), _ptr(vz), _strides(vz),
        _ptr(k_tail), _ptr(v_tail), k.bits, v.bits, k.token_group, v.channel_group, float(scaling), _ptr(out),
        _threads())
    if rc:
        raise MemoryError("sp_decode_attention could not allocate its work space")
    return out
