"""Eager attention vs transformers' SDPA on this CPU, at the shapes of the default model (9 query heads, 3 KV heads,
head_dim 64, 2 windows, a float causal mask as the profiler passes it): why untapped layers take SDPA where a probe
finds it equal. Prints seconds per call and the largest difference.
    python benchmarks/attention_eager_vs_sdpa.py [--lengths 256,1024,4096] [--repeats 5]
"""

import argparse
import time

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.models.llama.modeling_llama import eager_attention_forward


class _Module(torch.nn.Module):
    num_key_value_groups = 3
    is_causal = True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="256,1024,4096")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    module = _Module().eval()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'tokens':>7} {'eager s':>9} {'sdpa s':>9} {'speed-up':>9} {'max |diff|':>11}")
    for t in (int(x) for x in args.lengths.split(",")):
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(2, h, t, 64, generator=g) for h in (9, 3, 3))
        mask = torch.full((t, t), torch.finfo(torch.float32).min).triu(1)[None, None].expand(2, 1, t, t)
        secs, outs = {}, {}
        for name, fn in (("eager", eager_attention_forward), ("sdpa", sdpa_attention_forward)):
            outs[name] = fn(module, q, k, v, mask, scaling=0.125, dropout=0.0)[0]
            start = time.perf_counter()
            for _ in range(args.repeats):
                fn(module, q, k, v, mask, scaling=0.125, dropout=0.0)
            secs[name] = (time.perf_counter() - start) / args.repeats
        diff = float((outs["eager"] - outs["sdpa"]).abs().max())
        print(f"{t:>7} {secs['eager']:>9.4f} {secs['sdpa']:>9.4f} {secs['eager'] / secs['sdpa']:>8.1f}x {diff:>11.2e}")


if __name__ == "__main__":
    main()
