"""The vLLM target end to end on a tiny model: `profile --target vllm` profiles exactly what the target needs,
the plan chooses among every dtype vLLM runs on the named GPU (with vLLM's own boundary layers kept), and
`validate` measures each dtype alone as vLLM would run it."""

from __future__ import annotations

import types

import pandas as pd
import pytest

from conftest import one_error_line, plugin_plan_module, run_cli
from sensprof.cli import main
from sensprof.targets import profile_menu
from sensprof.artifacts import load_plan
from sensprof.schemes import get_scheme
from sensprof.targets import get_target


@pytest.fixture(scope="module")
def vllm_run(tiny_model_dir, tmp_path_factory, _one_thread):
    root = tmp_path_factory.mktemp("vllm-target")
    prof = root / "profile"
    assert main(["profile", "--model", tiny_model_dir, "--target", "vllm", "--seq-len", "32", "--windows", "2",
                 "--out", str(prof), "--device", "cpu", "--quiet"]) == 0
    return types.SimpleNamespace(root=root, profile=str(prof), table=pd.read_csv(prof / "profile.csv"))


def test_profile_target_vllm_profiles_exactly_what_the_target_needs(vllm_run):
    target = get_target("vllm", "hopper", head_dims={32})
    for tensor in "KV":
        got = set(vllm_run.table[vllm_run.table.tensor == tensor].scheme)
        want = {s for d in target.dtypes for s in d.schemes if get_scheme(s).applies_to(tensor)}
        assert want <= got, tensor
        assert all(get_scheme(s).applies_to(tensor) for s in got)
    k = set(vllm_run.table[vllm_run.table.tensor == "K"].scheme)
    assert {"fp8_e4m3_qfp8", "int4_per_token_head", "turboquant_k3v4_nc.K"} <= k
    assert "turboquant_k3v4_nc.V" not in k and "nvfp4" not in k  # nvfp4 takes no head_dim 32


def test_the_fp8_query_cast_is_measured(vllm_run):
    """On Hopper vLLM casts the query to fp8 too: the same fp8 keys do more damage with it."""
    t = vllm_run.table[vllm_run.table.tensor == "K"].set_index(["layer", "scheme"]).kl
    for layer in range(3):
        assert t[(layer, "fp8_e4m3_qfp8")] != t[(layer, "fp8_e4m3")]
    assert sum(t[(i, "fp8_e4m3_qfp8")] for i in range(3)) > sum(t[(i, "fp8_e4m3")] for i in range(3))


def _names(menu, tensor=None):
    return {s.name for s in (menu.schemes if tensor is None else menu.for_tensor(tensor))}


def test_scheme_names_for_each_target_and_gpu():
    assert "turboquant_k8v4_e4b15.K" in _names(profile_menu(None, "vllm", "ampere", {64}), "K")
    assert "turboquant_k8v4_e4b15.K" not in _names(profile_menu(None, "vllm", "ampere", {64}), "V")
    assert "fp8_per_token_head" not in _names(profile_menu(None, "vllm", "ampere", {64}))
    assert "turboquant_k8v4.K" in _names(profile_menu(None, "vllm", "hopper", {64}))
    assert _names(profile_menu("int4_c32", "llamacpp", None)) >= {"int4_c32", "llamacpp_q8_0.V", "llamacpp_q4_0.K"}
    interleaved = _names(profile_menu(None, "llamacpp", None, channel_order="interleaved"), "K")  # a Llama GGUF
    assert "llamacpp_q4_0.K_interleaved" in interleaved and "llamacpp_q4_0.K" not in interleaved
    # vLLM's CPU backend with sensprof's plugin: keys and values in the plugin's per-token groups are profiled too,
    # though a user's --k-schemes may not name a value layout for keys (it is there for the pairs' sake)
    cpu = profile_menu(None, "vllm", "cpu", {256})
    assert {"int8_t32", "int6_t32"} <= _names(cpu, "K") and {"int6_t32", "int6_t64"} <= _names(cpu, "V")
    assert "int8_t32" not in _names(profile_menu(None, "vllm", "ampere", {64}), "K")
    assert profile_menu(None, "sensprof", None) == profile_menu(None, None, None)
    with_k = profile_menu(None, "sensprof", None, k_schemes="int4_c64")  # the default menus and the extra key
    assert _names(with_k, "K") == _names(profile_menu(None, None, None), "K") | {"int4_c64"}


