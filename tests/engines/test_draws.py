"""Draws of a machine's numerics (sensprof/engines/draws.py): realization 0 is the model as it is; another
realization moves every linear layer's input by a relative ~1e-6, the same way each time, and leaves nothing behind."""

from __future__ import annotations

import torch

from conftest import make_tiny_model
from sensprof.engines.draws import DITHER, Dither, float_numerics


def test_realization_zero_is_the_model_itself_and_others_are_reproducible_draws():
    model = make_tiny_model("llama")
    ids = torch.randint(3, model.config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = model(ids).logits
        with float_numerics(model, 0):
            zero = model(ids).logits
        with float_numerics(model, 1):
            one = model(ids).logits
        with float_numerics(model, 1):
            again = model(ids).logits
        with float_numerics(model, 2):
            two = model(ids).logits
        after = model(ids).logits
    assert torch.equal(zero, plain) and torch.equal(after, plain)  # no hook left behind
    assert torch.equal(one, again) and not torch.equal(one, two) and not torch.equal(one, plain)
    rel = ((one - plain).abs().max() / plain.abs().max()).item()
    assert 0 < rel < 1e-4  # ulps, not a change of the model


def test_the_dither_is_relative_and_seeded():
    x = torch.full((1000,), 3.0)
    assert torch.equal(Dither(0)(x), x)
    d = Dither(5)(x)
    assert torch.equal(d, Dither(5)(x)) and 0.5 * DITHER < float(((d - x) / x).std()) < 2 * DITHER
