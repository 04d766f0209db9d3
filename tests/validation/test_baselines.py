"""sensprof.validation.baselines on a tiny random model: each scheme of the candidates is screened alone (every layer,
the other tensor unquantized), the baselines are the pairs of least summed screened KL within the memory given, and
a baseline outside the profile's menus is measured like any configuration."""

from __future__ import annotations

import pytest
import torch
from conftest import VOCAB, make_tiny_model

from sensprof.artifacts import LayerPlan, Plan
from sensprof.models import describe_layers
from sensprof.planning.budget import Budget
from sensprof.planning.uniforms import candidates
from sensprof.schemes import get_scheme
from sensprof.validation.baselines import (baseline_configs, baseline_limit, best_uniforms, layer_info, plan_cost,
                                           screen, screen_length)
from sensprof.validation.validate import layer_choices, measure


@pytest.fixture(scope="module")
def tiny(_one_thread):
    model = make_tiny_model("llama")
    ids = torch.randint(3, VOCAB, (1, 96), generator=torch.Generator().manual_seed(1))
    layers = [LayerPlan(i.index, i.kind, i.window, i.kv_heads, i.head_dim, "int4_c32", "int4_t32", 0.0, 0.0, {})
              for i in describe_layers(model)]
    plan = Plan.hand_made("tiny", "fp", layers).replace(budget=Budget("avg_bits", 5.0, context_len=96))
    return model, ids, plan


def test_screen_measures_each_scheme_alone(tiny):
    model, ids, plan = tiny
    found = candidates(plan.budget, layer_info(plan.layers))
    k, v = screen(model, ids, plan, found, "streaming")
    assert set(k) == {c.k for c in found} - {"none"} and set(v) == {c.v for c in found} - {"none"}
    some = sorted(k)[0]
    alone = measure(model, ids, {"x": layer_choices(plan, (some, "none"))})["x"]["kl"]
    assert k[some] == pytest.approx(alone, rel=1e-6)
    assert all(x >= 0 for x in (*k.values(), *v.values()))


def test_best_uniforms_are_the_least_summed_screen_within_the_memory(tiny):
    model, ids, plan = tiny
    limit = plan_cost(plan)
    assert limit == pytest.approx(sum(plan.budget.cost(get_scheme(s), info) for p, info in
                                      zip(plan.layers, layer_info(plan.layers)) for s in (p.k_scheme, p.v_scheme)))
    chosen, k, v = best_uniforms(model, ids, plan, limit=limit, top=3)
    found = candidates(plan.budget, layer_info(plan.layers), limit, pre_rope=True)  # every layer has RoPE
    assert set(k) == {c.k for c in found} - {"none"} and any(get_scheme(name).pre_rope for name in k)
    score = {(c.k, c.v): k.get(c.k, 0.0) + v.get(c.v, 0.0) for c in found}
    assert len(chosen) == 3 and all(c.cost <= limit * (1 + 1e-9) for c in chosen)
    assert [score[c.k, c.v] for c in chosen] == sorted(score.values())[:3]
    configs = baseline_configs(plan, chosen)
    assert list(configs) == [f"best uniform {c.k} / {c.v}" for c in chosen]
    measured = measure(model, ids, configs)  # a baseline from outside any menu measures like any configuration
    assert all(m["kl"] >= 0 for m in measured.values())


def test_a_baseline_may_spend_the_plans_budget(tiny):
    """A planned plan holding a little less than its budget is judged against every uniform setting within the
    budget (the one that defines it included); a hand-made plan's nominal 16-bit budget is not a limit."""
    import dataclasses

    _, _, plan = tiny
    info = layer_info(plan.layers)
    planned = plan.replace(solver=dataclasses.replace(plan.solver, status="Optimal"),
                           budget=Budget("avg_bits", 5.3, context_len=96))
    assert plan_cost(planned) < planned.budget.limit(info)
    assert baseline_limit(planned) == pytest.approx(planned.budget.limit(info))
    defining = candidates(planned.budget, info, baseline_limit(planned))
    assert any(c.cost > plan_cost(planned) for c in defining)  # settings the plan's own memory would exclude
    assert baseline_limit(plan) == plan_cost(plan)  # hand-made: its own memory
    over = planned.replace(budget=Budget("avg_bits", 2.0, context_len=96))  # a budget the plan exceeds
    assert baseline_limit(over) == pytest.approx(plan_cost(over))


def test_the_screen_ranks_at_the_length_judged_and_sees_what_long_groups_quantize():
    assert screen_length(256, 1024) == 512  # a 128-token group and a 32-token residual act within it
    assert screen_length(32, 128) == 128  # within the longest window there is
    assert screen_length(1024, 4096) == 1024 and screen_length(4096, 4096) == 4096  # each length at its own


def test_a_known_screen_is_not_measured_again(tiny):
    """validate reuses the screen the plan's selection recorded (same length, the profile's text) and measures only
    the schemes it lacks."""
    import dataclasses

    from sensprof.validation.baselines import recorded_screen

    model, ids, plan = tiny
    found = candidates(plan.budget, layer_info(plan.layers))
    keys = {c.k for c in found} - {"none"}
    sentinel = {k: 123.0 for k in keys}  # no KL is 123: a re-measured key would show
    logged = []
    k, v = screen(model, ids, plan, found, "streaming", logged.append, known={"k": sentinel, "v": {}})
    assert k == sentinel and set(v) == {c.v for c in found} - {"none"}
    assert "screening 0 key and" in logged[0] and f"the plan's selection screened {len(keys)}" in logged[0]
    record = {"uniform_screen": {"tokens": 96, "k": sentinel, "v": {}}, "windows": 2}
    chosen = plan.replace(solver=dataclasses.replace(plan.solver, select=record))
    assert recorded_screen(chosen, 96) == {"k": sentinel, "v": {}}
    assert recorded_screen(chosen, 512) is None  # another length: screened afresh
    assert recorded_screen(plan, 96) is None
    other_text = plan.replace(solver=dataclasses.replace(plan.solver, select={**record, "text": "mine"}))
    assert recorded_screen(other_text, 96) is None  # chosen on the user's text


def test_a_model_with_a_nope_layer_is_screened_with_keys_after_rope_only():
    """Keys before RoPE need RoPE on every layer (a uniform setting gives every layer the same scheme); SmolLM3's
    every 4th layer has none."""
    import transformers as tf
    from conftest import _common

    torch.manual_seed(0)
    model = tf.SmolLM3ForCausalLM(tf.SmolLM3Config(**_common(num_hidden_layers=4, no_rope_layer_interval=4,
                                                                   head_dim=32))).eval()
    ids = torch.randint(3, VOCAB, (1, 64), generator=torch.Generator().manual_seed(1))
    layers = [LayerPlan(i.index, i.kind, i.window, i.kv_heads, i.head_dim, "int4_c32", "int4_t32", 0.0, 0.0, {})
              for i in describe_layers(model)]
    plan = Plan.hand_made("tiny", "fp", layers).replace(budget=Budget("avg_bits", 5.0, context_len=64))
    chosen, k, _ = best_uniforms(model, ids, plan, limit=plan_cost(plan), top=3)
    assert k and not any(get_scheme(name).pre_rope for name in k)
    assert not any(get_scheme(c.k).pre_rope for c in chosen if c.k != "none")
