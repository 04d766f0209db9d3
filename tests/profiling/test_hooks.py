"""sensprof.profiling.hooks: the attention_taps context manager and replay_from."""

from __future__ import annotations

import pytest
import torch
from conftest import ARCHS, make_tiny_model

from sensprof.profiling import hooks
from sensprof.profiling.hooks import attention_taps, record_layer_outputs, replay_from
from sensprof.models import decoder_layers
from sensprof.rope import apply_rope
from sensprof.profiling.taps import StatsTap


def _n_pre_hooks(model):
    return sum(len(m._forward_pre_hooks) for m in model.modules())


# ---------------------------------------------------------------- attention_taps


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("arch", ARCHS)
def test_taps_without_taps_change_nothing(arch, fast, tiny_ids, monkeypatch):
    model = make_tiny_model(arch)
    with torch.no_grad():
        ref = model(input_ids=tiny_ids, use_cache=False).logits
        with attention_taps(model, fast=fast) as session:
            assert all((id(m) in hooks._FAST) == fast for m in session.attn_modules)  # every tiny arch takes SDPA
            assert model.config._attn_implementation == hooks.ATTN_NAME
            calls = []
            # count that attention really went through sensprof's function
            orig = hooks.model_eager

            def counting(module):
                calls.append(module.layer_idx)
                return orig(module)

            monkeypatch.setattr(hooks, "model_eager", counting)
            out = model(input_ids=tiny_ids, use_cache=False).logits
            monkeypatch.undo()
        assert sorted(calls) == list(range(len(decoder_layers(model))))
        assert all(session.rope[i] is not None for i in range(len(decoder_layers(model))))
    assert not hooks._FAST
    if fast:  # SDPA: the same attention up to rounding
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    else:
        assert torch.equal(out, ref)


def test_sdpa_is_not_taken_where_it_differs_from_eager(tiny_ids):
    """A soft-capped model (Gemma 2) keeps its eager attention: SDPA would drop the cap."""
    import transformers as tf

    from conftest import _common

    torch.manual_seed(0)
    model = tf.Gemma2ForCausalLM(tf.Gemma2Config(**_common(head_dim=16, attn_logit_softcapping=5.0))).eval()
    model.set_attn_implementation("eager")
    with torch.no_grad(), attention_taps(model) as session:
        assert not any(id(m) in hooks._FAST for m in session.attn_modules)
        assert hooks._checked_sdpa(model, session) is None


def test_sdpa_probe_measures_the_difference(tiny_ids, monkeypatch):
    """The probe compares numbers, not names: an eager attention that differs from SDPA keeps eager."""
    model = make_tiny_model("llama")
    import transformers.models.llama.modeling_llama as ml

    real = ml.eager_attention_forward

    def shifted(module, query, key, value, mask, **kw):  # a model whose own eager maths is not plain attention
        out, w = real(module, query, key, value, mask, **kw)
        return out + 1e-2, w

    monkeypatch.setattr(ml, "eager_attention_forward", shifted)
    with torch.no_grad(), attention_taps(model) as session:
        assert not hooks._FAST
        assert hooks._checked_sdpa(model, session) is None


@pytest.mark.parametrize("start_impl", ["eager", "sdpa"])
def test_taps_context_restores_model(start_impl, tiny_ids):
    model = make_tiny_model("llama")
    model.set_attn_implementation(start_impl)
    hooks_before = _n_pre_hooks(model)
    with torch.no_grad():
        ref = model(input_ids=tiny_ids, use_cache=False).logits
        with attention_taps(model) as session:
            session.set_tap(0, lambda eager, module, q, k, v, mask, kw: eager(module, q, k * 0.5, v, mask, **kw))
            assert _n_pre_hooks(model) == hooks_before + len(decoder_layers(model))
            changed = model(input_ids=tiny_ids, use_cache=False).logits
        assert not torch.allclose(changed, ref)
        assert model.config._attn_implementation == start_impl
        assert _n_pre_hooks(model) == hooks_before
        assert not any(id(layer.self_attn) in hooks._TAPS for layer in decoder_layers(model))
        torch.testing.assert_close(model(input_ids=tiny_ids, use_cache=False).logits, ref, rtol=0, atol=1e-5)


