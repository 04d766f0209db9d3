"""Wall time of one compiled decode call on 1 and 2 threads, each call right after a torch matmul as in a model.

    python benchmarks/decode_threads.py [TOKENS=64,128,256,512,1024,4096]
Where the C kernels run on torch's OpenMP threads (cpu_kernels.threading() == "openmp"), torch's workers are still
spinning from the matmul when the decode starts, so a second thread pays from a few hundred token-heads on: this
sets SP_PARALLEL_WORK_OPENMP in cpu_kernels.c. Below that threshold the C code runs one thread whatever it is
given, so the figures there show one thread twice. smollm2's decode shape (9 query / 3 KV heads, head dim 64,
batch 1, a tail of 17); a [1, 576] x [576, 1536] matmul before each call, its own time subtracted. Best of 5 rounds
of 200 calls.
"""
import sys
import time
from pathlib import Path

import torch
# the test helpers' `runtime` folder is a namespace package, which this folder's runtime.py would shadow
sys.path[0] = str(Path(__file__).resolve().parents[1] / "tests")
from runtime.kernels.packed import store_reads
from sensprof.runtime.kernels import cpu_kernels

lengths = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "64,128,256,512,1024,4096").split(",")]
x, w = torch.randn(1, 576), torch.randn(576, 1536)


def best_us(fn, rounds=5, calls=200):
    for _ in range(20):
        fn()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return min(times)


print(f"C decode after a torch matmul, threads from {cpu_kernels.threading()}; microseconds per call (matmul "
      "subtracted)")
print(f"{'tokens':>7} {'layout':22s} {'1 thread':>9} {'2 threads':>10}")
for t in lengths:
    for k_name, v_name in (("int4_c32", "int4_t32"), ("int4_per_token_head", "int4_per_token_head")):
        args, kw = store_reads(k_name, v_name, b=1, hq=9, hkv=3, t=t + 40, tail=17, d=64)
        args["k"], args["v"] = args["k"].narrow(0, t), args["v"].narrow(0, t)
        row = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            matmul = best_us(lambda: x @ w)
            row.append(best_us(lambda: (x @ w, cpu_kernels.decode_attention(**args, **kw))) - matmul)
        print(f"{t:>7} {k_name:22s} {row[0]:9.1f} {row[1]:10.1f}")
