"""CPU time of the compiled decode kernel per layout: the KIVI loops vs the generic PackedRead path (every other layout).

    python benchmarks/decode_layouts.py [TOKENS=4096] [THREADS=1]
Reads are built from real TensorStores (tests/runtime/kernels/packed.py); CPU time, so other jobs on the machine
move the figures less than wall time would. Median of 7 interleaved rounds of 30 calls.
"""
import statistics
import sys
import time
from pathlib import Path

import torch
# the test helpers' `runtime` folder is a namespace package, which this folder's runtime.py would shadow
sys.path[0] = str(Path(__file__).resolve().parents[1] / "tests")
from dataclasses import replace
from runtime.kernels.packed import store_reads, rope_tables
from sensprof.runtime.kernels import cpu_kernels
torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
T = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
cases = {}
for label, kn, vn, how in [("KIVI path  int4_c32 / int4_t32", "int4_c32", "int4_t32", None),
                           ("generic    int4_c32 / int4_t32", "int4_c32", "int4_t32", "force"),
                           ("generic    int4_c32 + RoPE / int4_t32", "int4_c32", "int4_t32", "rope"),
                           ("generic    int4_t32 / int4_t32", "int4_t32", "int4_t32", None),
                           ("generic    q4_0 / q4_0", "q4_0", "q4_0", None),
                           ("generic    q4_1 / q4_1", "q4_1", "q4_1", None),
                           ("generic    fp8_e4m3 / fp8_e4m3", "fp8_e4m3", "fp8_e4m3", None),
                           ("generic    q8_0 / q8_0", "q8_0", "q8_0", None),
                           ("generic    int4_per_token_head (vLLM)", "int4_per_token_head", "int4_per_token_head", None)]:
    args, kw = store_reads(kn, vn, b=1, hq=9, hkv=3, t=T + 40, tail=17, d=64)
    args["k"], args["v"] = args["k"].narrow(0, T), args["v"].narrow(0, T)
    if how == "force":  # fp32 zero-points: not the KIVI layout, the same values
        args["k"] = replace(args["k"], zero=args["k"].zero.float())
    if how == "rope":
        args["k"] = replace(args["k"], zero=args["k"].zero.float(), rope=rope_tables(1, T, 64))
    cases[label] = (args, kw)
times = {k: [] for k in cases}
for rnd in range(7):  # interleaved rounds, median
    for label, (args, kw) in cases.items():
        for _ in range(3): cpu_kernels.decode_attention(**args, **kw)
        t0 = time.process_time()
        for _ in range(30): cpu_kernels.decode_attention(**args, **kw)
        times[label].append((time.process_time() - t0) / 30 * 1e3)
base = statistics.median(times[next(iter(times))])
print(f"decode attention, {T} packed tokens + 17 tail, 9 query / 3 KV heads, head dim 64, batch 1, "
      f"{torch.get_num_threads()} thread(s) (median of 7 x 30 calls, CPU time)")
for label, ts in times.items():
    m = statistics.median(ts)
    print(f"  {label:38s} {m:7.3f} ms  {m / base:4.2f}x")