def test_taps_context_restores_model_after_exception(tiny_ids):
    model = make_tiny_model("gemma3")
    hooks_before = _n_pre_hooks(model)

    def bad_tap(eager, module, q, k, v, mask, kw):
        raise RuntimeError("boom inside a tap")

    with torch.no_grad():
        ref = model(input_ids=tiny_ids, use_cache=False).logits
        with pytest.raises(RuntimeError, match="boom inside a tap"):
            with attention_taps(model) as session:
                session.set_tap(1, bad_tap)
                model(input_ids=tiny_ids, use_cache=False)
        assert model.config._attn_implementation == "eager"
        assert _n_pre_hooks(model) == hooks_before
        assert not any(id(layer.self_attn) in hooks._TAPS for layer in decoder_layers(model))
        with pytest.raises(KeyError):
            with attention_taps(model):
                raise KeyError("raised in the body")
        assert model.config._attn_implementation == "eager"
        assert _n_pre_hooks(model) == hooks_before
        assert torch.equal(model(input_ids=tiny_ids, use_cache=False).logits, ref)


# ---------------------------------------------------------------- replay_from


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("start", [0, 1, 2])
def test_replay_from_gives_full_forward_logits(arch, start, tiny_ids):
    model = make_tiny_model(arch)
    layers = decoder_layers(model)
    outputs: dict = {}
    with torch.no_grad():
        with record_layer_outputs(model, outputs):
            ref = model(input_ids=tiny_ids, use_cache=False).logits
        assert sorted(outputs) == list(range(len(layers)))
        ran = []
        handles = [layer.self_attn.register_forward_pre_hook(lambda m, a, i=i: ran.append(i))
                   for i, layer in enumerate(layers)]
        try:
            with replay_from(model, start, outputs):
                out = model(input_ids=tiny_ids, use_cache=False).logits
        finally:
            for h in handles:
                h.remove()
        # the layers before `start` were skipped, the others ran
        assert ran == list(range(start, len(layers)))
        assert torch.equal(out, ref)
        # forward is restored: everything runs again and still matches
        assert all("forward" not in layer.__dict__ for layer in layers)
        assert torch.equal(model(input_ids=tiny_ids, use_cache=False).logits, ref)


def test_replay_from_repeats_recorded_outputs_for_batched_variants(tiny_ids):
    model = make_tiny_model("qwen3")
    outputs: dict = {}
    with torch.no_grad():
        with record_layer_outputs(model, outputs):
            ref = model(input_ids=tiny_ids, use_cache=False).logits
        with replay_from(model, 2, outputs, repeat=3):
            out = model(input_ids=tiny_ids.repeat(3, 1), use_cache=False).logits
    assert out.shape[0] == 3 * tiny_ids.shape[0]
    for i in range(3):
        torch.testing.assert_close(out[i * 2:(i + 1) * 2], ref, rtol=0, atol=1e-6)


def test_replay_from_restores_forward_on_exception(tiny_ids):
    model = make_tiny_model("llama")
    outputs: dict = {}
    with torch.no_grad():
        with record_layer_outputs(model, outputs):
            ref = model(input_ids=tiny_ids, use_cache=False).logits
        with pytest.raises(ValueError):
            with replay_from(model, 2, outputs):
                raise ValueError("interrupted")
        assert all("forward" not in layer.__dict__ for layer in decoder_layers(model))
        assert torch.equal(model(input_ids=tiny_ids, use_cache=False).logits, ref)


def test_replay_from_ctrl_c_between_saving_and_replacing_a_forward(tiny_ids):
    """A KeyboardInterrupt while the layers' forwards are being replaced (layer 0's done, layer 1's saved) gave an
    AttributeError from the restore, and layers left skipped; now the interrupt comes through and every layer
    computes again."""
    model = make_tiny_model("llama")
    outputs: dict = {}
    layers = decoder_layers(model)
    with torch.no_grad():
        with record_layer_outputs(model, outputs):
            ref = model(input_ids=tiny_ids, use_cache=False).logits
        cls, fired = type(layers[1]), []

        class CtrlC(cls):
            def __setattr__(self, name, value):
                if name == "forward" and not fired:
                    fired.append(name)
                    raise KeyboardInterrupt
                super().__setattr__(name, value)

        layers[1].__class__ = CtrlC
        try:
            with pytest.raises(KeyboardInterrupt):
                with replay_from(model, 3, outputs):
                    pytest.fail("the block ran although the forwards were not all replaced")
        finally:
            layers[1].__class__ = cls
        assert fired and all("forward" not in layer.__dict__ for layer in layers)
        assert torch.equal(model(input_ids=tiny_ids, use_cache=False).logits, ref)