@pytest.mark.parametrize("argv, match", [
    (["schemes", "--target", "sglang"], "lists vLLM's dtypes"),
    (["schemes", "--vllm-gpu", "hopper"], "--vllm-gpu needs --target vllm"),
    (["schemes", "--target", "vllm", "--vllm-gpu", "tpu"], "unknown --vllm-gpu 'tpu'"),
    (["profile", "--target", "sglang", "--vllm-gpu", "hopper"], "--vllm-gpu only applies to target vllm"),
    (["profile", "--target", "nope"], "unknown target 'nope'"),
])
def test_bad_target_options_are_one_line_errors(capsys, argv, match):
    assert match in one_error_line(*run_cli(capsys, *argv))


def test_schemes_target_vllm_lists_every_dtype(capsys):
    rc, out, err = run_cli(capsys, "schemes", "--target", "vllm")
    assert rc == 0, err
    from sensprof.engines.vllm.catalog import DTYPES

    for d in DTYPES:
        assert d.flag_value in out
    rc, out, _ = run_cli(capsys, "schemes", "--target", "vllm", "--vllm-gpu", "ampere")
    assert "turboquant_k8v4_e4b15.K" in out and "not on ampere" in out


def test_plan_chooses_a_boundary_dtype_keeps_its_layers_and_validate_shows_vllms_defaults(vllm_run, capsys):
    plan_path = vllm_run.root / "tq.json"
    # 3 layers: a TurboQuant dtype keeps layers 0 and 2 (n = min(2, 3 // 2)); at 12 bits only those fit
    # beside per-token-head dtypes, so check the planner's accounting on whichever it picks.
    rc, out, err = run_cli(capsys, "plan", vllm_run.profile, "--target", "vllm", "--avg-bits", "12",
                           "--out", plan_path)
    assert rc == 0, err
    plan = load_plan(str(plan_path))
    assert plan.engine.vllm_gpu == "hopper"
    forced = plan.engine.forced_skip_layers
    assert set(forced) <= set(plan.engine.skip_layers)
    if plan.engine.kv_cache_dtype.startswith("turboquant"):
        assert forced == [0, 2]
    rc, out, err = run_cli(capsys, "validate", str(plan_path), "--device", "cpu")
    assert rc == 0, err
    out = open(str(plan_path)[:-len(".json")] + ".validation.csv").read()
    assert "vllm turboquant_k3v4_nc (turboquant_k3v4_nc.K / turboquant_k3v4_nc.V), vLLM keeps layers 0 2" in out
    assert "vllm int4_per_token_head (int4_per_token_head), all layers" in out
    assert "vllm fp8 (fp8_e4m3_qfp8 / fp8_e4m3), all layers" in out


def test_plan_for_ampere_uses_its_own_key_formats(vllm_run, capsys):
    """A Hopper profile also holds plain fp8 keys (fp8_e4m3 is profiled on K and V): an Ampere plan uses them, never
    Hopper's query-cast keys, and records the GPU."""
    path = vllm_run.root / "ampere.json"
    rc, out, err = run_cli(capsys, "plan", vllm_run.profile, "--target", "vllm", "--avg-bits", "8.6",
                           "--vllm-gpu", "ampere", "--out", path)
    assert rc == 0, err
    plan = load_plan(str(path))
    assert plan.engine.vllm_gpu == "ampere"
    assert plan.engine.kv_cache_dtype in {d.flag_value for d in get_target("vllm", "ampere").dtypes}
    assert not any(p.k_scheme.endswith("_qfp8") for p in plan.layers)


