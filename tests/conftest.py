"""Shared fixtures: tiny random models of each architecture (no download) and a local model directory."""

from __future__ import annotations

import functools
import os
import sys

import pytest
import torch

VOCAB = 320
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Subprocesses (the CLI as a user runs it, Ray workers) import this checkout's sensprof, not whichever checkout an
# editable install last pointed at: another clone's `pip install -e .` on the same machine repoints it.
os.environ["PYTHONPATH"] = os.pathsep.join([ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])


def _own_cores_per_worker() -> None:
    """Under pytest-xdist (the README's `-n 2`), each worker and everything it starts (the CLI, notebook kernels,
    vLLM and llama.cpp) runs on cores of its own: two workers whose thread pools share both cores spin against each
    other (an engine check beside the notebook ran 10x its time alone, 2026-12-07). vLLM binds its OpenMP threads
    itself, so it is told which cores (VLLM_CPU_OMP_THREADS_BIND); llama.cpp's runner counts the cores it may use."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not (worker and count and hasattr(os, "sched_setaffinity")):
        return
    cpus, n = sorted(os.sched_getaffinity(0)), int(count)
    mine = cpus[int(worker.removeprefix("gw")) % n::n] if len(cpus) >= n else cpus
    os.sched_setaffinity(0, mine)
    os.environ["OMP_NUM_THREADS"] = str(len(mine))
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, mine))
    torch.set_num_threads(len(mine))


_own_cores_per_worker()

# The longest files first (seconds on one core of an AMD EPYC, 2026-12-07), so that `pytest -n 2 --dist loadfile`
# starts them at once and fills in with the short ones: xdist queues files by their number of tests, which put the
# two-test engine agreement file (~780 s) last and left the other worker idle for most of it.
LONGEST_FILES = ("tests/engines/test_engine_agreement.py",  # ~780
                 "tests/engines/test_vllm_plugin_real_models.py",  # ~550
                 "tests/test_notebook.py",  # ~200
                 "tests/engines/test_vllm_plugin.py",  # ~190
                 "tests/profiling/test_distributed.py",  # ~110
                 "tests/validation/test_validate.py", "tests/test_real_model.py", "tests/test_lm_eval.py")

try:
    from xdist.scheduler import LoadFileScheduling
except ImportError:  # the suite runs without pytest-xdist too, one file after another
    pass
else:
    class _LongestFilesFirst(LoadFileScheduling):
        def _assign_work_unit(self, node):
            # xdist's own (private) queue; where it is not an ordered dict, xdist's order stands
            queue = getattr(self, "workqueue", None)
            if not getattr(self, "_reordered", False) and hasattr(queue, "move_to_end"):
                self._reordered = True
                for scope in reversed(LONGEST_FILES):
                    if scope in queue:
                        queue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    def pytest_xdist_make_scheduler(config, log):
        if config.getoption("dist") == "loadfile":
            return _LongestFilesFirst(config, log)
        return None


@pytest.fixture(autouse=True, scope="module")
def _one_thread(request):
    """Tiny tensors: one intra-op thread is faster (no spinning on a busy 2-core box) and deterministic.
    The real-model module keeps torch's default."""
    if request.node.get_closest_marker("slow"):
        yield
        return
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(params=["cpu", *([pytest.param("cuda", marks=pytest.mark.gpu)] if torch.cuda.is_available() else [])])
def device(request):
    """Where an op that runs on either device is tested: the CPU always, and a CUDA device (marked gpu) where
    there is one."""
    return torch.device(request.param)


def load_benchmark(name: str):
    """A script of benchmarks/ as a module (they are scripts, not a package): its functions under test."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", os.path.join(ROOT, "benchmarks", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_cli(capsys, *argv):
    """sensprof's CLI in-process: (exit code, stdout, stderr)."""
    from sensprof.cli import main

    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def one_error_line(rc, out, err) -> str:
    """Bad input: exit code 2, no traceback, exactly one `sensprof: error:` line."""
    assert rc == 2, (rc, out, err)
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("sensprof: error: "), err
    return lines[0]


def _common(**kw):
    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    base.update(kw)
    return base


def tiny_config(arch: str):
    import transformers as tf

    if arch == "llama":  # head_dim 32: the smallest vLLM's per-token-head dtypes take
        return tf.LlamaConfig(**_common(head_dim=32)), tf.LlamaForCausalLM
    if arch == "mistral":
        return tf.MistralConfig(**_common(sliding_window=16)), tf.MistralForCausalLM
    if arch == "qwen2":
        return tf.Qwen2Config(**_common()), tf.Qwen2ForCausalLM
    if arch == "qwen3":
        return tf.Qwen3Config(**_common(head_dim=16)), tf.Qwen3ForCausalLM
    if arch == "phi3":
        return tf.Phi3Config(**_common(partial_rotary_factor=0.5)), tf.Phi3ForCausalLM
    if arch == "gemma3":
        return tf.Gemma3TextConfig(**_common(head_dim=32, sliding_window=8, layer_types=[
            "sliding_attention", "sliding_attention", "full_attention"])), tf.Gemma3ForCausalLM
    raise ValueError(arch)


ARCHS = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3")


def make_tiny_model(arch: str = "llama", seed: int = 0):
    cfg, cls = tiny_config(arch)
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    model.set_attn_implementation("eager")
    return model


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """A small byte-level BPE trained on the built-in corpus, so CLI tests need no download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from sensprof.data import PYDOC_NAME, builtin_corpus

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([builtin_corpus(PYDOC_NAME)[:200_000]], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer):
    """A local Hugging Face model directory (tiny random Llama + tokenizer)."""
    d = tmp_path_factory.mktemp("tiny-llama")
    make_tiny_model("llama").save_pretrained(d)
    tiny_tokenizer.save_pretrained(d)
    return str(d)


@pytest.fixture
def tiny_ids():
    g = torch.Generator().manual_seed(0)
    return torch.randint(3, VOCAB, (2, 64), generator=g)


def _engine_python(name: str) -> str:
    """The Python that runs a real engine (tools/engines/install.sh installs both). Missing, the test is skipped,
    unless SENSPROF_REQUIRE_ENGINES=1 (CI's .ci/run installs them and sets it): then it fails, so that a broken
    engine install can never pass as a skip."""
    import os

    from sensprof.engines.run.python import find_engine_python
    from sensprof.errors import SensprofError

    try:
        return find_engine_python(name).python
    except SensprofError as e:
        if os.environ.get("SENSPROF_REQUIRE_ENGINES") == "1":
            pytest.fail(f"SENSPROF_REQUIRE_ENGINES=1 but {e}")
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def vllm_python():
    return _engine_python("vllm")


@pytest.fixture(scope="session")
def llamacpp_python():
    return _engine_python("llamacpp")


@functools.lru_cache(maxsize=1)
def plugin_plan_module():
    """sensprof's vLLM plugin's pure-Python plan reader (plugins/vllm/sensprof_vllm/plan.py), loaded by path once:
    vLLM is not in sensprof's environment, and the plugin's package is not installed there."""
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "..", "plugins", "vllm", "sensprof_vllm", "plan.py")
    spec = importlib.util.spec_from_file_location("sensprof_vllm_plan", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod
