"""The compiled CPU kernels (cpu_kernels.c) against their PyTorch references.

Quantize-and-pack must be bit-exact (the runtime stores what the profile measured); decode attention
within float tolerance, on every code path of the C file: the AVX2 loops and the portable ones (built
without -march=native), query heads per KV head up to 8 and beyond, value groups that are and are not
multiples of 8, strided views, and long contexts split across threads (torch's OpenMP team, or the C
code's one pool; shared by concurrent callers, renewed in a forked child). Then the binding and the build:
the ctypes table against the C prototypes, a library of another ABI version, the cache, a missing compiler
and a failing one.
"""

import ctypes
import os
import re
import select
import shutil
import subprocess
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from runtime.kernels.packed import packed_cache
from runtime.plans import decode_logprobs, make_plan

from sensprof.errors import SensprofError
from sensprof.runtime import kernels
from sensprof.runtime.kernels import cpu_kernels, reference

needs_compiler = pytest.mark.skipif(cpu_kernels.available() is not None,
                                    reason=f"the compiled CPU kernels cannot build here: {cpu_kernels.available()}")


@pytest.fixture
def fresh_build(tmp_path, monkeypatch):
    """An empty kernel cache and no loaded library; the suite's own library is restored afterwards."""
    monkeypatch.setenv("SENSPROF_CACHE", str(tmp_path / "cache"))
    cpu_kernels._load.cache_clear()
    monkeypatch.setattr(kernels, "_warned", set())
    yield tmp_path
    cpu_kernels._load.cache_clear()


def _close(a, b, tol=2e-5):
    err = ((a - b).abs().max() / b.abs().max()).item()
    assert err < tol, err


@needs_compiler
@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("group", [8, 32, 64])
def test_quantize_pack_tokens_is_bit_exact(bits, group):
    g = torch.Generator().manual_seed(bits * group)
    x = torch.randn(37, 128, generator=g) * torch.rand(37, 1, generator=g) * 5
    x[3] = 1.5  # a constant row: zero scale
    x[4, :group] = torch.tensor(1e-6).expand(group) * torch.arange(group)  # a tiny range: fp16 subnormal scale
    for got, want in zip(cpu_kernels.quantize_pack_tokens(x, bits, group), reference.quantize_pack_tokens(x, bits, group)):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


@needs_compiler
@pytest.mark.parametrize("bits", range(1, 9))
def test_quantize_pack_channels_is_bit_exact(bits):
    g = torch.Generator().manual_seed(bits)
    x = torch.randn(6, 96, 64, generator=g) * 3
    x[1, :32, 5] = -2.0  # a constant channel within a group
    for group in (32, 96):
        got, want = cpu_kernels.quantize_pack_channels(x, bits, group), reference.quantize_pack_channels(x, bits, group)
        for a, b in zip(got, want):
            assert a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@needs_compiler
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [64, 128, 96, 24])
def test_vllm_int4_per_token_head_write_is_bit_exact(dtype, d):
    """The C write of vLLM's int4_per_token_head (rotation, rounding to the model dtype, codes, the fp32 word) equals
    the emulation's for rows of every magnitude, quarter-step values (rounding ties), a constant row (the scale's
    floor) and block sizes below the head dim (96, 24: blocks of 32 and 8)."""
    g = torch.Generator().manual_seed(d)
    x = torch.randn(300, d, generator=g) * 10.0 ** torch.randint(-4, 4, (300, 1), generator=g).float()
    x[:100] = torch.round(x[:100] * 4) / 4
    x[100] = 0.75
    x = x.to(dtype)
    (codes, word), (want_codes, want_word) = cpu_kernels.quantize_pack_int4_rht(x), reference.quantize_pack_int4_rht(x)
    assert codes.shape == want_codes.shape == (4, 300, d // 8) and torch.equal(codes, want_codes)
    assert word.shape == want_word.shape == (300,) and torch.equal(word.view(torch.int32), want_word.view(torch.int32))


@needs_compiler
def test_half_rounding_matches_torch_at_the_edges():
    """Scales and zero-points are rounded to fp16 in C: ties to even, subnormals, overflow to infinity."""
    edges = torch.tensor([0.0, -0.0, 1e-8, 2.0**-25, 2.0**-25 * 1.0001, 2.0**-24 * 1.5, 2.0**-24 * 2.5, 6.1e-5,
                          6.0975552e-05, 65504.0, 65519.0, 65520.0, 1e9, 3.14159, -2.5e-6, 1.0009765625 + 2**-11])
    x = torch.stack([torch.zeros_like(edges), edges], 1).repeat(1, 4)  # groups of 2: scale = v / levels, zero = min
    for sign in (1, -1):
        for bits in (1, 8):
            got, want = cpu_kernels.quantize_pack_tokens(sign * x, bits, 2), reference.quantize_pack_tokens(sign * x, bits, 2)
            for a, b in zip(got, want):
                assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), (sign, bits)