def test_cells_of_an_earlier_int4_emulation_are_ignored(vllm_run, tmp_path, capsys):
    """Profiles written before int4_per_token_head followed vLLM's rotated write hold wrong damage for it."""
    import json
    import shutil

    old = tmp_path / "old-profile"
    shutil.copytree(vllm_run.profile, old)
    meta = json.loads((old / "meta.json").read_text())
    assert meta["schemes"]["int4_per_token_head"]["revision"] == 2
    del meta["schemes"]["int4_per_token_head"]["revision"]
    (old / "meta.json").write_text(json.dumps(meta))
    rc, out, err = run_cli(capsys, "plan", old, "--target", "vllm", "--avg-bits", "5", "--out", tmp_path / "p.json")
    assert "ignoring int4_per_token_head: this profile measured them with an earlier emulation" in err
    if rc == 0:
        assert load_plan(str(tmp_path / "p.json")).engine.kv_cache_dtype != "int4_per_token_head"
    rc, out, err = run_cli(capsys, "plan", vllm_run.profile, "--target", "vllm", "--avg-bits", "5",
                           "--out", tmp_path / "q.json")
    assert rc == 0 and "ignoring" not in err


def test_serving_budget_is_checked_with_vllms_pool(vllm_run, tmp_path, capsys):
    """A dense model's pool is the sum of its layers' pages: what the planner priced, up to whole blocks."""
    path = tmp_path / "serve.json"
    rc, out, err = run_cli(capsys, "plan", vllm_run.profile, "--target", "vllm", "--gpu-mem-gib", "0.01",
                           "--max-model-len", "1024", "--max-num-seqs", "4", "--out", path)
    assert rc == 0, err
    plan = load_plan(str(path))
    need = plan.predicted.vllm_pool_bytes
    used = plan.predicted.budget_used
    assert used <= need <= used * 1.02  # block rounding only
    assert ("vLLM's pool needs" in err) == (need > 0.01 * 2**30)


@pytest.fixture(scope="module")
def cpu_profile(tiny_model_dir, tmp_path_factory, _one_thread):
    prof = tmp_path_factory.mktemp("vllm-cpu-target") / "profile"
    assert main(["profile", "--model", tiny_model_dir, "--target", "vllm", "--vllm-gpu", "cpu", "--seq-len", "32",
                 "--windows", "2", "--out", str(prof), "--device", "cpu", "--quiet"]) == 0
    return str(prof)


def test_per_layer_plan_for_vllms_cpu_backend_and_its_plugin_line(cpu_profile, capsys, tmp_path):
    """plan --target vllm --vllm-gpu cpu --per-layer: each layer its own dtype among auto / fp8_e4m3 / fp8_e5m2 or a
    K/V pair of the plugin's, within the budget and no worse by prediction than the one-dtype plan of the same budget; export prints the
    `vllm serve ... --additional-config` line that sensprof's plugin reads (its own parser accepts it and its model
    check passes for the profiled model)."""
    import json
    import shlex

    from sensprof.models import describe_layers
    from conftest import make_tiny_model

    per = tmp_path / "per.json"
    one = tmp_path / "one.json"
    base = ["plan", cpu_profile, "--target", "vllm", "--vllm-gpu", "cpu", "--avg-bits", "11", "--select-measured", "0"]
    rc, out, err = run_cli(capsys, *base, "--per-layer", "--out", per)
    assert rc == 0, err
    rc, _, err = run_cli(capsys, *base, "--out", one)
    assert rc == 0, err
    plan, global_plan = load_plan(str(per)), load_plan(str(one))
    from sensprof.targets import get_target

    dtypes = plan.engine.layer_dtypes
    schemes = {d.flag_value: d.schemes for d in get_target("vllm", "cpu", per_layer=True).dtypes}
    assert len(dtypes) == len(plan.layers) and set(dtypes) <= set(schemes)
    assert plan.engine.architecture == "LlamaForCausalLM"
    assert [(p.k_scheme, p.v_scheme) for p in plan.layers] == [schemes[d] for d in dtypes]
    # the CPU target's profile measured KIVI values too, so layers may keep K and V in their own formats: at 11 bits
    # the tiny model's plan takes such a pair (k:<K>/v:<V>, the plugin's SENSPROF_KV backend)
    assert any(d.startswith("k:") for d in dtypes), dtypes
    assert plan.predicted.avg_bits <= 11 + 1e-9
    assert plan.predicted.damage <= global_plan.predicted.damage * (1 + 1e-9)  # a superset of the one-dtype plans
    rc, out, err = run_cli(capsys, "export", per, "--format", "vllm", "--gpu-mem-gib", "1")
    assert rc == 0, err
    line = next(ln for ln in out.splitlines() if ln.startswith("vllm serve"))
    argv = shlex.split(line)
    config = json.loads(argv[argv.index("--additional-config") + 1])
    assert "sensprof's vLLM plugin" in out
    mod = plugin_plan_module()
    parsed = mod.plan_from_additional_config(config)
    assert list(parsed.layers) == list(dtypes)
    model = make_tiny_model("llama")
    info = describe_layers(model)
    mod.check_model(parsed, {"architectures": ["LlamaForCausalLM"], "num_layers": len(info),
                             "num_kv_heads": info[0].kv_heads, "head_dim": info[0].head_dim,
                             "head_size": info[0].head_dim, "sliding_window": None, "layer_types": None,
                             "hybrid": False, "mla": False, "encoder_decoder": False, "speculative": False,
                             "kv_cache_scheme": False, "platform": "cpu"})
    from sensprof.export.vllm import PLUGIN_FORMAT, PLUGIN_KEY, PLUGIN_VERSION

    assert (PLUGIN_KEY, PLUGIN_FORMAT, PLUGIN_VERSION) == (mod.KEY, mod.FORMAT, mod.VERSION)


