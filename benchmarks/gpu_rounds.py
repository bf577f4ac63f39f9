"""Per-round time of the per-client loop against the vectorized executor, HyperFL and DP-FedAvg
against FedAvg, trial packing on one GPU, and CUDA repeatability (issue 28). flcore alone: no
Ray, MLflow or Optuna, so it runs on the device machine with a few carried wheels.

The workload is HyperFL's Table 1 FMNIST setup (sweeps/configs/*_fmnist.yaml: 600 records a
client, 5 local epochs, batch 50, SGD momentum 0.5), at 20 and 100 clients. A case runs
``warmup + rounds + 1`` rounds with evaluation only in the last; the figures are the median
``round_seconds`` of the ``rounds`` timed training rounds (the warm-up round, CUDA's kernel
selection and the first allocation, and the evaluated last round are left out).

Parts (``--parts``):
- ``rounds``: FedAvg, HyperFL, DP-FedAvg (its Table 1 config: target epsilon 4, clip 0.04) and
  the width family (``--cases pa3dfl fjord heterofl fedrolex``: Pa3dFL's Table 1 Hetero
  configs, every client every round),
  loop and vectorized, at 20 clients; the three vectorized and FedAvg's loop at 100; each
  with or without ``torch.use_deterministic_algorithms`` (``--deterministic``).
- ``packing``: 1, 4 and 8 processes at once on the device, each a short FedAvg run (20 clients,
  10 rounds, ``executor: auto``), with ``nvidia-smi`` sampled every 0.5 s: runs per hour and
  mean GPU utilisation.
- ``repeatable``: two identical 3-round runs per case, final weights compared bit for bit.
- ``cap``: a 100-client vectorized round under ``gpu_memory_fraction`` small enough that the
  whole round does not fit: the chunk the executor settles on.
- ``profile``: one training round of each case (vectorized, the fewest clients) under
  ``torch.profiler`` after a warm-up round: the round's wall time against the time the device
  spent in kernels (a round whose kernels fill a small part of its wall is bound by launches
  and host work, not by the device), the kernel launches, and the ops with the most device time.

    python benchmarks/gpu_rounds.py --device cuda --out gpu.json
    .venv/bin/python benchmarks/gpu_rounds.py --device cpu --parts rounds --cases fedavg \
        --clients 20 100 --rounds 2 --out cpu.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _machine import machine  # noqa: E402

from flcore.config import load_config  # noqa: E402
from flcore.experiment import build_data, build_engine  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "sweeps" / "configs"
ALGORITHM_CONFIG = {
    "fedavg": "fedavg_fmnist.yaml",
    "hyperfl": "hyperfl_fmnist.yaml",
    "dp_fedavg": "dp_fedavg_fmnist.yaml",
    # Pa3dFL's Table 1 FMNIST Hetero config (widths U[0.01, 1] in steps of 1/16: one stacked
    # group per width), every client in every round as in the other cases
    "pa3dfl": "pa3dfl/fmnist_hetero_pa3dfl.yaml",
    # FjORD at the same setting (Pa3dFL's Table 1 baseline): a width drawn a step, a teacher
    # pass beside it
    "fjord": "pa3dfl/fmnist_hetero_fjord.yaml",
    "heterofl": "pa3dfl/fmnist_hetero_heterofl.yaml",
    "fedrolex": "pa3dfl/fmnist_hetero_fedrolex.yaml",
}
#: the cases on Pa3dFL's Hetero configs (their clients split records for validation)
WIDTH_CASES = ("pa3dfl", "fjord", "heterofl", "fedrolex")
EXTRA = {a: {"client_fraction": 1.0, "early_stopping": None} for a in WIDTH_CASES}


def config(algorithm: str, clients: int, rounds: int, device: str, executor: str, **extra: Any):  # type: ignore[no-untyped-def]
    overrides = {
        "num_clients": clients,
        "rounds": rounds,
        "eval_every": 10_000,
        "device": device,
        "executor": executor,
        "workers": None if device == "cpu" else 1,
        "output_dir": "/tmp/fedsweep-gpu-bench",
        **extra,
    }
    return load_config(
        CONFIGS / ALGORITHM_CONFIG[algorithm],
        [f"{k}={json.dumps(v)}" for k, v in overrides.items()],
    )


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_rounds(cfg, warmup: int, data=None) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    data = data if data is not None else build_data(cfg)
    engine = build_engine(cfg, data=data)
    began = time.perf_counter()
    engine.run()
    _sync(cfg.device)
    wall = time.perf_counter() - began
    secs = [h.metrics["round_seconds"] for h in engine.history]
    timed = secs[warmup:-1]
    out = {
        "executor": engine.executor,
        "round_seconds_median": statistics.median(timed),
        "round_seconds": secs,
        "wall_seconds": wall,
        "accuracy_last_round": engine.history[-1].metrics.get("accuracy"),
    }
    if cfg.device.startswith("cuda"):
        out["max_memory_allocated_mb"] = torch.cuda.max_memory_allocated() / 2**20
        torch.cuda.reset_peak_memory_stats()
    return out


def part_rounds(args: argparse.Namespace) -> dict[str, Any]:
    # the quick cases first, the per-client loop at the most clients last: a stage cut short
    # by its time limit keeps what it measured (saved after every case)
    small, large = min(args.clients), max(args.clients)
    cases = [("fedavg", small, "loop"), ("fedavg", small, "vectorized")]
    cases += [("fedavg", c, "vectorized") for c in args.clients if c != small]
    for alg in ("dp_fedavg", "hyperfl", *WIDTH_CASES):
        cases += [(alg, small, ex) for ex in ("vectorized", "loop")]
    cases += [
        (a, c, "vectorized")
        for a in ("hyperfl", "dp_fedavg", *WIDTH_CASES)
        for c in args.clients
        if c != small
    ]
    cases += [("fedavg", c, "loop") for c in args.clients if c != small]
    cases = [c for c in cases if c[0] in args.cases and c[2] in args.executors]
    del large
    out: dict[str, Any] = {}
    datas: dict[int, Any] = {}
    for deterministic in args.deterministic:
        torch.use_deterministic_algorithms(bool(deterministic), warn_only=True)
        for alg, clients, ex in cases:
            rounds = args.warmup + args.rounds + 1
            cfg = config(alg, clients, rounds, args.device, ex, **EXTRA.get(alg, {}))
            # the Pa3dFL configs split clients' records (validation)
            data_key = (clients, alg in WIDTH_CASES)
            if data_key not in datas:
                datas[data_key] = build_data(cfg)
            key = f"{alg}-{clients}-{ex}" + ("-deterministic" if deterministic else "")
            print(f"[rounds] {key}", flush=True)
            try:
                out[key] = time_rounds(cfg, args.warmup, datas[data_key])
            except Exception as exc:  # a failed case is a result too; the others still run
                out[key] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"[rounds] {key}: {out[key].get('round_seconds_median', out[key])}", flush=True)
            _save(args, "rounds", {"cases": out})
    torch.use_deterministic_algorithms(False)
    ratios: dict[str, float] = {}

    def med(k: str) -> float | None:
        return out.get(k, {}).get("round_seconds_median")

    for clients in args.clients:
        for alg in ("fedavg", *WIDTH_CASES):
            a, b = med(f"{alg}-{clients}-loop"), med(f"{alg}-{clients}-vectorized")
            if a and b:
                ratios[f"{alg}_{clients}_loop_over_vectorized"] = a / b
    for base in ("loop", "vectorized"):
        fed = med(f"fedavg-{small}-{base}")
        for alg in ("hyperfl", "dp_fedavg"):
            for ex in ("loop", "vectorized"):
                v = med(f"{alg}-{small}-{ex}")
                if fed and v:
                    ratios[f"{alg}_{ex}_over_fedavg_{base}_{small}"] = v / fed
    return {"cases": out, "ratios": ratios}


def _save(args: argparse.Namespace, part: str, value: Any) -> None:
    """Write the results so far, ``part`` as it stands, to ``--out``."""
    if args.out:
        args.out.write_text(json.dumps(args.result | {part: value}, indent=1, default=str))


def _one_packed_run(device: str) -> None:
    cfg = config("fedavg", 20, 10, device, "auto")
    build_engine(cfg).run()


def _watch_gpu(stop: threading.Event, samples: list[tuple[float, float]]) -> None:
    """Sample nvidia-smi's utilisation (%) and memory used (MiB) every 0.5 s until ``stop``."""
    while not stop.is_set():
        try:
            line = subprocess.run(
                [
                    "nvidia-smi",
                    "--query-gpu=utilization.gpu,memory.used",
                    "--format=csv,noheader,nounits",
                ],
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout.split(",")
            samples.append((float(line[0]), float(line[1])))
        except (OSError, ValueError, IndexError, subprocess.SubprocessError):
            pass
        stop.wait(0.5)


def part_packing(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in args.packing:
        samples: list[tuple[float, float]] = []
        stop = threading.Event()

        watcher = threading.Thread(target=_watch_gpu, args=(stop, samples), daemon=True)
        watcher.start()
        began = time.perf_counter()
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--packed-run", "--device", args.device],
                env=os.environ | {"OMP_NUM_THREADS": "1"},
            )
            for _ in range(n)
        ]
        codes = [p.wait() for p in procs]
        wall = time.perf_counter() - began
        stop.set()
        watcher.join()
        util = [u for u, _ in samples]
        out[str(n)] = {
            "processes": n,
            "exit_codes": codes,
            "wall_seconds": wall,
            "runs_per_hour": 3600 * sum(c == 0 for c in codes) / wall,
            "gpu_util_mean": statistics.mean(util) if util else None,
            "gpu_util_max": max(util) if util else None,
            "gpu_memory_used_max_mb": max((m for _, m in samples), default=None),
            "samples": len(samples),
        }
        print(f"[packing] {n}: {out[str(n)]}", flush=True)
    return out


