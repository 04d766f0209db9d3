"""The `bench` extra installs what benchmarks/runtime.py's peers (transformers' QuantizedCache backends) import,
and, where it is installed, each backend decodes on a tiny random Llama and the benchmark counts its bytes.
No network: pyproject.toml is read from the checkout and the model is built from a config."""

import re
import tomllib
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement
from packaging.version import Version

from conftest import load_benchmark, make_tiny_model

ROOT = Path(__file__).resolve().parents[1]
BENCHMARK = ROOT / "benchmarks" / "runtime.py"

# QuantizedCache backend -> (distribution, module transformers imports, the lowest version transformers takes).
# transformers' QuantoQuantizedLayer wants is_quanto_greater("0.2.5"), a strict ">" on the base version;
# HQQQuantizedLayer wants is_hqq_available(), i.e. hqq >= HQQ_MIN_VERSION.
BACKENDS = {
    "quanto": ("optimum-quanto", "optimum.quanto", Version("0.2.6")),
    "hqq": ("hqq", "hqq", None),  # None: transformers.utils.import_utils.HQQ_MIN_VERSION
}


def lowest(backend: str) -> Version:
    floor = BACKENDS[backend][2]
    if floor is None:
        from transformers.utils.import_utils import HQQ_MIN_VERSION

        floor = Version(HQQ_MIN_VERSION)
    return floor


def bench_extra() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["optional-dependencies"]["bench"]]
    return {r.name.lower().replace("_", "-"): r for r in reqs}


def benchmark_backends() -> set[str]:
    return set(re.findall(r'QuantizedCache\(\s*"(\w+)"', BENCHMARK.read_text()))


def test_the_benchmark_measures_the_backends_listed_here():
    assert benchmark_backends() == set(BACKENDS)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_bench_extra_names_each_backend_package_at_a_version_transformers_takes(backend):
    extra = bench_extra()
    dist = BACKENDS[backend][0]
    assert dist in extra, f"the bench extra lacks {dist}, which QuantizedCache({backend!r}) imports"
    spec = extra[dist].specifier
    floors = [Version(s.version) for s in spec if s.operator in (">=", "==", "~=")]
    assert floors and min(floors) >= lowest(backend), (
        f"{dist}{spec}: transformers' QuantizedCache({backend!r}) needs {dist} >= {lowest(backend)}")


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_quantized_cache_decodes_two_steps_on_a_tiny_llama(backend):
    pytest.importorskip(BACKENDS[backend][1], reason=f"the bench extra ({BACKENDS[backend][0]}) is not installed")
    from transformers import DynamicCache, QuantizedCache

    from sensprof.runtime.generate import cache_kwarg

    model = make_tiny_model("llama")
    kw = cache_kwarg(model)
    bench = load_benchmark("runtime")
    # residual_length 2: the second decode step flushes the full-precision residual into the quantized states
    cache = QuantizedCache(backend, model.config, nbits=4, q_group_size=32, residual_length=2)
    reference = DynamicCache(config=model.config)
    ids = torch.randint(3, model.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        for c in (cache, reference):
            nxt = model(ids, use_cache=True, **{kw: c}).logits[:, -1:].argmax(-1)
            for _ in range(2):
                logits = model(nxt, use_cache=True, **{kw: c}).logits
                assert logits.shape == (1, 1, model.config.vocab_size) and torch.isfinite(logits).all()
                nxt = logits[:, -1:].argmax(-1)
    assert cache.get_seq_length() == reference.get_seq_length() == 10
    # 4-bit data (1/8 of fp32) plus fp32 scale and zero per group of 32 (another 1/16): between 1/8 and 1/4
    full = bench.cache_bytes(reference)
    assert full == 2 * model.config.num_hidden_layers * model.config.num_key_value_heads * 32 * 10 * 4
    assert full / 8 < bench.cache_bytes(cache) < full / 4, (backend, bench.cache_bytes(cache), full)
