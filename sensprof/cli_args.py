"""The command line's arguments: one parser per command, the model options shared by every command that loads
a model. cli.py turns the parsed arguments into sensprof.api calls."""

from __future__ import annotations

import argparse

from .errors import SensprofError
from .profiling.route import LONGEST_ROUTE, SHORT_SEQ_LEN, SHORT_WINDOWS


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, no usage dump
        raise SensprofError(f"{message}; see `{self.prog} --help`")


def path_arg(value: str) -> str:
    """Every path the command line takes: an empty one would name the current folder (or nothing) silently."""
    if not value.strip():
        raise argparse.ArgumentTypeError("an empty path names no file or folder; pass a name (e.g. ./out)")
    return value


DEVICE_HELP = "cpu, cuda, cuda:N or auto (default: cuda if available)"


def _add_model_args(p, of: str | None = None, device_help: str = DEVICE_HELP, device_default: str = "auto",
                    model_help: str | None = None):
    """The model options every command that loads a model shares; `of`: whose model is the default (a plan's)."""
    if of is None:
        p.add_argument("--model", default="smollm2-135m",
                       help="hub id, local model directory, .gguf file, or built-in alias smollm2-135m (default) or gemma3-270m")
    else:
        p.add_argument("--model", default=None, help=model_help or f"model to load (default: the {of}'s model)")
    p.add_argument("--device", default=device_default, help=device_help)
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: float32 on CPU, bfloat16 on CUDA)")
    p.add_argument("--device-map", default=None, help="pass 'auto' to spread a large model over GPUs (accelerate)")
    p.add_argument("--trust-remote-code", action="store_true", help="allow the model's own code from the hub")


def _add_engine_args(p, llamacpp=False):
    p.add_argument("--vllm-gpu", default=None,
                   help="vllm: the GPU vLLM runs on, which decides the KV dtypes it offers: hopper (default; "
                        "H100/H200) | ampere | blackwell | rocm")
    if llamacpp:
        p.add_argument("--llamacpp-build", default=None,
                       help="llamacpp: cuda-default restricts -ctk/-ctv to the pairs a default CUDA build runs "
                            "(f16, q8_0, q4_0 with K and V alike); default: any pair")


TEXT_FORMS = ("a plain-text file, a folder (every file under it, sorted; hidden and binary files skipped) or JSONL "
              "(.jsonl: {\"text\": ...} or {\"messages\": [{\"role\", \"content\"}, ...]} lines, chats rendered "
              "with the model's chat template); repeatable")


def _add_text_args(p, seq_len=256, windows=2, lengths=False,
                   text_help=f"{TEXT_FORMS} (default: the built-in mixture of Python's pydoc prose, standard-library "
                             "code and Unicode records)"):
    p.add_argument("--text", type=path_arg, action="append", metavar="FILE", help=text_help)
    if lengths:  # profile's: left unnamed, the model decides (sensprof.profiling.route)
        p.add_argument("--seq-len", default=None,
                       help=f"tokens per window (default {seq_len}, or the long-context route below); a list such as "
                            "256,1024,4096 profiles each length (the longest in --out, the others in "
                            "--out/lengths/<L>); `sensprof summary` shows damage vs length")
        p.add_argument("--windows", type=int, default=None,
                       help=f"number of windows (default {windows}). With --seq-len, --windows, --kl, --menus and the "
                            f"schemes all left out, a model whose sliding windows are {seq_len} tokens or more (up "
                            f"to {LONGEST_ROUTE // 2}) gets the long-context route instead: one window of twice its "
                            "sliding window, --menus long, --kl sampled")
    else:
        p.add_argument("--seq-len", type=int, default=seq_len, help=f"tokens per window (default {seq_len})")
        p.add_argument("--windows", type=int, default=windows, help=f"number of windows (default {windows})")
    p.add_argument("--seed", type=int, default=0, help="which windows of the text are taken (default 0)")