def part_repeatable(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for deterministic in args.deterministic:
        torch.use_deterministic_algorithms(bool(deterministic), warn_only=True)
        for alg, ex in (
            ("fedavg", "loop"),
            ("fedavg", "vectorized"),
            ("dp_fedavg", "vectorized"),
            ("hyperfl", "loop"),
            ("hyperfl", "vectorized"),
        ):
            if alg not in args.cases or ex not in args.executors:
                continue
            cfg = config(alg, 20, 3, args.device, ex)
            data = build_data(cfg)
            weights = []
            for _ in range(2):
                engine = build_engine(cfg, data=data)
                engine.run()
                weights.append(_cpu(engine.algorithm.state_dict()))
            same = all(_equal(weights[0][k], weights[1][k]) for k in weights[0])
            key = f"{alg}-{ex}" + ("-deterministic" if deterministic else "")
            out[key] = {"bitwise_equal": same}
            print(f"[repeatable] {key}: {same}", flush=True)
    torch.use_deterministic_algorithms(False)
    return out


def _cpu(state: Any) -> Any:
    """A copy of a (nested) server state on the CPU."""
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        return {k: _cpu(v) for k, v in state.items()}
    if isinstance(state, list | tuple):
        return type(state)(_cpu(v) for v in state)
    return state


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a.cpu(), b.cpu())
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def part_cap(args: argparse.Namespace) -> dict[str, Any]:
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logger = logging.getLogger("flcore.vectorized")
    logger.setLevel(logging.INFO)
    logger.addHandler(Keep())
    cfg = config("fedavg", 100, 2, args.device, "vectorized", gpu_memory_fraction=args.cap)
    try:
        result = time_rounds(cfg, 0)
    except Exception as exc:
        result = {"error": f"{type(exc).__name__}: {exc}"}
    torch.cuda.set_per_process_memory_fraction(1.0)
    return {"fraction": args.cap, "log": records, **result}


