"""`sensprof profile --ray`: the profile fanned out over a Ray cluster.

One worker (a Ray actor on a GPU, or on a CPU slot) loads the model once and runs the baseline pass; the driver
hands out shards, one layer's cells of one tensor, longest first, to whichever worker is free. Every worker
computes exactly what a local run does (sensprof.profile), and the driver writes each layer's part once both of
its tensors are back (sensprof.profile.PartsStore), so a Ray run resumes and merges as a local one. A worker
that dies mid-shard is dropped and its shard goes to another.
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import time

from ..errors import SensprofError
from ..reaper import fate_share

EXIT_HOOK = "SENSPROF_TEST_WORKER_EXIT"  # tests: the first worker to remove this file exits at its next shard
CONNECT_TIMEOUT_S = 5.0
MAX_TRIES = 3  # a shard that has killed this many workers is not handed out again


def require_ray():
    try:
        import ray
    except ImportError:
        raise SensprofError("--ray needs Ray, which is not installed; pip install 'sensprof[ray]'") from None
    return ray


def check_reachable(address: str) -> None:
    """Refuse an address nothing answers at within seconds (Ray itself retries for minutes)."""
    if address == "auto":
        return  # Ray finds a cluster started on this machine, or says at once that there is none
    hostport = address.removeprefix("ray://")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise SensprofError(f"--ray {address!r} is not a Ray address; pass host:6379, ray://host:10001 or auto "
                            "(or --ray alone for a cluster on this machine)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise SensprofError(f"cannot reach the Ray cluster at {address!r} ({e.strerror or e}); start one with "
                            "`ray start --head` there, or check the address and port") from None


def connect(address) -> str | None:
    """Join the cluster at `address`, or with True start one on this machine; a Ray this process already
    initialized is used as it is. Returns None when this call did not initialize Ray, else the Ray session
    folder it made ('' when it joined a cluster): pass it to disconnect()."""
    import logging
    import shutil
    import tempfile

    ray = require_ray()
    if address is not True:
        check_reachable(address)
    if ray.is_initialized():
        return None
    # A cluster of our own keeps its sockets, logs and spill files in a temporary folder of its own, removed when it
    # stops (or by the reaper after a kill -9), instead of leaving a session in /tmp/ray per run.
    temp_dir = tempfile.mkdtemp(prefix="sensprof-ray-", dir=os.environ.get("RAY_TMPDIR")) if address is True else ""
    try:
        with contextlib.nullcontext() if address is True else _native_stderr_to_void():
            ray.init(address="local" if address is True else address, include_dashboard=False if address is True
                     else None, log_to_driver=False, logging_level=logging.ERROR,
                     **({"_temp_dir": temp_dir} if temp_dir else {}))
    except (ConnectionError, ValueError, RuntimeError) as e:
        if temp_dir:
            shutil.rmtree(temp_dir, ignore_errors=True)
        why = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        if address is True:
            raise SensprofError(f"cannot start a Ray cluster on this machine ({why}); check `ray status`, or "
                                "profile without --ray") from None
        raise SensprofError(f"cannot join the Ray cluster at {address!r} ({why}); check the address, and "
                            "`ray status` on that cluster") from None
    if address is True:
        _fate_share_with_ray(ray, temp_dir)
    return temp_dir


def disconnect(ray, temp_dir: str | None) -> None:
    """Undo connect(): shut down a Ray it initialized and remove the session folder of a cluster it started."""
    import shutil

    if temp_dir is None:
        return
    ray.shutdown()
    if temp_dir:
        shutil.rmtree(temp_dir, ignore_errors=True)


def _fate_share_with_ray(ray, temp_dir: str) -> None:
    """The local cluster `ray.init` started: its GCS, raylet, log monitor and what they spawn die with the
    driver, so a kill -9 leaves no Ray running (Ray's own fate sharing misses the agents the raylet starts)."""
    try:
        node = ray._private.worker._global_node
        pids = [info.process.pid for infos in node.all_processes.values() for info in infos
                if getattr(info, "process", None) is not None]
    except AttributeError:  # another Ray version's internals: rely on its own fate sharing
        return
    fate_share(pids, remove=temp_dir)


@contextlib.contextmanager
def _native_stderr_to_void():
    """Ray's C++ client writes every retry of a failing connection straight to file descriptor 2; the failure
    itself comes back as an exception, said in one line."""
    import sys
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def worker_resources(ray, device: str, workers: int | None, gpus_per_worker: int | None) -> tuple[int, dict, str]:
    """(workers, each one's Ray resources, its --device): one per GPU of the cluster (or per `gpus_per_worker`
    GPUs, for --device-map auto), else one per CPU slot, each with its share of the CPUs as torch threads."""
    have = ray.cluster_resources()
    gpus, cpus = int(have.get("GPU", 0)), int(have.get("CPU", 0))
    if workers is not None and workers < 1:
        raise SensprofError(f"--ray-workers {workers} is too few; use at least 1")
    if gpus_per_worker is not None and gpus_per_worker < 1:
        raise SensprofError(f"--ray-gpus-per-worker {gpus_per_worker} is too few; use at least 1")
    if gpus and device != "cpu":
        if device not in ("auto", "cuda"):
            raise SensprofError(f"--device {device} picks a GPU, but with --ray each worker gets its own: pass "
                                "--device auto (or cpu)")
        g = gpus_per_worker or 1
        n = workers or gpus // g
        if n < 1 or n * g > gpus:
            raise SensprofError(f"{max(n, 1)} Ray workers of {g} GPUs need {max(n, 1) * g} GPUs; the cluster has "
                                f"{gpus}: pass fewer --ray-workers or --ray-gpus-per-worker")
        return n, {"num_gpus": g, "num_cpus": 1}, "cuda"
    if gpus_per_worker is not None:
        raise SensprofError("--ray-gpus-per-worker needs GPUs, and the Ray cluster has none (or --device is cpu)")
    if device.startswith("cuda"):
        raise SensprofError(f"--device {device}: the Ray cluster has no GPU; pass --device cpu or auto")
    n = workers or cpus
    if n < 1 or n > cpus:
        raise SensprofError(f"--ray-workers {n} needs {n} CPU slots; the Ray cluster has {cpus}: pass fewer")
    return n, {"num_cpus": max(1, cpus // n)}, "cpu"


def _guarded(fn):
    """A worker's answer: its result, or {"error": one line} for bad input and out-of-memory, so the driver
    reports it once instead of Ray's traceback per worker."""
    import torch

    try:
        with torch.inference_mode():
            return fn()
    except SensprofError as e:
        return {"error": str(e)}
    except (MemoryError, torch.OutOfMemoryError):
        return {"error": "out of memory on a Ray worker; use fewer --windows, a shorter --seq-len, "
                         "--variants-per-pass 1 or --ray-gpus-per-worker with --device-map auto"}


class Worker:
    """The body of one Ray actor: the model, loaded once, and the baseline of the length being profiled."""

    def __init__(self, options: dict, threads: int | None):
        self.options, self.threads, self.loaded, self.cells = options, threads, None, None
        self.stack = contextlib.ExitStack()

    def load(self) -> dict:
        def run():
            import torch
            from transformers.utils import logging as hf_logging

            from ..models import load_model, model_shape

            if self.threads:
                torch.set_num_threads(self.threads)
            hf_logging.disable_progress_bar()
            with contextlib.redirect_stderr(io.StringIO()):
                o = self.options
                self.loaded = load_model(o["model"], o["device"], o["dtype"], o["device_map"], o["trust_remote_code"])
            return {**model_shape(self.loaded.model), "node": _node()}
        return _guarded(run)

    def prepare(self, menu, text: str, text_name: str, seq_len: int, windows: int, seed: int, layers: list[int],
                kl: str, replay: bool, screen: bool, variants_per_pass: int, model_id: str,
                reads: str = "streaming") -> dict:
        """The baseline pass for one length: what the driver needs to write the profile and hand out shards."""
        def run():
            from ..data import text_windows
            from .hooks import attention_taps
            from .profile import baseline_cells, check_run, profile_settings, run_meta

            model = self.loaded.model
            self.stack.close()
            self.cells = None
            ids, name, digest, slots = text_windows(self.loaded.tokenizer, text, text_name, seq_len, windows, seed)
            ids = ids.to(model.get_input_embeddings().weight.device)
            check_run(model, layers, variants_per_pass, kl, screen, replay)
            settings = profile_settings(model, ids, menu, text_digest=digest, seed=seed,
                                        variants_per_pass=variants_per_pass, kl=kl, screen=screen, reads=reads)
            session = self.stack.enter_context(attention_taps(model))
            self.cells = baseline_cells(model, session, ids, menu, layers, kl=kl, seed=seed,
                                        variants_per_pass=variants_per_pass, replay=replay, screen=screen, reads=reads)
            return {"settings": settings, "slots": slots, "stats_rows": self.cells.stats_rows,
                    "calibration": self.cells.calibration, "node": _node(),
                    "meta": run_meta(self.cells, settings, model_id=model_id, text_name=name, seed=seed, kl=kl),
                    "shards": {i: [(t, len(s)) for t, s in self.cells.shards(i) if s] for i in layers}}
        return _guarded(run)

    def shard(self, layer: int, tensor: str) -> dict:
        def run():
            from .profile import peak_memory, profile_shard

            _maybe_exit()
            part = profile_shard(self.cells, layer, (tensor,))
            return {**part, "cost_s": self.cells.cost_s(), "memory": peak_memory()}
        return _guarded(run)


def _node() -> str:
    import ray

    return ray.util.get_node_ip_address()


def _maybe_exit() -> None:
    """The test hook of a worker killed mid-run: the one worker that removes the file named by EXIT_HOOK dies."""
    flag = os.environ.get(EXIT_HOOK)
    if flag:
        try:
            os.unlink(flag)
        except FileNotFoundError:
            return
        os._exit(1)


def _lost_errors(ray) -> tuple:
    ex = ray.exceptions
    return ex.RayActorError, ex.WorkerCrashedError, ex.NodeDiedError, ex.OutOfMemoryError


def shard_order(shards: dict[int, list], n_layers: int) -> list[tuple[int, str, int]]:
    """(layer, tensor, cells) longest first: a cell replays the layers from its own to the last, plus the head."""
    flat = [(layer, tensor, n) for layer, by_tensor in shards.items() for tensor, n in by_tensor]
    return sorted(flat, key=lambda s: (-s[2] * (n_layers - s[0] + 1), s[0], s[1]))


class RayProfiler:
    """The workers of one `sensprof profile --ray`: started and loaded on entry, each length profiled by
    profile(), the actors ended (and a Ray this started shut down) on exit."""

    def __init__(self, address, model_options: dict, workers: int | None = None,
                 gpus_per_worker: int | None = None, log=None):
        self.address, self.options, self.log = address, model_options, log or (lambda msg: None)
        self.n_workers, self.gpus_per_worker = workers, gpus_per_worker
        self.ray = require_ray()
        self.started, self.workers, self.lost = None, [], []

    def __enter__(self):
        self.started = connect(self.address)
        try:
            self._start_workers()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        for w in self.workers:
            with contextlib.suppress(Exception):
                self.ray.kill(w)
        self.workers = []
        disconnect(self.ray, self.started)
        self.started = None
        return False

    def _start_workers(self) -> None:
        ray = self.ray
        n, resources, device = worker_resources(ray, self.options["device"], self.n_workers, self.gpus_per_worker)
        options = {**self.options, "device": device}
        threads = resources["num_cpus"] if device == "cpu" else None
        cls = ray.remote(max_restarts=0, **resources)(Worker)
        self.workers = [cls.remote(options, threads) for _ in range(n)]
        self.started_workers = n
        self.log(f"{n} Ray workers ({resources.get('num_gpus', 0)} GPU, {resources['num_cpus']} CPU each) are "
                 f"loading {options['model']}")
        self.shape = self._ask_all("load")[0]

    def _ask_all(self, method: str, *args) -> list[dict]:
        """One call on every worker: the answers, in worker order; a bad answer is raised once (with how many
        workers gave it), and a worker that died is dropped."""
        refs = [(w, getattr(w, method).remote(*args)) for w in self.workers]
        answers, errors = [], []
        for w, ref in refs:
            try:
                answer = self.ray.get(ref)
            except _lost_errors(self.ray) as e:
                self._drop(w, e)
                continue
            (errors if "error" in answer else answers).append(answer)
        if errors:
            raise SensprofError(f"{errors[0]['error']} ({len(errors)} of {len(refs)} Ray workers)")
        if not answers:
            raise SensprofError(f"every Ray worker died ({self.lost[-1]}); check the nodes' memory and `ray status`")
        return answers

    def _drop(self, worker, error) -> None:
        self.workers.remove(worker)
        self.lost.append(str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__)

    def profile(self, menu, text: str, text_name: str, seq_len: int, windows: int, seed: int, layers: list[int],
                out_dir: str | None, model_id: str, variants_per_pass: int, replay: bool, kl: str, screen: bool,
                progress: bool, extra_meta: dict, reads: str = "streaming"):
        """One length on the cluster: the same Profile (and directory) a local run_profile would give."""
        from .profile import PartsStore, join_shards

        t0 = time.time()
        text_ref = self.ray.put(text)
        answers = self._ask_all("prepare", menu, text_ref, text_name, seq_len, windows, seed, layers, kl, replay,
                                screen, variants_per_pass, model_id, reads)
        first = answers[0]
        for other in answers[1:]:
            if other["settings"] != first["settings"]:
                raise SensprofError(f"Ray workers on {first['node']} and {other['node']} loaded different models "
                                    "(their fingerprints or dtypes differ); give every node the same weights and "
                                    "package versions")
        store = PartsStore(out_dir, first["settings"])
        if store.finished(layers):
            return store.profile()
        todo = store.todo(layers)
        meta = {**first["meta"], **extra_meta, "window_slots": first["slots"]}
        store.start(meta, first["stats_rows"], first["calibration"])
        costs, memory = {}, {}

        def save_meta():
            cost = {}
            for c in costs.values():
                for k, v in c.items():
                    cost[k] = round(cost.get(k, 0.0) + v, 3)
            meta["ray"] = {"workers": self.started_workers, "workers_lost": len(self.lost)}
            store.save_meta(time.time() - t0, cost, memory)

        save_meta()
        shards = {i: first["shards"][i] for i in todo}
        pending = {i: {} for i in todo}
        for i in todo:
            if not shards[i]:  # no scheme applies to this layer: an empty part, as a local run writes
                store.add(i, join_shards(i, []))

        def done(worker, shard, answer):
            layer, tensor, _ = shard
            costs[id(worker)] = answer.pop("cost_s")
            for k, v in answer.pop("memory").items():
                memory[k] = max(memory.get(k, 0.0), v)
            pending[layer][tensor] = answer
            if len(pending[layer]) == len(shards[layer]):
                store.add(layer, join_shards(layer, [pending[layer].pop(t) for t, _ in shards[layer]]))
                save_meta()

        self._run(shard_order(shards, len(first["meta"]["layers"])), done, progress)
        save_meta()
        return store.profile()

    def _run(self, queue: list, done, progress: bool) -> None:
        """Hand each free worker the longest shard left; a shard whose worker died goes back to the front."""
        from tqdm.auto import tqdm

        ray = self.ray
        idle, inflight, tries = list(self.workers), {}, {}
        bar = tqdm(total=sum(s[2] for s in queue), unit="cell", desc="profiling", disable=not progress,
                   dynamic_ncols=True)
        try:
            while queue or inflight:
                while idle and queue:
                    worker, shard = idle.pop(0), queue.pop(0)
                    inflight[worker.shard.remote(shard[0], shard[1])] = (worker, shard)
                bar.set_postfix_str(f"{len(self.workers)} workers")
                (ref,), _ = ray.wait(list(inflight), num_returns=1)
                worker, shard = inflight.pop(ref)
                try:
                    answer = ray.get(ref)
                except _lost_errors(ray) as e:
                    self._drop(worker, e)
                    tries[shard] = tries.get(shard, 0) + 1
                    if tries[shard] >= MAX_TRIES:
                        raise SensprofError(f"layer {shard[0]} {shard[1]} lost {MAX_TRIES} Ray workers (last: "
                                            f"{self.lost[-1]}); check the nodes' memory and `ray status`") from None
                    if not self.workers:
                        raise SensprofError(f"every Ray worker died ({self.lost[-1]}); check the nodes' memory and "
                                            "`ray status`, then run the same command to resume") from None
                    queue.insert(0, shard)
                    continue
                if "error" in answer:
                    raise SensprofError(answer["error"])
                idle.append(worker)
                done(worker, shard, answer)
                bar.update(shard[2])
        finally:
            bar.close()
