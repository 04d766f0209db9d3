"""Profile scaling on Ray: the same profile with 1 and with 2 workers on one local Ray cluster, and (for the
Ray overhead) the same profile without Ray.

Each Ray run starts its workers, which load the model and run the baseline pass, then share the (layer, tensor)
shards. Prints per run the wall time of the whole call (worker start and model loading included) and of the
profile proper (meta.json's wall_time_s: baseline pass and cells), and the 1-vs-2-worker ratios. The cluster
gets --cpus CPUs (default: all); a CPU worker runs torch on its share (1 worker: all of them; 2: half each).
The tables of every run are checked equal to each other.
    python benchmarks/profile_scale.py [--model smollm2-135m] [--layers 0-3] [--k-schemes ...] [--v-schemes ...] [--seq-len 256] [--windows 2]
                                       [--workers 1,2] [--cpus N] [--no-local]
"""

import argparse
import os
import platform
import tempfile
import time


def run(args, out, **ray):
    from sensprof import api

    t0 = time.perf_counter()
    prof = api.profile(args.model, k_schemes=args.k_schemes, v_schemes=args.v_schemes, layers=args.layers,
                       seq_len=args.seq_len, windows=args.windows, out_dir=out, device="cpu", progress=False,
                       quiet_loading=True, **ray)
    return time.perf_counter() - t0, prof


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--layers", default="0-3")
    ap.add_argument("--k-schemes", default="int2_c32,int4_c32,int8_c32,fp8_e4m3_cal")
    ap.add_argument("--v-schemes", default="int2_t32,int4_t32,int8_t32,fp8_e4m3")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--cpus", type=int, default=None, help="CPUs of the local Ray cluster (default: all)")
    ap.add_argument("--no-local", action="store_true", help="skip the run without Ray")
    args = ap.parse_args()

    import ray
    import torch

    # Ray runs its workers at niceness 15; at 0, like the run without Ray, they compete with other processes alike
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
             _system_config={"worker_niceness": 0})
    cpus = int(ray.cluster_resources()["CPU"])
    print(f"# {args.model}, layers {args.layers}, {args.windows} x {args.seq_len} tokens; {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, Ray cluster of {cpus} CPUs; load average before: {os.getloadavg()[0]:.2f}")
    results, tables = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        if not args.no_local:
            torch.set_num_threads(cpus)
            wall, prof = run(args, os.path.join(tmp, "local"))
            results["local"] = (wall, prof.meta["wall_time_s"], len(prof.table))
            tables.append(prof.table)
            print(f"# local: {wall:.1f} s", flush=True)
        for n in [int(x) for x in args.workers.split(",")]:
            wall, prof = run(args, os.path.join(tmp, f"ray{n}"), ray=True, ray_workers=n)
            name = f"ray, {n} worker{'s' * (n > 1)}"
            results[name] = (wall, prof.meta["wall_time_s"], len(prof.table))
            tables.append(prof.table)
            print(f"# {name}: {wall:.1f} s", flush=True)
    ray.shutdown()
    same = all(t.equals(tables[0]) for t in tables[1:])
    print(f"{'run':<16} {'cells':>6} {'wall s':>8} {'profile s':>10}")
    for name, (wall, prof_s, cells) in results.items():
        print(f"{name:<16} {cells:>6} {wall:>8.1f} {prof_s:>10.1f}")
    one, two = results.get("ray, 1 worker"), results.get("ray, 2 workers")
    if one and two:
        print(f"1 vs 2 workers: {one[0] / two[0]:.2f}x faster wall, {one[1] / two[1]:.2f}x faster profile")
    print(f"tables equal across runs: {same} (load average after: {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