def part_profile(args: argparse.Namespace) -> dict[str, Any]:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = args.device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    clients = min(args.clients)
    out: dict[str, Any] = {}
    for alg in args.cases:
        cfg = config(alg, clients, 3, args.device, "vectorized", **EXTRA.get(alg, {}))
        rounds = build_engine(cfg, data=build_data(cfg)).iter_rounds()
        next(rounds)  # the warm-up: kernel selection, first allocations
        _sync(args.device)
        with profile(activities=activities) as prof:  # round 2: trained, not evaluated
            began = time.perf_counter()
            next(rounds)
            _sync(args.device)
            wall = time.perf_counter() - began
        rounds.close()
        events = prof.key_averages()
        # the device's rows alone (kernels, copies): an op's row carries its kernels' time too,
        # so a sum over every row would count each kernel twice
        kernel_us = (
            sum(e.self_device_time_total for e in events if e.device_type == DeviceType.CUDA)
            if cuda
            else None
        )
        launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel"))
        top = sorted(
            events,
            key=lambda e: e.self_device_time_total if cuda else e.self_cpu_time_total,
            reverse=True,
        )[:15]
        out[f"{alg}-{clients}"] = {
            "round_seconds": wall,
            "device_kernel_seconds": kernel_us / 1e6 if cuda else None,
            "kernel_launches": launches,
            "top_ops": [
                {
                    "op": e.key[:80],
                    "count": e.count,
                    "self_device_ms": e.self_device_time_total / 1e3 if cuda else None,
                    "self_cpu_ms": e.self_cpu_time_total / 1e3,
                }
                for e in top
            ],
        }
        print(
            f"[profile] {alg}-{clients}: wall {wall:.3f} s, kernels "
            f"{out[f'{alg}-{clients}']['device_kernel_seconds']}, launches {launches}",
            flush=True,
        )
        _save(args, "profile", out)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--parts", nargs="+", default=["rounds", "repeatable", "cap", "packing"])
    p.add_argument("--cases", nargs="+", default=["fedavg", "hyperfl", "dp_fedavg"])
    p.add_argument("--executors", nargs="+", default=["loop", "vectorized"])
    p.add_argument("--clients", nargs="+", type=int, default=[20, 100])
    p.add_argument("--rounds", type=int, default=3, help="timed rounds a case")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument(
        "--deterministic",
        nargs="+",
        type=int,
        default=[0, 1],
        help="0, 1 or both: with torch.use_deterministic_algorithms off / on",
    )
    p.add_argument("--packing", nargs="+", type=int, default=[1, 4, 8])
    p.add_argument("--cap", type=float, default=0.01, help="gpu_memory_fraction of part cap")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--packed-run", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.packed_run:
        _one_packed_run(args.device)
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
    result: dict[str, Any] = {"machine": machine(), "device": args.device, "args": dict(vars(args))}
    args.result = result
    if args.device.startswith("cuda"):
        result["gpu"] = torch.cuda.get_device_name()
    parts = {
        "rounds": part_rounds,
        "repeatable": part_repeatable,
        "cap": part_cap,
        "packing": part_packing,
        "profile": part_profile,
    }
    for name in args.parts:
        began = time.perf_counter()
        result[name] = parts[name](args)
        result[f"{name}_seconds"] = time.perf_counter() - began
        if args.out:  # what is done so far survives a time limit
            args.out.write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