def test_per_layer_dtypes_on_nvidia_gpus():
    """On CUDA the plugin builds every layer on TRITON_ATTN: vLLM's dtypes it serves per layer, an fp8_e4m3 layer's
    keys with the query cast to fp8 (TRITON_ATTN casts it on every CUDA GPU), no fp8 on Ampere, no pairs yet; a
    --target vllm profile for a GPU holds those keys."""
    from sensprof.targets import get_target, profile_menu

    for gpu in ("hopper", "blackwell"):
        dts = {d.flag_value: d.schemes for d in get_target("vllm", gpu, per_layer=True, head_dims=[64]).dtypes}
        assert dts == {"auto": ("none", "none"), "fp8_e4m3": ("fp8_e4m3_qfp8", "fp8_e4m3"),
                       **{f: (f, f) for f in ("fp8_per_token_head", "int8_per_token_head", "int4_per_token_head")}}
        assert "fp8_e4m3_qfp8" in {s.name for s in profile_menu(None, "vllm", gpu, [64]).k}
    assert {d.flag_value for d in get_target("vllm", "ampere", per_layer=True).dtypes} == \
        {"auto", "int8_per_token_head", "int4_per_token_head"}


def test_per_layer_plan_for_a_gpu(vllm_run, capsys, tmp_path):
    """plan --vllm-gpu hopper --per-layer: each layer one of the dtypes TRITON_ATTN serves per layer, within the budget,
    no worse by prediction than the one-dtype plan of the same budget; export prints the plugin's line, the KV bytes
    vLLM 0.33 allocates per token (each layer's own page: one group on a dense model), and that no GPU has run it."""
    import json
    import shlex

    from sensprof.engines.vllm import facts
    from sensprof.targets import get_target

    per, one = tmp_path / "per.json", tmp_path / "one.json"
    base = ["plan", vllm_run.profile, "--target", "vllm", "--vllm-gpu", "hopper", "--avg-bits", "7",
            "--select-measured", "0"]
    rc, _, err = run_cli(capsys, *base, "--per-layer", "--out", per)
    assert rc == 0, err
    rc, _, err = run_cli(capsys, *base, "--out", one)
    assert rc == 0, err
    plan, global_plan = load_plan(str(per)), load_plan(str(one))
    schemes = {d.flag_value: d.schemes for d in get_target("vllm", "hopper", per_layer=True).dtypes}
    dtypes = plan.engine.layer_dtypes
    assert set(dtypes) <= set(schemes) and len(set(dtypes)) > 1, dtypes  # between two dtypes' sizes: a mix
    assert [(p.k_scheme, p.v_scheme) for p in plan.layers] == [schemes[d] for d in dtypes]
    assert plan.predicted.avg_bits <= 7 + 1e-9
    assert plan.predicted.damage <= global_plan.predicted.damage * (1 + 1e-9)
    rc, out, err = run_cli(capsys, "export", per, "--format", "vllm")
    assert rc == 0, err
    line = next(ln for ln in out.splitlines() if ln.startswith("vllm serve"))
    argv = shlex.split(line)
    parsed = plugin_plan_module().plan_from_additional_config(json.loads(argv[argv.index("--additional-config") + 1]))
    assert list(parsed.layers) == list(dtypes)
    own = sum(facts.page_bytes_per_token(d, p.kv_heads, p.head_dim) for d, p in zip(dtypes, plan.layers))
    assert f"{own:,} bytes/token" in out.replace("B/token", "bytes/token") or f"{own} bytes/token" in out, out
    assert "not yet run on a GPU" in out


