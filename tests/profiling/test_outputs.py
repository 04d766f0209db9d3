"""Next-token comparison in vocabulary chunks (sensprof/profiling/outputs.py) against the plain materialised KL."""

from __future__ import annotations

import pytest
import torch
from conftest import VOCAB, make_tiny_model

import sensprof.profiling.outputs as outputs
from sensprof.errors import SensprofError
from sensprof.profiling.outputs import Baseline, MaterializedBaseline, OutputHead, output_head
from sensprof.profiling.profile import run_profile
from sensprof.schemes import parse_schemes


def _ids(vocab=VOCAB, t=64):
    return torch.randint(3, vocab, (2, t), generator=torch.Generator().manual_seed(0))


def _perturbed(model, ids, scale):
    head = OutputHead(model)
    with torch.inference_mode():
        h = head.hidden(ids)
        g = torch.Generator().manual_seed(1)
        hq = h + scale * torch.randn(h.shape, generator=g)
        hq[:, :5] = h[:, :5]  # the first positions unmoved
    return head, h, hq


def _both(head, h, hq, ids, **kw):
    with torch.inference_mode():
        chunked = Baseline(head, h, ids, **kw).compare(hq)
        plain = MaterializedBaseline(head.logits(h.reshape(-1, h.shape[-1])).view(*h.shape[:2], -1), ids)
        ref = plain.compare(head.logits(hq.reshape(-1, hq.shape[-1])).view(*hq.shape[:2], -1))
    return chunked, ref


@pytest.mark.parametrize("keep", [True, False])
@pytest.mark.parametrize("chunk", [1 << 24, 700])  # one block, and many row blocks x vocabulary chunks
def test_chunked_equals_materialised(monkeypatch, keep, chunk):
    monkeypatch.setattr(outputs, "CHUNK_ELEMENTS", chunk)
    model = make_tiny_model("llama")
    ids = _ids()
    head, h, hq = _perturbed(model, ids, 0.05)
    got, ref = _both(head, h, hq, ids, keep_logits_bytes=1 << 40 if keep else 0)
    assert ref["kl"] > 1e-5
    for key in ("kl", "kl_std", "dnll"):  # the spread is a difference of window means: judged against the KL
        assert got[key] == pytest.approx(ref[key], rel=1e-4, abs=1e-4 * ref["kl"]), key
    assert got["kl_per_window"] == pytest.approx(ref["kl_per_window"], rel=1e-4)


def test_softcapped_logits_gemma3():
    cfg_model = make_tiny_model("gemma3")
    cfg_model.config.final_logit_softcapping = 3.0  # Gemma's tanh cap, applied by the model and by the head
    ids = _ids()
    head = OutputHead(cfg_model)
    assert head.softcap == 3.0 and head.matches_model(ids)
    head, h, hq = _perturbed(cfg_model, ids, 0.05)
    got, ref = _both(head, h, hq, ids)
    assert got["kl"] == pytest.approx(ref["kl"], rel=1e-4)


def test_no_float32_noise_floor():
    """A KL of 1e-12 is not buried under float32 rounding of log-probabilities (~1e-7)."""
    model = make_tiny_model("llama")
    ids = _ids()
    head, h, hq = _perturbed(model, ids, 1e-6)
    with torch.inference_mode():
        lp = torch.log_softmax(head.logits(h.reshape(-1, 64)).double(), -1)
        lq = torch.log_softmax(head.logits(hq.reshape(-1, 64)).double(), -1)
        exact = float((lp.exp() * (lp - lq)).sum(-1).mean())
    assert 0 < exact < 1e-10
    got, ref = _both(head, h, hq, ids)
    assert got["kl"] == pytest.approx(exact, rel=0.05)
    assert ref["kl"] == pytest.approx(exact, rel=0.05)