# ---------------------------------------------------------------- StatsTap sees what the cache stores


def test_stats_tap_k_pre_matches_k_proj_output(tiny_ids):
    """Llama has no k_norm: keys before RoPE are exactly k_proj's output; V is v_proj's output."""
    model = make_tiny_model("llama")
    layer_idx = 1
    attn = decoder_layers(model)[layer_idx].self_attn
    hd = attn.head_dim
    captured = {}

    def grab(name):
        def hook(module, args, output):
            b, t, _ = output.shape
            captured[name] = output.detach().view(b, t, -1, hd).transpose(1, 2)
        return hook

    handles = [attn.k_proj.register_forward_hook(grab("k")), attn.v_proj.register_forward_hook(grab("v"))]
    try:
        with torch.no_grad(), attention_taps(model) as session:
            tap = StatsTap(session, layer_idx)
            session.set_tap(layer_idx, tap)
            model(input_ids=tiny_ids, use_cache=False)
            cos, sin = session.rope[layer_idx]
    finally:
        for h in handles:
            h.remove()
    k_pre, v = captured["k"], captured["v"]
    assert k_pre.shape == (2, 2, 64, hd)

    def chan_absmax(x):
        return x.abs().amax(dim=(0, 2))

    def moments(x):
        xd = x.double().reshape(-1)
        return torch.stack([torch.tensor(float(xd.numel()), dtype=torch.float64), xd.sum(), xd.pow(2).sum(),
                            xd.pow(3).sum(), xd.pow(4).sum()])

    st = tap.stats
    assert set(st) == {"K", "V", "K_pre"}
    torch.testing.assert_close(st["K_pre"].chan_absmax, chan_absmax(k_pre), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(st["K_pre"].moments, moments(k_pre), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(st["K_pre"].head_absmax, k_pre.abs().amax(dim=(0, 2, 3)), rtol=1e-5, atol=1e-6)
    # V is stored as projected; K after RoPE
    assert torch.equal(st["V"].chan_absmax, chan_absmax(v))
    k_post = apply_rope(k_pre, cos, sin)
    torch.testing.assert_close(st["K"].chan_absmax, chan_absmax(k_post), rtol=1e-6, atol=1e-6)
    # and K_pre is not K: RoPE moved things
    assert not torch.allclose(st["K"].chan_absmax, st["K_pre"].chan_absmax, atol=1e-3)
    kp = st["K_pre"]
    n, s1, s2, s3, s4 = (float(x) for x in moments(k_pre))
    mu, var = s1 / n, s2 / n - (s1 / n) ** 2
    kurt = (s4 / n - 4 * mu * s3 / n + 6 * mu * mu * s2 / n - 3 * mu ** 4) / var ** 2
    assert kp.kurtosis() == pytest.approx(kurt, rel=1e-5)


# ---------------------------------------------------------------- layers_with_rope


@pytest.mark.parametrize("arch", ARCHS)
def test_every_layer_of_the_rope_models_has_rope(arch):
    assert hooks.layers_with_rope(make_tiny_model(arch)) == [True] * 3


def test_a_nope_layer_has_no_rope_though_it_is_handed_the_position_embeddings():
    """SmolLM3 gives every 4th layer no RoPE (use_rope = 0) and still passes it cos / sin: keys there cannot be
    stored before RoPE, and a tap that un-rotated them would quantize keys that were never rotated."""
    import transformers as tf

    from conftest import _common

    torch.manual_seed(0)
    model = tf.SmolLM3ForCausalLM(tf.SmolLM3Config(**_common(num_hidden_layers=4, no_rope_layer_interval=4))).eval()
    assert [m.self_attn.use_rope for m in model.model.layers] == [1, 1, 1, 0]
    assert hooks.layers_with_rope(model) == [True, True, True, False]
    with attention_taps(model) as session:  # what a profile records as has_rope
        model(input_ids=torch.tensor([[3, 4, 5]]), use_cache=False)
        assert session.rope[3] is None and session.rope[0] is not None