@pytest.mark.parametrize("extra, match", [
    (["--vllm-gpu", "rocm", "--per-layer"], "not on ROCm"),
    (["--vllm-gpu", "cpu", "--per-layer", "--num-skip", "1"], "drop one of them"),
])
def test_per_layer_refusals(cpu_profile, capsys, extra, match):
    line = one_error_line(*run_cli(capsys, "plan", cpu_profile, "--target", "vllm", "--avg-bits", "11",
                                   "--select-measured", "0", *extra))
    assert match in line
    line = one_error_line(*run_cli(capsys, "plan", cpu_profile, "--target", "sensprof", "--avg-bits", "11",
                                   "--per-layer"))
    assert "--per-layer gives each vLLM layer its own dtype; target sensprof has none" in line


def test_per_layer_plan_of_a_sliding_window_model_is_priced_as_vllm_allocates(tmp_path_factory, tiny_tokenizer,
                                                                               _one_thread, capsys):
    """A tiny Gemma 3 (two 8-token-window layers, one full): vLLM would pad pages that do not divide the largest
    (docs/vllm-plugin.md), so `plan --per-layer` makes only plans it pads nothing in, at bf16 and float32; export prints
    vLLM's pool at exactly the bytes per token the plan priced, and the plugin's own pool check accepts the plan."""
    import json
    import re
    import shlex

    from conftest import make_tiny_model
    from sensprof.planning.budget import vllm_cpu_pool

    d = tmp_path_factory.mktemp("tiny-gemma3")
    make_tiny_model("gemma3").save_pretrained(d)
    tiny_tokenizer.save_pretrained(d)
    prof = d / "profile"
    assert main(["profile", "--model", str(d), "--target", "vllm", "--vllm-gpu", "cpu", "--seq-len", "32",
                 "--windows", "2", "--out", str(prof), "--device", "cpu", "--quiet"]) == 0
    mod = plugin_plan_module()
    seen = set()
    for bits in ("6", "8", "11", "14"):
        path = d / f"plan-{bits}.json"
        rc, out, err = run_cli(capsys, "plan", str(prof), "--target", "vllm", "--vllm-gpu", "cpu", "--per-layer",
                               "--avg-bits", bits, "--select-measured", "0", "--out", path)
        if rc != 0:
            assert "infeasible" in err, err
            continue
        plan = load_plan(str(path))
        layers = [(dt, p.kv_heads, p.head_dim, p.window if p.kind == "sliding" else None)
                  for dt, p in zip(plan.engine.layer_dtypes, plan.layers)]
        assert [w for *_, w in layers] == [8, 8, None]
        for itemsize in (2, 4):
            pool = vllm_cpu_pool(layers, itemsize)
            assert not pool.padded and len(pool.groups) >= 2  # windowed and full layers apart, nothing padded
        assert pool.own_bytes_per_token * 8 <= float(bits) * sum(2 * p.kv_heads * p.head_dim for p in plan.layers) * 2
        seen |= set(plan.engine.layer_dtypes)
        rc, out, err = run_cli(capsys, "export", path, "--format", "vllm")
        assert rc == 0, err
        priced = int(re.search(r"# KV cache: ([\d,]+) bytes/token", out).group(1).replace(",", ""))
        pooled = re.search(r"# vLLM's KV pool .*: ([\d,]+) bytes/token at bf16 in (\d+) KV cache groups?, nothing "
                           r"padded: the plan's price", out)
        assert int(pooled.group(1).replace(",", "")) == priced == vllm_cpu_pool(layers, 2).bytes_per_token
        argv = shlex.split(next(ln for ln in out.splitlines() if ln.startswith("vllm serve")))
        parsed = mod.plan_from_additional_config(json.loads(argv[argv.index("--additional-config") + 1]))
        for itemsize in (2, 4):  # what the plugin checks at start-up, at both model dtypes
            assert mod.check_pool(parsed, layers, itemsize, 128).bytes_per_token == \
                sum(mod.layer_bytes(dt, h, hd, itemsize) for dt, h, hd, _ in layers)
    assert len(seen) > 1, seen


