"""One check on the real default model (SmolLM2-135M): a property the KV-quantization literature predicts."""

import pytest

from sensprof.schemes import parse_schemes

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2():
    from sensprof.models import load_model

    try:
        return load_model("smollm2-135m", device="cpu")
    except Exception as e:  # pragma: no cover - the README's test command installs it
        pytest.fail(f"the default model could not be loaded: {e}")


@pytest.fixture(scope="module")
def real_profile(smollm2):
    from sensprof.api import load_windows
    from sensprof.profile import run_profile

    ids, name, digest = load_windows(smollm2.tokenizer, None, seq_len=128, windows=2, seed=0)
    # Same residual window for both layouts, so only the grouping axis differs.
    schemes = parse_schemes("int4_c32_r32,int4_t32_r32,int4_per_token_head")
    return run_profile(smollm2.model, ids, schemes, layers=[0, 1, 2, 3], model_id="smollm2-135m",
                       text_name=name, text_digest=digest, progress=False)


def test_layers_described(smollm2):
    from sensprof.models import describe_layers

    infos = describe_layers(smollm2.model)
    assert len(infos) == 30
    assert {(i.kind, i.kv_heads, i.head_dim) for i in infos} == {("full", 3, 64)}


def test_per_channel_keys_beat_per_token_keys(real_profile):
    """KIVI: keys have outlier channels, so per-channel statistics quantize them better."""
    k = real_profile.table[real_profile.table.tensor == "K"].set_index(["layer", "scheme"]).kl
    per_channel = k.xs("int4_c32_r32", level="scheme")
    per_token = k.xs("int4_t32_r32", level="scheme")
    assert per_channel.sum() < per_token.sum()
    assert (per_channel < per_token).sum() >= 3


def test_keys_cost_more_than_values_per_token(real_profile):
    """A key error passes through the softmax; at the same per-token scheme keys hurt more."""
    t = real_profile.table[real_profile.table.scheme == "int4_per_token_head"]
    assert t[t.tensor == "K"].kl.sum() > t[t.tensor == "V"].kl.sum()


def test_keys_have_outlier_channels(real_profile):
    """The reason for per-channel keys: key channels are far more uneven than value channels."""
    s = real_profile.stats
    k = s[s.tensor == "K"].outlier_ratio.mean()
    v = s[s.tensor == "V"].outlier_ratio.mean()
    assert k > v
