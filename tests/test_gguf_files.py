"""A GGUF file is parsed once per load, and what transformers builds from it is exactly what it builds unaided."""

from __future__ import annotations

import os

import pytest
import torch

gguf = pytest.importorskip("gguf")

from sensprof import gguf_files  # noqa: E402
from sensprof.gguf_files import gguf_reads_once, read_gguf  # noqa: E402


def write_tiny_llama_gguf(path: str, seed: int = 0, layers: int = 2) -> str:
    """A complete two-layer Llama in GGUF (float32 tensors, no tokenizer): what transformers loads from a file."""
    import numpy as np

    hidden, inter, vocab, heads, kv_heads = 64, 128, 320, 4, 2
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(layers)
    w.add_context_length(128)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(vocab)
    w.add_rope_dimension_count(hidden // heads)
    rng = np.random.default_rng(seed)

    def tensor(name, *shape):
        w.add_tensor(name, (rng.standard_normal(shape) * 0.05).astype(np.float32))

    tensor("token_embd.weight", vocab, hidden)
    tensor("output_norm.weight", hidden)
    tensor("output.weight", vocab, hidden)
    kv = hidden // heads * kv_heads
    for i in range(layers):
        for name, shape in [("attn_norm", (hidden,)), ("ffn_norm", (hidden,)), ("attn_q", (hidden, hidden)),
                            ("attn_k", (kv, hidden)), ("attn_v", (kv, hidden)), ("attn_output", (hidden, hidden)),
                            ("ffn_gate", (inter, hidden)), ("ffn_up", (inter, hidden)), ("ffn_down", (hidden, inter))]:
            tensor(f"blk.{i}.{name}.weight", *shape)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def tiny_gguf(tmp_path):
    return write_tiny_llama_gguf(str(tmp_path / "tiny.gguf"))


@pytest.fixture
def parses(monkeypatch):
    """Counts the GGUF files gguf's reader really parses."""
    from gguf import gguf_reader

    seen = []
    real = gguf_reader.GGUFReader

    class Counting(real):
        def __init__(self, path, *args, **kwargs):
            seen.append(os.path.basename(path))
            super().__init__(path, *args, **kwargs)

    monkeypatch.setattr(gguf_reader, "GGUFReader", Counting)
    monkeypatch.setattr(gguf, "GGUFReader", Counting)
    monkeypatch.setattr(gguf_files, "_READERS", type(gguf_files._READERS)())
    return seen


def _load(path):
    from transformers import AutoConfig, AutoModelForCausalLM

    folder, name = os.path.split(path)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    return config, model


def test_a_load_within_parses_the_file_once_and_builds_the_same_model(tiny_gguf, parses):
    config, model = _load(tiny_gguf)
    unaided = len(parses)
    assert unaided >= 2  # transformers alone opens the file for the config and again for the weights (and more)
    parses.clear()
    with gguf_reads_once():
        config_once, model_once = _load(tiny_gguf)
    assert parses == ["tiny.gguf"]
    assert config_once.to_dict() == config.to_dict()
    a, b = model.state_dict(), model_once.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_context_leaves_gguf_and_transformers_as_they_were(tiny_gguf):
    from transformers import modeling_gguf_pytorch_utils as hf_gguf

    before = (gguf.GGUFReader, gguf.get_tensor_name_map, hf_gguf.load_gguf_checkpoint)
    with pytest.raises(RuntimeError), gguf_reads_once():
        assert gguf.GGUFReader is not before[0]
        raise RuntimeError("a load that fails midway")
    assert (gguf.GGUFReader, gguf.get_tensor_name_map, hf_gguf.load_gguf_checkpoint) == before


def test_each_caller_gets_its_own_copy_of_the_metadata(tiny_gguf):
    from transformers import modeling_gguf_pytorch_utils as hf_gguf

    with gguf_reads_once():
        first = hf_gguf.load_gguf_checkpoint(tiny_gguf, return_tensors=False)
        first["config"]["num_hidden_layers"] = 99
        second = hf_gguf.load_gguf_checkpoint(tiny_gguf, return_tensors=False)
    assert second["config"]["num_hidden_layers"] == 2


def test_a_rewritten_file_is_parsed_again(tiny_gguf, parses):
    assert read_gguf(tiny_gguf) is read_gguf(tiny_gguf) and parses == ["tiny.gguf"]
    write_tiny_llama_gguf(tiny_gguf, seed=1, layers=3)
    assert read_gguf(tiny_gguf).fields["llama.block_count"].contents() == 3 and len(parses) == 2


def test_a_damaged_file_still_raises_and_is_not_remembered(tiny_gguf, tmp_path, parses):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(open(tiny_gguf, "rb").read()[:40])
    for _ in range(2):
        with pytest.raises(Exception):
            read_gguf(str(cut))
    assert parses == ["cut.gguf", "cut.gguf"] and not gguf_files._READERS