CASES = [  # b, hq, hkv, t, tail, d, bits_k, bits_v, gk, gv
    (1, 9, 3, 256, 17, 64, 4, 4, 32, 32),   # smollm2's shape
    (2, 8, 2, 96, 0, 128, 3, 5, 32, 64),    # no tail, two sequences
    (1, 4, 4, 64, 5, 64, 8, 2, 32, 16),     # one query head per KV head
    (2, 6, 3, 32, 3, 32, 2, 8, 16, 32),     # head dim 32
    (1, 20, 2, 64, 4, 96, 5, 3, 32, 32),    # 10 query heads per KV head: the loops without register accumulators
    (1, 4, 2, 64, 4, 64, 6, 7, 64, 4),      # value groups of 4 channels: the portable value loop
    (1, 2, 1, 32, 1, 8, 1, 1, 32, 8),       # 1-bit codes, head dim 8
]


@needs_compiler
@pytest.mark.parametrize("case", CASES, ids=lambda c: "b{}_hq{}_hkv{}_t{}_tail{}_d{}_k{}v{}_gk{}gv{}".format(*c))
def test_decode_attention_matches_the_reference(case):
    args, kw, _ = packed_cache(*case)
    _close(cpu_kernels.decode_attention(**args, **kw), reference.decode_attention(**args, **kw))


@needs_compiler
def test_decode_attention_reads_strided_views():
    """The runtime passes slices of the merged chunk (whole key groups), not copies."""
    args, kw, _ = packed_cache(2, 6, 3, 128, 7, 64, 4, 3, 32, 32)
    view = dict(args, k=args["k"].narrow(32, 96), v=args["v"].narrow(32, 96))
    assert not view["k"].codes.is_contiguous() and not view["v"].scale.is_contiguous()
    _close(cpu_kernels.decode_attention(**view, **kw), reference.decode_attention(**view, **kw))


@needs_compiler
def test_a_reads_description_is_made_once_and_a_narrowed_read_gets_its_own():
    """The C arguments a read needs are kept on the read (a layer hands the same reads to every step until they
    change); a narrowed read is another read, described afresh."""
    args, kw, _ = packed_cache(1, 9, 3, 128, 7, 64, 4, 3, 32, 32)
    first = cpu_kernels.decode_attention(**args, **kw)
    described = dict(args["k"].memo)
    assert described and torch.equal(cpu_kernels.decode_attention(**args, **kw), first)
    assert args["k"].memo.keys() == described.keys() and all(args["k"].memo[x] is described[x] for x in described)
    view = dict(args, k=args["k"].narrow(32, 96), v=args["v"].narrow(32, 96))
    assert view["k"].memo == {}
    _close(cpu_kernels.decode_attention(**view, **kw), reference.decode_attention(**view, **kw))


@needs_compiler
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_long_contexts_split_across_threads_give_the_same_attention(threads, monkeypatch):
    """Split-K: slices of one head on different threads, merged by log-sum-exp (the tail in the last slice)."""
    monkeypatch.setattr(cpu_kernels, "_threads", lambda: threads)
    for case in [(1, 9, 3, 4096, 17, 64, 4, 4, 32, 32), (2, 4, 1, 2112, 0, 128, 3, 5, 32, 64)]:
        args, kw, _ = packed_cache(*case)
        _close(cpu_kernels.decode_attention(**args, **kw), reference.decode_attention(**args, **kw), 1e-4)


def _threads_named(name: str | None = None) -> set:
    """Thread ids of this process (those named `name`: the C code names its pool's workers sp-kernels)."""
    tasks = "/proc/self/task"
    return {tid for tid in os.listdir(tasks) if name is None or open(f"{tasks}/{tid}/comm").read().strip() == name}


@pytest.fixture(params=["default", "pthreads"])
def threads_of(request, monkeypatch):
    """The suite's build (OpenMP where the compiler has it) and a fresh one without OpenMP (the C code's own pool)."""
    if request.param == "pthreads":
        request.getfixturevalue("fresh_build")
        monkeypatch.setenv("SENSPROF_OPENMP", "0")
    assert cpu_kernels.available() is None
    return request.param