def build_parser() -> argparse.ArgumentParser:
    from .schemes import DEFAULT_K_SCHEMES, DEFAULT_V_SCHEMES, LONG_K_SCHEMES, LONG_V_SCHEMES, MENUS

    parser = Parser(prog="sensprof", description="Per-layer Key/Value cache quantization sensitivity for causal LMs.")
    sub = parser.add_subparsers(dest="command", parser_class=Parser, metavar="COMMAND")

    p = sub.add_parser("profile", help="measure the damage of quantizing each layer's K and V with each scheme")
    _add_model_args(p)
    _add_text_args(p, seq_len=SHORT_SEQ_LEN, windows=SHORT_WINDOWS, lengths=True)
    p.add_argument("--schemes", default=None,
                   help="comma-separated scheme names for both K and V (see `sensprof schemes`); default: the K and "
                        "V menus below, or those --target needs")
    p.add_argument("--k-schemes", default=None,
                   help="key menu (default: " + ",".join(DEFAULT_K_SCHEMES) + ")")
    p.add_argument("--v-schemes", default=None,
                   help="value menu (default: " + ",".join(DEFAULT_V_SCHEMES) + ")")
    p.add_argument("--menus", default=None, choices=tuple(MENUS),
                   help="the K and V menus where --k-schemes / --v-schemes do not name them: default (above) or long, "
                        "the layouts that win at length, for a profile at the length it serves (with --seq-len 1024 "
                        "--windows 1: the default profile's cost; docs/plan-quality.md): keys "
                        + ",".join(LONG_K_SCHEMES) + "; values " + ",".join(LONG_V_SCHEMES))
    p.add_argument("--kl", default=None,
                   help="exact (default, but see --windows: LM head and KL in vocabulary chunks) | sampled[:K] "
                        "(opt-in approximation: the top K tokens plus K tail samples per position; K=256) | "
                        "materialized (full logits)")
    p.add_argument("--screen", action="store_true",
                   help="opt-in approximation: every cell's local metrics, but end-to-end passes only for the cells "
                        "on each layer's bits-vs-damage hull; the rest get a KL predicted from their local error "
                        "(marked measured=False)")
    p.add_argument("--target", default=None,
                   help="profile every scheme this target can use: vllm | sglang | llamacpp | sensprof (the default "
                        "schemes); with --schemes, both")
    _add_engine_args(p)
    p.add_argument("--reads", default=None,
                   help="how the served cache reads its tokens: streaming (sink tokens, residual windows and incomplete "
                        "per-channel key groups unquantized, as sensprof's runtime and KIVI hold them) | all (every "
                        "cached token read quantized, as vLLM, SGLang and llama.cpp read it); default: the --target's, "
                        "else streaming")
    p.add_argument("--layers", default=None, help="subset of layers, e.g. 0-11 or 0,5,7-9 (default: all)")
    p.add_argument("--out", type=path_arg, default=None, help="output directory (default: profiles/<model>); re-running resumes")
    p.add_argument("--variants-per-pass", type=int, default=1,
                   help="schemes evaluated together in one batched forward (raise on a GPU; default 1)")
    p.add_argument("--naive", action="store_true",
                   help="a full forward per cell with full [tokens, vocab] logits compared, instead of replaying from the "
                        "quantized layer and comparing in vocabulary chunks (the reference for benchmarks)")
    p.add_argument("--ray", nargs="?", const=True, default=None, metavar="ADDRESS",
                   help="fan the cells out over a Ray cluster (pip install 'sensprof[ray]'): its address (auto, "
                        "host:6379, ray://host:10001), or none to start one on this machine")
    p.add_argument("--ray-workers", type=int, default=None, metavar="N",
                   help="with --ray: workers, each loading the model once (default: one per GPU of the cluster, "
                        "else one per CPU)")
    p.add_argument("--ray-gpus-per-worker", type=int, default=None, metavar="G",
                   help="with --ray: GPUs of one node each worker spreads the model over with --device-map auto "
                        "(default 1)")
    p.add_argument("--quiet", action="store_true", help="no progress bar and no summary")

    m = sub.add_parser("merge", help="join profiles of one model and settings: computed for different layers, or on other windows of the "
                              "same text (another --seed)")
    m.add_argument("dirs", nargs="+", type=path_arg, help="profile directories")
    m.add_argument("--out", type=path_arg, required=True, help="directory for the merged profile")

    def add_budget(q):
        q.add_argument("--avg-bits", type=float, default=None,
                       help="average stored bits per cached element over all layers, scales included")
        q.add_argument("--fraction", type=float, default=None, help="fraction of the bf16 cache, e.g. 0.3")
        q.add_argument("--gpu-mem-gib", type=float, default=None,
                       help="GiB for the KV cache of --max-num-seqs sequences of --max-model-len tokens")
        q.add_argument("--max-model-len", type=int, default=None, help="tokens per sequence (with --gpu-mem-gib)")
        q.add_argument("--max-num-seqs", type=int, default=None, help="concurrent sequences (with --gpu-mem-gib)")
        q.add_argument("--context-len", type=int, default=None, metavar="N",
                       help="the context length the plan serves: its damage is priced there for the target's "
                            "reads (default min(4096, the model's positions); at least the profile's window), and "
                            "--avg-bits/--fraction as a cache of N tokens holds them (full-precision sinks, residual "
                            "windows and incomplete groups at 16 bits, each layer weighed by the tokens it holds; default: "
                            "the long-context average per token slot)")

    pl = sub.add_parser("plan", help="choose each layer's K and V scheme under a memory budget (integer program)")
    pl.add_argument("profile_dir", type=path_arg, help="directory written by `sensprof profile`")
    add_budget(pl)
    pl.add_argument("--target", default="sensprof", help="sensprof (default) | vllm | sglang | llamacpp")
    pl.add_argument("--objective", default="kl", help="kl (default) | dnll | local (attention-output error)")
    pl.add_argument("--robust", type=float, nargs="?", const=1.0, default=0.0, metavar="X",
                    help="objective kl: cost each cell its mean KL plus X (default 1) times its spread across windows")
    pl.add_argument("--refine", type=int, default=0, metavar="N",
                    help="up to N rounds: measure the whole plan, re-measure the cells near the decision boundary "
                         "with the rest of the plan applied, re-solve; stops when measured KL stops improving "
                         "(loads the model and the profile's text)")
    pl.add_argument("--select-measured", type=int, default=None, metavar="N",
                    help="targets sensprof and vllm: the final plan is chosen among plans at this budget (objectives "
                         "kl and dnll, --robust) and the strongest uniform configurations of no more memory (vllm: "
                         "each dtype alone) by measured KL on N windows of the profile's text that neither the "
                         "profile nor validate uses; if a uniform configuration wins, or a plan leads it by less than "
                         "one standard error, the plan is that configuration and says so (loads the model; default "
                         "2, 0 with --num-skip; 0: by predicted damage alone)")
    pl.add_argument("--select-seq-len", type=int, default=None, metavar="T",
                    help="with --select-measured: tokens per window (default 4x the profile's, within --context-len)")
    pl.add_argument("--select-uniforms", choices=("all", "menus"), default="all",
                    help="with --select-measured, target sensprof: the uniform configurations a plan must beat: all "
                         "(default: every one sensprof stores within the budget, each scheme screened alone on one "
                         "window first; a few dozen short passes) or menus (the profile's menus, by prediction)")
    pl.add_argument("--per-layer", action="store_true",
                    help="vllm --vllm-gpu cpu: each layer its own --kv-cache-dtype (auto, fp8_e4m3, fp8_e5m2), served "
                         "by sensprof's vLLM plugin (plugins/vllm); export prints its --additional-config")
    pl.add_argument("--select-text", type=path_arg, action="append", metavar="FILE",
                    help="with --select-measured: choose on windows of your own text instead of the profile's: "
                         f"{TEXT_FORMS}; refused if it holds the profile's windows; the plan records it")
    _add_model_args(pl, of="profile", device_help="--refine, --select-measured: cpu, cuda or auto")
    pl.add_argument("--num-skip", type=int, default=None,
                    help="vllm: keep exactly this many layers at the model dtype (the planner picks which), besides "
                         "the boundary layers vLLM itself keeps for some dtypes")
    _add_engine_args(pl, llamacpp=True)
    pl.add_argument("--out", type=path_arg, default=None, help="plan JSON path (default: plans/<model>-<target>-<budget>.json)")

    sw = sub.add_parser("sweep", help="plan a range of budgets: the frontier of predicted damage vs memory")
    sw.add_argument("profile_dir", type=path_arg, help="directory written by `sensprof profile`")
    sw.add_argument("--target", default="sensprof", help="sensprof (default) | vllm | sglang | llamacpp")
    sw.add_argument("--objective", default="kl", help="kl (default) | dnll | local")
    sw.add_argument("--robust", type=float, nargs="?", const=1.0, default=0.0, metavar="X",
                    help="objective kl: mean KL plus X (default 1) times its spread across windows")
    _add_engine_args(sw, llamacpp=True)
    sw.add_argument("--avg-bits", default="3,3.5,4,4.5,5,6,8",
                    help="comma-separated --avg-bits budgets (default 3,3.5,4,4.5,5,6,8)")
    sw.add_argument("--context-len", type=int, default=None, metavar="N",
                    help="the context length the plans serve: damage and budgets priced there (see plan --context-len)")
    sw.add_argument("--select-measured", type=int, default=0, metavar="N",
                    help="targets sensprof and vllm: choose each budget's plan as plan --select-measured N does, by "
                         "measured KL on N windows the profile and --validate do not use (loads the model; default "
                         "0: the planner's plans, by predicted damage)")
    sw.add_argument("--select-seq-len", type=int, default=None, metavar="T",
                    help="with --select-measured: tokens per window (default 4x the profile's, within --context-len)")
    sw.add_argument("--select-text", type=path_arg, action="append", metavar="FILE",
                    help="with --select-measured: choose each budget's plan on your own text, as plan --select-text: "
                         f"{TEXT_FORMS}")
    sw.add_argument("--validate", action="store_true",
                    help="also measure each plan and the menu's uniform configurations on unseen windows")
    sw.add_argument("--uniform", default="frontier",
                    help="with --validate, which uniform configurations (every layer one K and one V scheme of the "
                         "menu) to measure: frontier (default: those the profile predicts within 1.5x of the best "
                         "at their memory, plus the common ones) | all | none")
    sw.add_argument("--windows", type=int, default=None, help="validation windows (default: as profiled)")
    sw.add_argument("--seq-len", type=int, default=None, help="validation tokens per window (default: as profiled)")
    _add_model_args(sw, of="profile", device_help="validation device (default: cuda if available)")
    sw.add_argument("--out", type=path_arg, default=None, help="directory for the plans and sweep.csv (default: plans/sweep-<model>-<target>)")

    va = sub.add_parser("validate", help="apply a whole plan on unseen windows; compare with uniform configurations")
    va.add_argument("plan", type=path_arg, help="plan JSON written by `sensprof plan`")
    _add_model_args(va, of="plan")
    va.add_argument("--windows", type=int, default=None, help="windows (default: as many as profiled)")
    va.add_argument("--seq-len", default=None,
                    help="tokens per window, or a list such as 256,1024 (default: as profiled and 4x that, within the "
                         "model's positions); a plan whose advantage over uniform vanishes at a longer length is flagged")
    va.add_argument("--engine", default=None,
                    help="vllm or llamacpp: run the plan as exported in the real engine (vLLM's offline LLM, llama.cpp) on the same "
                         "windows and compare its measured KL/dNLL with sensprof's emulation (tools/engines/install.sh "
                         "installs both; CSV default <plan>.engine-<engine>.csv)")
    va.add_argument("--engine-python", type=path_arg, default=None,
                    help="the Python of the environment the engine is installed in (default: $SENSPROF_VLLM_PYTHON / "
                         "$SENSPROF_LLAMACPP_PYTHON, the `vllm` command on PATH, ~/.cache/sensprof/engines/, this one)")
    va.add_argument("--out", type=path_arg, default=None, help="CSV path (default: beside the plan, <plan>.validation.csv)")
    va.add_argument("--text", type=path_arg, action="append", metavar="FILE",
                    help=f"judge the plan on your own text instead of the profile's unseen windows: {TEXT_FORMS}; "
                         "refused if it shares text with the profile's windows (the CSV's text, text_digest say which)")

    ex = sub.add_parser("export", help="print a ready serving command line for a plan (and write scales)")
    ex.add_argument("plan", type=path_arg, help="plan JSON written by `sensprof plan`")
    ex.add_argument("--format", required=True, help="vllm | sglang | llamacpp")
    ex.add_argument("--vllm-version", default="0.33.0", help="vLLM version to emit flags for (default 0.33.0)")
    ex.add_argument("--vllm-gpu", default=None,
                    help="vllm: refuse a dtype that vLLM does not run on this GPU (hopper | ampere | blackwell | rocm)")
    _add_model_args(ex, of="plan", device_help="where weights load for --model checks and --write-checkpoint "
                    "(default cpu)", device_default="cpu",
                    model_help="model to serve and check the plan against (default: the plan's model)")
    ex.add_argument("--gpu-mem-gib", type=float, default=80.0,
                    help="KV-cache memory for the tokens-that-fit comment (default 80)")
    ex.add_argument("--scales-out", type=path_arg, default=None, metavar="FILE",
                    help="sglang, fp8_e4m3 plans: write the --quantization-param-path JSON here")
    ex.add_argument("--tp", type=int, default=1, metavar="N",
                    help="sglang: tensor-parallel size to key the scales by and pass as --tp-size (default 1)")
    ex.add_argument("--write-checkpoint", type=path_arg, default=None, metavar="DIR",
                    help="vllm: write a bf16 copy of the model vLLM serves (GGUF included), with calibrated "
                         "per-layer k_scale/v_scale for fp8_e4m3 plans")
    ex.add_argument("--hub-id", default=None, metavar="ORG/NAME",
                    help="vllm, GGUF model: the Hugging Face repository it was converted from (vLLM has no GGUF "
                         "loader); default: the built-in alias's or the GGUF metadata's")

    ge = sub.add_parser("generate", help="generate text through the planned quantized cache (reference runtime)")
    ge.add_argument("--plan", type=path_arg, required=True, help="plan JSON written by `sensprof plan` (target sensprof or any)")
    _add_model_args(ge, of="plan")
    ge.add_argument("--prompt", action="append", required=True, help="prompt text; repeat for a batch")
    ge.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate (default 64)")
    ge.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    ge.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    ge.add_argument("--kernels", default="auto",
                    help="auto (Triton on a GPU, compiled C on the CPU, else the PyTorch reference) | triton | cpu | reference")

    rp = sub.add_parser("report", help="figures (PNG) and one self-contained HTML page from a profile, plans, sweeps")
    rp.add_argument("profile_dir", type=path_arg, help="directory written by `sensprof profile`")
    rp.add_argument("--plan", type=path_arg, action="append", default=[], metavar="P",
                    help="plan JSON to draw (and its <plan>.validation.csv if present); repeatable")
    rp.add_argument("--sweep", type=path_arg, action="append", default=[], metavar="S",
                    help="directory written by `sensprof sweep` (holds sweep.csv); repeatable, e.g. one per target")
    rp.add_argument("--metric", default="kl", help="damage in the heatmaps: kl (default) | dnll | attn_kl | out_rel_l2")
    rp.add_argument("--reference-scheme", default=None,
                    help="scheme for the K-vs-V figure (default: int4_per_token_head or the first profiled for K and V)")
    rp.add_argument("--out", type=path_arg, required=True, help="directory for the PNGs and report.html")

    ev = sub.add_parser("eval", help="long-context retrieval/passkey accuracy of a plan through the runtime cache")
    ev.add_argument("--plan", type=path_arg, required=True, help="plan JSON written by `sensprof plan`")
    _add_model_args(ev, of="plan")
    ev.add_argument("--task", default="retrieval",
                    help="retrieval (default: repeat a planted 32-token needle) | passkey (recall a 5-digit key)")
    ev.add_argument("--lengths", default="1k,2k,4k", help="context lengths in tokens, e.g. 1k,2k,4k or 2048")
    ev.add_argument("--depths", default="0.1,0.5,0.9", help="where the needle sits, fractions in [0, 1] (default 0.1,0.5,0.9)")
    ev.add_argument("--seeds", type=int, default=3, help="samples per length and depth (default 3)")
    ev.add_argument("--chunk", type=int, default=512, help="tokens per prefill forward (default 512)")
    ev.add_argument("--uniform", default="auto",
                    help="auto (default: uniform configurations nearest the plan's memory, not below) | all | none")
    _add_text_args(ev, seq_len=1024, windows=2,
                   text_help=f"also measure perplexity through the cache on this text: {TEXT_FORMS}")
    ev.add_argument("--out", type=path_arg, default=None, help="CSV path (default: beside the plan, <plan>.eval-<task>.csv, or "
                    "<plan>.lm-eval.csv with --lm-eval-tasks)")
    ev.add_argument("--quiet", action="store_true", help="no progress lines")
    ev.add_argument("--lm-eval-tasks", default=None, metavar="T1,T2",
                    help="instead of --task: lm-evaluation-harness tasks (names or patterns, e.g. gsm8k or "
                         "hellaswag,arc_easy) through the runtime cache; needs pip install 'sensprof[eval]'")
    ev.add_argument("--lm-eval-include", action="append", default=None, metavar="DIR",
                    help="with --lm-eval-tasks: a directory of your own lm-eval task YAML files; repeatable")
    ev.add_argument("--lm-eval-limit", type=float, default=None, metavar="N",
                    help="with --lm-eval-tasks: documents per task (a fraction below 1: that share of them)")
    ev.add_argument("--num-fewshot", type=int, default=None, metavar="N",
                    help="with --lm-eval-tasks: few-shot examples per prompt (default: each task's own)")
    ev.add_argument("--lm-eval-truncate", action="store_true",
                    help="with --lm-eval-tasks: cut requests longer than the model's positions from the left, with a "
                         "warning saying how many tokens (default: refuse them)")

    s = sub.add_parser("summary", help="print the summary table of a profile directory")
    s.add_argument("dir", help="profile directory")

    sc = sub.add_parser("schemes", help="list the quantization schemes and their storage cost")
    sc.add_argument("--target", default=None,
                    help="vllm: list every vLLM KV dtype with its bits, the GPUs it runs on and why others are excluded")
    _add_engine_args(sc)
    return parser