def test_unmoved_hidden_states_cost_nothing_and_give_zero(monkeypatch):
    model = make_tiny_model("llama")
    ids = _ids()
    head = OutputHead(model)
    with torch.inference_mode():
        h = head.hidden(ids)
        base = Baseline(head, h, ids)
        calls = []
        monkeypatch.setattr(head, "logits", lambda *a, **k: calls.append(1))
        m = base.compare(h.clone())
    assert m["kl"] == 0 and m["dnll"] == 0 and calls == []


def test_large_vocabulary_model_exact():
    """A tiny random model whose LM head is large (256K tokens): the chunked KL equals the plain one."""
    import transformers as tf

    cfg = tf.LlamaConfig(vocab_size=262144, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64)
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(cfg).eval()
    ids = _ids(262144, 64)
    schemes = parse_schemes("int2_t32,int2_c32")
    exact = run_profile(model, ids, schemes, progress=False).table
    plain = run_profile(model, ids, schemes, replay=False, kl="materialized", progress=False).table
    assert (plain.kl > 0).all()
    assert exact.kl.to_numpy() == pytest.approx(plain.kl.to_numpy(), rel=1e-3)
    assert exact.dnll.to_numpy() == pytest.approx(plain.dnll.to_numpy(), rel=1e-3, abs=1e-7)
    sampled = run_profile(model, ids, schemes, kl="sampled:256", progress=False).table
    assert sampled.kl.to_numpy() == pytest.approx(plain.kl.to_numpy(), rel=0.5)  # flat random logits: the worst case


def test_sampled_is_close_on_a_peaked_distribution():
    """Top-K plus tail samples: near-exact where the mass is in a few tokens, as in a trained model."""
    model = make_tiny_model("llama")
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)  # sharpen the random model's next-token distributions
    ids = _ids()
    head, h, hq = _perturbed(model, ids, 0.01)
    with torch.inference_mode():
        exact = Baseline(head, h, ids).compare(hq)
        sampled = Baseline(head, h, ids, sample=32).compare(hq)
    assert sampled["kl"] == pytest.approx(exact["kl"], rel=0.05)


def test_sampling_a_vocabulary_that_is_too_small_is_refused():
    model = make_tiny_model("llama")
    with pytest.raises(SensprofError, match="--kl exact"):
        run_profile(model, _ids(), parse_schemes("int4_t32"), kl=f"sampled:{VOCAB}", progress=False)


@pytest.mark.parametrize("kl", ["bogus", "sampled:0", "sampled:x"])
def test_bad_kl_option(kl):
    with pytest.raises(SensprofError, match="--kl"):
        run_profile(make_tiny_model("llama"), _ids(), parse_schemes("int4_t32"), kl=kl, progress=False)


def test_unknown_logit_transform_falls_back_to_full_logits():
    model = make_tiny_model("llama")
    model.config.logit_scale = 0.5  # a transform the model does not apply: the head cannot reproduce its logits
    ids = _ids()
    assert output_head(model, ids) is None
    with pytest.raises(SensprofError, match="--kl exact"):
        output_head(model, ids, "sampled:8")
    prof = run_profile(model, ids, parse_schemes("int2_t32"), progress=False)
    assert prof.meta["kl_compared"] == "materialized" and (prof.table.kl > 0).all()


def test_materialised_profile_equals_chunked():
    model = make_tiny_model("qwen3")
    schemes = parse_schemes("int2_t32,int4_c32_pre,fp8_e4m3_cal")
    a = run_profile(model, _ids(), schemes, progress=False)
    b = run_profile(model, _ids(), schemes, replay=False, kl="materialized", progress=False)
    assert a.meta["kl_compared"] == "exact" and b.meta["kl_compared"] == "materialized"
    assert a.table.kl.to_numpy() == pytest.approx(b.table.kl.to_numpy(), rel=1e-3, abs=1e-10)
    assert set(a.meta["cost_s"]) >= {"layers", "lm_head", "kl"} and a.meta["memory"]["peak_rss_gib"] > 0