@needs_compiler
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads in /proc")
def test_later_calls_start_no_threads_and_give_the_same_result(threads_of, monkeypatch):
    """Torch's thread count sizes the threads of the first call: later calls start none, and give the same bits."""
    monkeypatch.setattr(cpu_kernels, "_threads", lambda: 3)
    args, kw, _ = packed_cache(1, 9, 3, 4096, 17, 64, 4, 4, 32, 32)
    first = cpu_kernels.decode_attention(**args, **kw)
    _close(first, reference.decode_attention(**args, **kw), 1e-4)
    alive = _threads_named()
    for _ in range(3):
        assert torch.equal(cpu_kernels.decode_attention(**args, **kw), first)
    assert _threads_named() == alive
    if threads_of == "pthreads":
        assert cpu_kernels.threading() == "pthreads"
        assert len(_threads_named("sp-kernels")) >= 2  # 3 threads: this one and two workers, alive between calls


@needs_compiler
@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("gcc") is None,
                    reason="reads /proc/self/maps; GCC's OpenMP")
def test_the_kernels_run_on_torchs_own_openmp_threads():
    """Built with OpenMP, the kernels load no second OpenMP runtime: their parallel regions reuse torch's team,
    whose workers are still spinning after torch's last op (threads of their own would compete with them). Checked
    in a fresh process, before and after the kernels load: other libraries bring their own (transformers 5.17
    imports scikit-learn, which maps its own libgomp), which is not the kernels' doing."""
    assert cpu_kernels.threading() == "openmp"
    script = (
        "import re, torch, transformers\n"
        "gomp = lambda: set(re.findall(r'\\S*/libgomp[^/\\s]*', open('/proc/self/maps').read()))\n"
        "before = gomp()\n"
        "from sensprof.runtime.kernels import cpu_kernels\n"
        "assert cpu_kernels.threading() == 'openmp'\n"
        "print(sorted(before)); print(sorted(gomp() - before))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    torch_gomp, added = out.stdout.splitlines()[-2:]
    assert "torch/lib/libgomp" in torch_gomp  # torch's own runtime is the one there to reuse
    assert added == "[]", f"the kernels loaded another OpenMP runtime: {added}"


@needs_compiler
def test_concurrent_callers_get_the_single_callers_result(threads_of, monkeypatch):
    """ctypes releases the GIL: callers from several Python threads share the pool (or run alone), same bits."""
    monkeypatch.setattr(cpu_kernels, "_threads", lambda: 3)
    args, kw, _ = packed_cache(2, 4, 1, 2112, 0, 128, 3, 5, 32, 64)
    want = cpu_kernels.decode_attention(**args, **kw)
    with ThreadPoolExecutor(4) as ex:
        got = list(ex.map(lambda _: cpu_kernels.decode_attention(**args, **kw), range(8)))
    assert all(torch.equal(g, want) for g in got)


@needs_compiler
@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_forked_child_starts_a_pool_of_its_own(monkeypatch):
    """The parent's workers (its pool's, or OpenMP's) do not exist in a forked child (multiprocessing, data loaders): it
    must not wait on them, and runs on a pool of its own."""
    monkeypatch.setattr(cpu_kernels, "_threads", lambda: 3)
    args, kw, _ = packed_cache(1, 9, 3, 4096, 17, 64, 4, 4, 32, 32)
    want = cpu_kernels.decode_attention(**args, **kw)  # the parent's pool is running
    r, w = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork() of a multi-threaded process
        pid = os.fork()
    if pid == 0:
        try:
            same = torch.equal(cpu_kernels.decode_attention(**args, **kw), want)
            os.write(w, b"1" if same and cpu_kernels.threading() == "pthreads" else b"0")
        finally:
            os._exit(0)
    os.close(w)
    answered = select.select([r], [], [], 120)[0]
    if not answered:
        os.kill(pid, 9)
    os.waitpid(pid, 0)
    assert answered and os.read(r, 1) == b"1"
    os.close(r)


def _c_prototypes() -> dict:
    """Exported functions of cpu_kernels.c: name -> (return ctype, [(parameter, ctype)])."""
    ctypes_of = {"int64_t": ctypes.c_int64, "float": ctypes.c_float, "int": ctypes.c_int, "void": None}
    found = {}
    for ret, name, params in re.findall(r"^(\w+) (\w+)\(([^)]*)\)\s*\{", cpu_kernels.SOURCE.read_text(), re.M):
        args = []
        for param in [] if params.strip() == "void" else params.split(","):
            ctype, pname = param.rsplit(None, 1)
            args.append((pname.lstrip("*"), ctypes.c_void_p if "*" in param else ctypes_of[ctype.strip()]))
        found[name] = (ctypes_of[ret], args)
    return found


def test_the_ctypes_table_declares_every_c_function_parameter_for_parameter():
    """ctypes checks nothing itself: a wrong or missing type here would corrupt memory, not raise."""
    assert _c_prototypes() == cpu_kernels.SIGNATURES
    version = re.search(r"#define SP_ABI_VERSION (\d+)", cpu_kernels.SOURCE.read_text())
    assert int(version.group(1)) == cpu_kernels.ABI_VERSION


_VERSION_LINE = f"#define SP_ABI_VERSION {cpu_kernels.ABI_VERSION} "
_VERSION_FUNCTION = "int sp_abi_version(void) { return SP_ABI_VERSION; }"


@needs_compiler
@pytest.mark.parametrize("old,new,reason", [
    (_VERSION_LINE, _VERSION_LINE.replace(f" {cpu_kernels.ABI_VERSION} ", f" {cpu_kernels.ABI_VERSION + 1} "),
     f"ABI version {cpu_kernels.ABI_VERSION + 1}"),
    (_VERSION_FUNCTION, "", "sp_abi_version"),  # built before the library had a version
], ids=["another-version", "no-version"])
def test_a_stale_library_is_refused(old, new, reason, fresh_build, monkeypatch):
    """A build of other signatures never runs with this table's: available() says why, select refuses it."""
    source = cpu_kernels.SOURCE.read_text()
    assert old in source
    stale = fresh_build / "cpu_kernels.c"
    stale.write_text(source.replace(old, new))
    monkeypatch.setattr(cpu_kernels, "SOURCE", stale)
    why = cpu_kernels.available()
    assert why and "stale build" in why and reason in why and "delete it" in why
    with pytest.raises(SensprofError, match="stale build"):
        kernels.select("cpu", "cpu")


@needs_compiler
def test_portable_build_without_native_instructions_matches(fresh_build, monkeypatch):
    """Built without -march=native: the scalar loops and the portable fp16 conversion."""
    monkeypatch.setattr(cpu_kernels, "_VARIANTS", ([],))
    assert cpu_kernels.available() is None
    for case in CASES[:5] + [(1, 9, 3, 4096, 17, 64, 4, 4, 32, 32)]:
        args, kw, _ = packed_cache(*case)
        _close(cpu_kernels.decode_attention(**args, **kw), reference.decode_attention(**args, **kw), 1e-4)
    x = torch.randn(19, 64) * 3
    for a, b in zip(cpu_kernels.quantize_pack_tokens(x, 3, 32), reference.quantize_pack_tokens(x, 3, 32)):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@needs_compiler
def test_the_build_is_cached_and_reused_without_the_compiler(fresh_build, monkeypatch):
    assert cpu_kernels.available() is None
    built = [p.name for p in (fresh_build / "cache" / "kernels").iterdir()]
    assert len(built) == 1 and built[0].startswith("cpu_kernels-") and built[0].endswith(".so")  # no temporaries

    def no_compiler(*a, **k):
        raise AssertionError("compiled again")

    monkeypatch.setattr(cpu_kernels.subprocess, "run", no_compiler)
    cpu_kernels._load.cache_clear()
    assert cpu_kernels.available() is None


def test_without_a_compiler_auto_falls_back_with_one_warning_and_cpu_is_an_error(fresh_build, monkeypatch):
    monkeypatch.setenv("CC", str(fresh_build / "no-such-cc"))
    assert "no-such-cc" in cpu_kernels.available()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert kernels.select("auto", "cpu") is reference
        assert kernels.select("auto", "cpu") is reference
    msgs = [str(w.message) for w in caught]
    assert len(msgs) == 1 and "compiled CPU kernels cannot be used" in msgs[0] and "reference" in msgs[0]
    with pytest.raises(SensprofError, match="install a C compiler, or choose --kernels reference"):
        kernels.select("cpu", "cpu")


def test_a_failing_compiler_is_reported_in_one_line(fresh_build, monkeypatch):
    cc = fresh_build / "broken-cc"
    cc.write_text("#!/bin/sh\necho 'cpu_kernels.c:1: error: this compiler is broken' >&2\nexit 1\n")
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    why = cpu_kernels.available()
    assert why.startswith("compiling cpu_kernels.c failed") and "this compiler is broken" in why and "\n" not in why
    assert not list((fresh_build / "cache").rglob("*.so"))  # nothing half-written is left to load


@needs_compiler
def test_planned_cache_decodes_through_the_cpu_kernels_as_through_the_reference():
    """End to end: quantize-and-pack on append and packed decode attention, both compiled."""
    from conftest import make_tiny_model

    from sensprof.runtime import PlannedCache

    model = make_tiny_model("llama")
    plan = make_plan(model, [("int4_c32", "int4_t32"), ("int2_c32_r8", "int3_t32_s2"), ("none", "int8_t32")],
                     [{}] * 3)
    ids = torch.randint(3, 300, (2, 72), generator=torch.Generator().manual_seed(5))
    ref_cache = PlannedCache.from_plan(plan, model, kernels="reference")
    ref = decode_logprobs(model, ref_cache, ids)
    cache = PlannedCache.from_plan(plan, model, kernels="cpu")
    got = decode_logprobs(model, cache, ids)
    assert cache.layers[0].kernels is cpu_kernels and cache.layers[0].k_store.kernels is cpu_kernels
    assert sum(layer.packed_steps for layer in cache.layers) > 0
    assert (got - ref).abs().max().item() < 1e-4
    compared = 0
    # layer 0's stored codes are the reference's, bit for bit (later layers' inputs differ by the kernels' rounding)
    for mine, theirs in zip(cache.layers[:1], ref_cache.layers[:1]):
        for a, b in zip(mine.k_store.chunks + mine.v_store.chunks, theirs.k_store.chunks + theirs.v_store.chunks):
            for x, y in zip((a.codes, a.scale, a.zero), (b.codes, b.scale, b.zero)):
                assert torch.equal(x, y)
                compared += 1
    assert compared >= 6


def test_generate_asked_for_cpu_kernels_without_a_compiler_is_one_line(tiny_model_dir, tmp_path, fresh_build,
                                                                       monkeypatch, capsys):
    from conftest import one_error_line, run_cli

    prof, plan = tmp_path / "p", tmp_path / "plan.json"
    assert run_cli(capsys, "profile", "--model", tiny_model_dir, "--seq-len", "32", "--windows", "1", "--schemes",
                   "int4_c32,int4_t32", "--out", prof, "--device", "cpu", "--quiet")[0] == 0
    assert run_cli(capsys, "plan", prof, "--avg-bits", "6", "--out", plan)[0] == 0
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    line = one_error_line(*run_cli(capsys, "generate", "--plan", plan, "--prompt", "x", "--kernels", "cpu",
                                   "--device", "cpu"))
    assert "compiled CPU kernels cannot be used" in line and "no-such-cc" in line
    assert plan.exists() and prof.exists()


@needs_compiler
@pytest.mark.parametrize("bits", [1, 3, 4, 8])
def test_unpack_float_equals_the_reference_on_views(bits):
    codes = torch.randint(0, 2**bits, (2, 3, 40, 64), generator=torch.Generator().manual_seed(bits))
    packed = reference.pack_bitplanes(codes, bits)[:, :, :, 5:37]  # a strided range, as the store reads it
    for offset in (0.0, 2 ** (bits - 1) - 1):
        got = cpu_kernels.unpack_float(packed, bits, offset)
        assert got.dtype == torch.float32 and torch.equal(got, reference.unpack_float(packed, bits, offset))
        assert torch.equal(got, codes[:, :, 5:37].float() - offset)


@needs_compiler
@pytest.mark.parametrize("zero", [True, False])
def test_dequantize_equals_the_reference(zero):
    """The dense read path: per token (groups of 32, and of 4 channels) and per channel, with or without zero-points
    and with the absmax codecs' offset."""
    g = torch.Generator().manual_seed(int(zero))
    codes = reference.pack_bitplanes(torch.randint(0, 16, (2, 3, 64, 64), generator=g), 4)
    for group in (32, 4):
        scale, z = torch.rand(2, 3, 64, 64 // group, generator=g).half(), torch.randn(2, 3, 64, 64 // group, generator=g)
        args = (codes[:, :, :, 8:40], scale[:, :, 8:40], z[:, :, 8:40] if zero else None, 4, group, 7.0)
        _close(cpu_kernels.dequantize_tokens(*args), reference.dequantize_tokens(*args), 1e-6)
    scale, z = torch.rand(2, 3, 2, 64, generator=g), torch.randn(2, 3, 2, 64, generator=g).half()
    args = (codes, scale, z if zero else None, 4, 32, 0.0)
    _close(cpu_kernels.dequantize_channels(*args), reference.dequantize_channels(*args), 1e-6)
