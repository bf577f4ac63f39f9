"""What one client's training costs: parameters, FLOPs of one batch, peak memory of one step.

- FLOPs: ``torch.utils.flop_counter.FlopCounterMode`` over the forward and backward pass of one
  training batch (cross-entropy); the optimizer step is not counted (it is O(parameters)).
- Peak memory of one training step (zero_grad, forward, backward, optimizer step), measured
  after a warm-up step so the optimizer's buffers exist:
  - on CUDA, ``torch.cuda.max_memory_allocated`` minus what was allocated before the step
    (``memory_source: cuda_max_memory_allocated``);
  - on the CPU, torch's profiler with ``profile_memory=True``: the running sum of every op's
    own allocations and frees, in time order, at its highest (``memory_source:
    cpu_profiler``). Both count memory the step allocates on top of what it starts with (the
    weights, optimizer buffers and the batch are held before it starts).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["training_cost", "parameter_count"]


def parameter_count(model: nn.Module) -> int:
    """Number of trainable and frozen parameters (the model's size)."""
    return int(sum(p.numel() for p in model.parameters()))


def _step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    opt.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    opt.step()


@contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """File descriptor 2 to /dev/null while open: torch's profiler (Kineto) writes lines such
    as ``USDT ... profiler_start`` and ``ERROR ... gpuGetDeviceCount failed`` from C++ on a
    machine without a GPU at every start, noise in a run's output that says nothing about the
    measurement. Python's exceptions are untouched (raised, then printed after this closes)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _cpu_peak(
    model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
) -> int:
    from torch.profiler import ProfilerActivity, profile

    with (
        _native_stderr_silenced(),
        profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof,
    ):
        _step(model, opt, x, y)
    deltas = sorted(
        (e.time_range.start, e.self_cpu_memory_usage)
        for e in prof.events()
        if e.self_cpu_memory_usage
    )
    current = peak = 0
    for _, delta in deltas:
        current += delta
        peak = max(peak, current)
    return int(peak)


def training_cost(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
    """Cost of training ``model`` on the batch ``(x, y)`` (normalized inputs, on the model's
    device). The model's weights are changed by two SGD steps: pass a copy.

    Returns:
        ``params``, ``flops`` (forward + backward of one batch), ``peak_memory_bytes`` and
        ``memory_source`` (see the module docstring).
    """
    from torch.utils.flop_counter import FlopCounterMode

    model.train()
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(x), y).backward()
    flops = int(counter.get_total_flops())
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.5)
    _step(model, opt, x, y)  # warm-up: momentum buffers exist before the measured step
    if x.device.type == "cuda":
        torch.cuda.synchronize(x.device)
        base = torch.cuda.memory_allocated(x.device)
        torch.cuda.reset_peak_memory_stats(x.device)
        _step(model, opt, x, y)
        torch.cuda.synchronize(x.device)
        peak = int(torch.cuda.max_memory_allocated(x.device) - base)
        source = "cuda_max_memory_allocated"
    else:
        peak = _cpu_peak(model, opt, x, y)
        source = "cpu_profiler"
    return {
        "params": parameter_count(model),
        "flops": flops,
        "peak_memory_bytes": peak,
        "memory_source": source,
    }