def test_per_layer_plans_are_weighed_against_each_plugin_dtype_alone(cpu_profile, capsys, tmp_path):
    """--select-measured on a per-layer plan measures beside it the best dtypes the plugin serves, each alone on every
    layer (vLLM's own and the K/V pairs; found by a screen of each K and V format alone, as for the sensprof target),
    and validate measures the same baselines; such a uniform configuration is itself a per-layer plan that the
    plugin's reader takes, every layer the one dtype."""
    import json
    import shlex

    import pandas as pd

    from sensprof.planning.selection import per_layer_uniform_plan
    from sensprof.planning.uniforms import per_layer_candidates
    from sensprof.targets import get_target
    from sensprof.validation.baselines import layer_info

    path = tmp_path / "sel.json"
    rc, out, err = run_cli(capsys, "plan", cpu_profile, "--target", "vllm", "--vllm-gpu", "cpu", "--per-layer",
                           "--avg-bits", "11", "--select-measured", "1", "--select-seq-len", "64", "--out", path)
    assert rc == 0, err
    plan = load_plan(str(path))
    select = plan.solver.select
    pairs = [c for c in select["candidates"] if c["uniform"] and c["name"].startswith("uniform k:")]
    assert pairs, [c["name"] for c in select["candidates"]]
    limit = plan.budget.limit(layer_info(plan.layers))
    assert all(c["budget_used"] <= limit * (1 + 1e-9) and c["measured_kl"] >= 0 for c in pairs)
    assert set(select["uniform_screen"]["k"]) and set(select["uniform_screen"]["v"])
    if select["uniform_won"]:
        assert len(set(plan.engine.layer_dtypes)) == 1

    tgt = get_target("vllm", "cpu", head_dims={p.head_dim for p in plan.layers}, per_layer=True)
    c = next(c for c in per_layer_candidates(tgt.dtypes, plan.budget, layer_info(plan.layers))
             if c.flag.startswith("k:"))
    screened = {"k": {c.k: 1e-3}, "v": {c.v: 2e-3}}
    uniform = per_layer_uniform_plan(plan, c, {}, screened)  # no profile cells: each layer its share of the screen
    assert uniform.engine.layer_dtypes == (c.flag,) * len(plan.layers)
    assert [(p.k_scheme, p.v_scheme) for p in uniform.layers] == [(c.k, c.v)] * len(plan.layers)
    assert abs(uniform.predicted.damage - 3e-3) < 1e-12 and uniform.predicted.budget_used == c.cost
    uniform.save(str(tmp_path / "uniform.json"))
    rc, out, err = run_cli(capsys, "export", tmp_path / "uniform.json", "--format", "vllm")
    assert rc == 0, err
    argv = shlex.split(next(ln for ln in out.splitlines() if ln.startswith("vllm serve")))
    parsed = plugin_plan_module().plan_from_additional_config(json.loads(argv[argv.index("--additional-config") + 1]))
    assert list(parsed.layers) == [c.flag] * len(plan.layers)

    rc, out, err = run_cli(capsys, "validate", path, "--windows", "1", "--seq-len", "64",
                           "--out", tmp_path / "v.csv")
    assert rc == 0, err
    rows = pd.read_csv(tmp_path / "v.csv")
    assert rows.config.str.startswith("best uniform k:").any(), list(rows.config)
