"""The vectorized executor: a round's clients trained as one batched computation.

On a GPU the per-client loop leaves the device idle: a 116k-parameter CNN on a batch of 50 is a
sliver of an H100's work, and each client waits for the last. Here the trainable parameters of
a chunk of K clients are stacked on a leading client dimension and every local step of every
client runs as one ``torch.func.vmap`` over ``functional_call``; the SGD state (momentum
buffers) is stacked the same way. What it runs is :class:`~flcore.algorithms.base.VectorJob`,
the local work of the algorithms that declare ``vectorized`` (FedAvg, FedProx, Local-only,
Ditto, DP-FedAvg with record-level or client-level DP, HyperFL, pFedHN and pFedHN-PC, whose
generated models share one architecture, and Pa3dFL, FjORD, HeteroFL, FedRolex and Local-only
under a capacity setting, padded to full width): E epochs
of SGD with momentum and weight decay on the cross-entropy of the algorithm's ``vector_model``, from
a start point, on all its parameters or a named part, with a proximal gradient (FedProx's,
Ditto's personal objective), per-group gradient clipping and DP-SGD as options, and further
trainings on the same client generator where the algorithm has them (Ditto: the global model,
then the personal one, which is judged; HyperFL: the head on the generated extractor, then the
hypernetwork and the embedding from where the first left off). Other algorithms keep the loop
(``executor: auto``) or are refused (``executor: vectorized``) with the reason, before any
round.

All of a round's clients train one network: clients of smaller architectures are embedded in
it by the algorithm (Pa3dFL: each width's tensors zero-padded to the full width, whose extra
channels then compute zeros and get zero gradients). An algorithm whose objective is not the
cross-entropy of logits (``Algorithm.vector_objective``: Pa3dFL's two heads and Eq. 32) gives a
network whose forward pass is the masked batch loss; it evaluates its clients itself in
``vector_result``, on the data the executor hands it on evaluation rounds (the evaluation's
time counts in the client's seconds). A job may draw one number a step from the client's
generator where the loop's loss function draws it (``VectorJob.step_choices``: FjORD's width),
handed to that objective beside the batch. Parameters may step at a multiple of the learning rate
(``VectorJob.lr_scale``, the loop's parameter groups): the fused step runs once per rate.

The same arithmetic as the loop, step for step:
- Batches are each client's own: its generator (``client_generator``) draws the epoch orders
  (``randperm``) or DP-SGD's Poisson masks exactly as the loop draws them, on the CPU.
- Clients hold different record counts, so they take ``E * ceil(n_k / B)`` steps each and
  batches of different sizes: batches are padded to the widest of the step with masked rows
  (their loss weight and, under DP-SGD, their clipped gradient are zero), and a client whose
  steps are done is held where it is (parameters and momentum unchanged) while the others go on.
- DP-SGD is a vmap within the vmap: per-sample gradients per client, clipped to C over all
  trainable parameters, summed, noised with N(0, sigma^2 C^2) for every client at every step
  (an empty batch too), divided by the expected batch size q n_k.
- The SGD step is torch's: ``g + wd w``, ``buf = m buf + g`` (buf = g at the first step),
  ``w - lr buf``; FedProx adds ``mu (w - w^t)`` to the gradient first, as its step hook does.
  A step where every client is active, at one learning rate and without a proximal term, runs
  torch's fused SGD kernel (the loop optimizer's) over the stacked tensors in place; others
  a masked in-place step. Per-group clipping (``VectorJob.clip``) scales the gradients first.

On the CPU every random number comes from each client's generator as in the loop, DP noise
included, so the results equal the loop's up to floating-point summation order (the test suite
checks 1e-9 in float64 after two rounds). On CUDA the DP noise is drawn on the device, from one
generator per chunk seeded by (seed, round, the chunk's first client): the same distribution,
another stream, repeatable for a given chunk size. Generating it on the CPU, client by client,
would cost more than the training. The Poisson batches of all steps are drawn at the start of
a training (the same numbers, from each client's generator) and moved to the device in one copy:
a copy a step waited for the GPU at every step.

A broadcast every client receives (the same tensor) is copied to the device once and repeated
there: HyperFL's 15M-parameter hypernetwork is not sent a hundred times.

Results stay on the device: a client's weights are copied out of the stacked tensors there,
its upload is aggregated there (``WeightedMean`` sums on the device of what it is given), and
the engine moves the state a client keeps to the CPU. Copying each upload to the CPU and
summing there cost HyperFL's 20-client round on an H100 more than its training.

Evaluation (a client's ``accuracy_before``, ``accuracy``, ``test_loss`` and validation
accuracy) runs the same way, over padded test sets. Each client's ``client_seconds`` is its
chunk's time divided by the chunk's clients, so the round's sum is still the compute time.

Chunks: ``executor_chunk`` clients at a time (default: the whole round). On CUDA a chunk that
runs out of memory is retried at half the size, and the smaller size is kept for the rest of
the run; the chunk size is logged (logger ``flcore.vectorized``) when it is first set and when
it shrinks.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call, grad_and_value, vmap

from flcore.algorithms.base import Algorithm, ClientResult, ClientTask
from flcore.data import FederatedData, normalize
from flcore.errors import ConfigError
from flcore.privacy.dpsgd import DPSGD

__all__ = ["VectorizedExecutor", "EVAL_ROWS"]

log = logging.getLogger(__name__)

#: rows (clients x records) one evaluation forward pass takes at most
EVAL_ROWS = 5_000


class _Records:
    """A split resident on the device: uint8 images and labels, gathered by global index."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, info: Any, device: Any):
        self.images, self.labels, self.info = images.to(device), labels.to(device), info

    def batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return normalize(self.images[idx], self.info), self.labels[idx]


def _padded(rows: list[torch.Tensor], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Index rows of different lengths -> ``[K, width]`` indices (padding: 0) and a mask."""
    idx = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for k, row in enumerate(rows):
        idx[k, : len(row)] = row
        mask[k, : len(row)] = True
    return idx, mask


def _per_client(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A ``[K]`` vector shaped to broadcast against a stacked ``[K, ...]`` tensor."""
    return v.view(-1, *([1] * (like.dim() - 1)))


class VectorizedExecutor:
    """Trains each round's clients as stacked, vmapped computations (module docstring).

    Args:
        factory: builds the executor's own copy of the algorithm.
        fed: the federated dataset; its splits are moved to the algorithm's device once.
        chunk: clients per batched computation (None: a whole round).
    """

    def __init__(self, factory: Any, fed: FederatedData, *, chunk: int | None = None) -> None:
        self._alg: Algorithm = factory()
        reason = self._alg.vector_unsupported()
        if reason is not None:
            raise ConfigError("executor", f"'vectorized' cannot run {self._alg.name}: {reason}")
        if chunk is not None and chunk < 1:
            raise ConfigError("executor_chunk", f"must be at least 1, got {chunk}")
        self.chunk = chunk
        self.device = self._alg.device
        self._fed = fed
        info = fed.info
        train = fed.splits.train
        self._train_set = _Records(train.images, train.labels, info, self.device)
        source = train if fed.test_source == "train" else fed.splits.test
        self._test_set = (
            self._train_set
            if source is train
            else _Records(source.images, source.labels, info, self.device)
        )
        p, t = self._alg.privacy, self._alg.training
        self._dp = (
            DPSGD(p.noise_multiplier, p.clip, t.batch_size)
            if p is not None and p.mechanism == "dpsgd"
            else None
        )
        if self._dp is not None and self._alg.vector_objective:
            raise ConfigError(
                "executor",
                f"'vectorized' cannot run {self._alg.name} with DP-SGD: its objective is not "
                "a per-record cross-entropy",
            )
        net = _Net(self._alg.vector_model().to(self.device), self._alg)
        self._model, self._names, self._frozen, self._keys = (
            net.model,
            net.names,
            net.frozen,
            net.keys,
        )
        self._logged_chunk: int | None = None

    # ------------------------------------------------------------------ executor protocol
    def map(self, tasks: Iterable[ClientTask]) -> Iterator[ClientResult]:
        """The round's clients in chunks, in the tasks' order."""
        tasks = list(tasks)
        chunk = self.chunk or max(1, len(tasks))
        i = 0
        while i < len(tasks):
            part = tasks[i : i + chunk]
            try:
                results = self._run_chunk(part)
            except torch.OutOfMemoryError:
                if len(part) == 1:
                    raise
                chunk = max(1, len(part) // 2)
                self.chunk = chunk
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
                log.warning("vectorized executor: out of memory; chunks of %d clients now", chunk)
                continue
            if self._logged_chunk != len(part) and i == 0:
                self._logged_chunk = len(part)
                log.info("vectorized executor: chunks of %d clients on %s", len(part), self.device)
            yield from results
            i += len(part)

    def close(self) -> None:
        pass

    # ------------------------------------------------------------------ one chunk
    def _functional(self, params: dict[str, torch.Tensor], *args: torch.Tensor) -> torch.Tensor:
        return functional_call(self._model, (params, self._frozen), args)

    def _stack(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """``[K, ...]`` on the device; one tensor that every client received (a broadcast) is
        copied to the device once and repeated there."""
        first = tensors[0]
        if all(_same(t, first) for t in tensors[1:]):
            return first.to(self.device).expand(len(tensors), *first.shape).clone()
        return torch.stack([t.to(self.device) for t in tensors])

    def _run_chunk(self, tasks: list[ClientTask]) -> list[ClientResult]:
        began = time.perf_counter()
        alg, fed = self._alg, self._fed
        phases = [[alg.vector_job(task) for task in tasks]]
        while any(j.then is not None for j in phases[-1]):
            nxt = [j.then for j in phases[-1]]
            if any(j is None for j in nxt):
                raise ValueError(f"{alg.name}: clients of one round planned different phases")
            phases.append(nxt)  # type: ignore[arg-type]
        for jobs in phases:
            plans = {
                (
                    j.follows,
                    j.epochs,
                    j.trains,
                    j.clip,
                    j.private,
                    j.lr_scale,
                    j.step_choices > 0,
                    len(j.consts),
                    j.class_mask,
                )
                for j in jobs
            }
            if len(plans) > 1:
                raise ValueError(f"{alg.name}: clients of one round planned different trainings")
        if phases[0][0].follows:
            raise ValueError(f"{alg.name}: the first training cannot follow another")
        if not alg.vector_objective and any(
            j.step_choices or j.consts or j.class_mask for js in phases for j in js
        ):
            raise ValueError(f"{alg.name}: a job hands its objective inputs it does not have")
        # a chain: trainings linked by ``follows``; its end is a result (VectorJob's docstring)
        ends = [
            d for d in range(len(phases)) if d + 1 == len(phases) or not phases[d + 1][0].follows
        ]
        last_chain = max(d for d in range(len(phases)) if not phases[d][0].follows)
        train_rows = [
            torch.tensor(fed.train.client_indices[t.client_id], dtype=torch.long) for t in tasks
        ]
        # each client's own stream, as the loop's client_generator: it runs on through phases
        gens = [torch.Generator() for _ in tasks]
        for g, task in zip(gens, tasks, strict=True):
            g.set_state(_client_state(task))
        metrics: list[dict[str, float]] = [{} for _ in tasks]
        judged = [k for k, t in enumerate(tasks) if t.evaluate]
        # an algorithm with its own objective evaluates its clients in vector_result
        self_judged = set(judged) if alg.vector_objective else set()
        if self_judged:
            judged = []
        results_at: list[dict[str, torch.Tensor]] = []
        params: dict[str, torch.Tensor] = {}
        for depth, jobs in enumerate(phases):
            job = jobs[0]
            if not job.follows:
                params = {k: self._stack([j.start[k] for j in jobs]) for k in self._names}
            dtype = params[self._names[0]].dtype
            lr = torch.tensor([j.lr for j in jobs], dtype=dtype, device=self.device)
            mu = torch.tensor([j.prox_mu for j in jobs], dtype=dtype, device=self.device)
            anchor = None
            if any(j.prox_mu for j in jobs):
                anchor = {
                    k: self._stack([(j.anchor or j.start)[k] for j in jobs]) for k in self._names
                }
            if depth == last_chain and judged:  # the start of the model the client keeps
                self._evaluate_into(metrics, judged, params, tasks, before=True)
            choices = [j.step_choices for j in jobs] if job.step_choices else None
            given = tuple(self._stack([j.consts[i] for j in jobs]) for i in range(len(job.consts)))
            if job.class_mask:
                given += (self._class_masks(train_rows),)
            losses = self._train(
                params, anchor, lr, mu, tasks, gens, train_rows, job, choices, given
            )
            if depth == ends[0]:  # the released model's loss, as the loop reports it
                for k, loss in enumerate(losses):
                    metrics[k]["train_loss"] = loss
            if depth == len(phases) - 1 and judged:
                self._evaluate_into(metrics, judged, params, tasks, before=False)
            if depth in ends:
                results_at.append(params)
                params = dict(params)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = (time.perf_counter() - began) / len(tasks)
        from flcore.executor import client_data  # (flcore.executor imports this module)

        results = []
        for k, task in enumerate(tasks):
            weights, kept = (
                {key: p[key][k].detach().clone() for key in self._keys}
                for p in (results_at[0], results_at[-1])
            )
            metrics[k]["client_seconds"] = seconds
            kept_or_none = kept if len(results_at) > 1 else None
            if k not in self_judged:
                results.append(
                    alg.vector_result(task, weights, len(train_rows[k]), metrics[k], kept_or_none)
                )
                continue
            began = time.perf_counter()  # the client's evaluation counts in its seconds
            data = client_data(fed, task.client_id)
            result = alg.vector_result(
                task, weights, len(train_rows[k]), metrics[k], kept_or_none, data=data
            )
            result.metrics["client_seconds"] = seconds + time.perf_counter() - began
            results.append(result)
        return results

    # ------------------------------------------------------------------ training
    def _train(
        self,
        params: dict[str, torch.Tensor],
        anchor: dict[str, torch.Tensor] | None,
        lr: torch.Tensor,
        mu: torch.Tensor,
        tasks: list[ClientTask],
        gens: list[torch.Generator],
        rows: list[torch.Tensor],
        job: Any,
        choices: list[int] | None = None,
        given: tuple[torch.Tensor, ...] = (),
    ) -> list[float]:
        """Every client's epochs of ``job``, step by step in lockstep (DP-SGD when the run's
        mechanism is ``dpsgd`` and the job is ``private``); returns each one's mean loss.
        ``choices``: each client's ``VectorJob.step_choices`` (None: no draw a step);
        ``given``: stacked per-client inputs of the objective (``consts``, the class mask)."""
        t = self._alg.training
        epochs = t.epochs if job.epochs is None else job.epochs
        names = list(job.trains) if job.trains is not None else self._names
        unknown = sorted(set(names) - set(self._names))
        if unknown:
            raise ValueError(f"{self._alg.name}: a job trains unknown parameters {unknown}")
        n = [len(r) for r in rows]
        steps = torch.tensor([epochs * math.ceil(nk / t.batch_size) for nk in n])
        total = int(steps.max()) if len(n) else 0
        active_host = torch.arange(total)[None, :] < steps[:, None]
        active = active_host.to(self.device)
        lrs = set(lr.tolist())
        # what each step's update may skip, known on the host (no device sync)
        how = [
            {"uniform_lr": next(iter(lrs)) if len(lrs) == 1 else None, "all_active": bool(a)}
            for a in active_host.all(0).tolist()
        ]
        buf = {k: torch.zeros_like(params[k]) for k in names}
        scale = dict(job.lr_scale)
        unscaled = sorted(set(scale) - set(names))
        if unscaled:
            raise ValueError(f"{self._alg.name}: lr_scale names untrained parameters {unscaled}")
        dtype = lr.dtype
        loss_sum = torch.zeros(len(tasks), dtype=dtype, device=self.device)
        self._model.train()
        held = {k: v for k, v in params.items() if k not in names}

        def batch_loss(
            p: dict[str, torch.Tensor],
            fixed: dict[str, torch.Tensor],
            x: torch.Tensor,
            y: torch.Tensor,
            m: torch.Tensor,
            *drawn: torch.Tensor,
        ) -> torch.Tensor:
            if self._alg.vector_objective:
                return self._functional(p | fixed, x, y, m, *drawn)
            ce = F.cross_entropy(self._functional(p | fixed, x), y, reduction="none")
            return (ce * m).sum() / m.sum().clamp(min=1)

        if self._dp is None or not job.private:
            idx, mask, picks = self._epoch_batches(gens, rows, total, epochs, choices)
            step = vmap(grad_and_value(batch_loss))
            drawn: tuple[torch.Tensor, ...] = ()
            if choices is not None:
                count = torch.tensor(choices, dtype=torch.long, device=self.device)
            for s in range(total):
                x, y = self._train_set.batch(idx[:, s])
                trained = {k: params[k] for k in names}
                if choices is not None:
                    drawn = (picks[:, s], count)
                grads, loss = step(trained, held, x, y, mask[:, s].to(dtype), *drawn, *given)
                loss_sum += torch.where(active[:, s], loss, 0.0)
                for group, max_norm in job.clip:
                    _clip_(grads, group, max_norm)
                self._sgd(params, buf, grads, anchor, lr, mu, active[:, s], scale, **how[s])
        else:
            dp = self._dp
            noise_gen = None
            if self.device.type != "cpu":
                words = np.random.SeedSequence(
                    [tasks[0].seed, 0xF7, tasks[0].round, tasks[0].client_id]
                ).generate_state(2, np.uint32)
                noise_gen = torch.Generator(device=self.device)
                noise_gen.manual_seed(int(words[0]) << 32 | int(words[1]))
            q = [dp.sample_rate(nk) for nk in n]
            expected = torch.tensor([qk * nk for qk, nk in zip(q, n, strict=True)], dtype=dtype)
            expected = expected.to(self.device)

            def sample_loss(p, fixed, x, y):  # type: ignore[no-untyped-def]
                return F.cross_entropy(self._functional(p | fixed, x.unsqueeze(0)), y.unsqueeze(0))

            # each record's gradient and loss in one pass: the batch's loss (the masked mean)
            # needs no forward pass of its own
            per_sample = vmap(vmap(grad_and_value(sample_loss), in_dims=(None, None, 0, 0)))
            std = dp.noise_multiplier * dp.clip
            if noise_gen is not None:  # every step's batches, moved to the device at once
                table, table_mask, widths = self._poisson_table(gens, rows, q, steps, total)
            for s in range(total):
                trained = {k: params[k] for k in names}
                if noise_gen is None:
                    picks, noise = self._dp_draws(gens, rows, q, steps, s, trained, std)
                    idx, mask = _padded(picks, max(1, max(len(p) for p in picks)))
                    idx, mask = idx.to(self.device), mask.to(self.device)
                else:
                    idx, mask = table[:, s, : widths[s]], table_mask[:, s, : widths[s]]
                    noise = {
                        k: torch.normal(
                            0.0, std, v.shape, generator=noise_gen, device=v.device, dtype=v.dtype
                        )
                        for k, v in trained.items()
                    }
                x, y = self._train_set.batch(idx)
                g, ce = per_sample(trained, held, x, y)
                norms = torch.sqrt(sum(v.flatten(2).pow(2).sum(2) for v in g.values()))
                factor = (dp.clip / (norms + 1e-12)).clamp(max=1.0) * mask
                grads = {
                    k: (torch.einsum("kb,kb...->k...", factor, v) + noise[k])
                    / _per_client(expected, v[:, 0])
                    for k, v in g.items()
                }
                m = mask.to(dtype)
                loss = (ce.detach() * m).sum(1) / m.sum(1).clamp(min=1)
                loss_sum += torch.where(active[:, s], loss, 0.0)
                self._sgd(params, buf, grads, anchor, lr, mu, active[:, s], scale, **how[s])
        return (loss_sum.cpu() / steps.clamp(min=1).to(dtype)).tolist()

    def _class_masks(self, rows: list[torch.Tensor]) -> torch.Tensor:
        """``[K, num_classes]``: the classes each client's training records hold."""
        n = self._alg.model_spec.num_classes
        labels = self._fed.splits.train.labels
        out = torch.zeros(len(rows), n, dtype=torch.bool)
        for k, row in enumerate(rows):
            out[k, labels[row].unique()] = True
        return out.to(self.device)

    def _epoch_batches(
        self,
        gens: list[torch.Generator],
        rows: list[torch.Tensor],
        total: int,
        epochs: int,
        choices: list[int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each client's shuffled batches for all its epochs (the loop's draws), as a
        ``[K, steps, B]`` table of global indices and its mask, and with ``choices`` each
        step's draw (``[K, steps]``, 0 past a client's last step), drawn in the loop's order:
        an epoch's shuffle, then one draw a step."""
        t = self._alg.training
        idx = torch.zeros(len(rows), total, t.batch_size, dtype=torch.long)
        mask = torch.zeros(len(rows), total, t.batch_size, dtype=torch.bool)
        picks = torch.zeros(len(rows), total, dtype=torch.long)
        for k, (g, row) in enumerate(zip(gens, rows, strict=True)):
            s = 0
            for _ in range(epochs):
                for b in torch.randperm(len(row), generator=g).split(t.batch_size):
                    idx[k, s, : len(b)] = row[b]
                    mask[k, s, : len(b)] = True
                    if choices is not None:
                        picks[k, s] = int(torch.randint(choices[k], (1,), generator=g))
                    s += 1
        return idx.to(self.device), mask.to(self.device), picks.to(self.device)

    def _poisson_table(
        self,
        gens: list[torch.Generator],
        rows: list[torch.Tensor],
        q: list[float],
        steps: torch.Tensor,
        total: int,
    ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Every step's Poisson batches at once (off the CPU): ``[K, total, W]`` global indices
        and mask on the device, and each step's width (its widest batch, at least 1). Each
        client's generator draws ``rand(steps_k, n_k)``, the same numbers as one ``rand(n_k)``
        a step, so the batches are the ones a step-by-step draw would take; one copy to the
        device a chunk instead of one a step, which waited for the GPU every step."""
        width = torch.ones(total, dtype=torch.long)
        drawn = []
        for k, (g, row) in enumerate(zip(gens, rows, strict=True)):
            chosen = torch.rand(int(steps[k]), len(row), generator=g) < q[k]
            counts = chosen.sum(1)
            if len(counts):
                width[: len(counts)] = torch.maximum(width[: len(counts)], counts)
            # the chosen positions first, in order: a stable sort of "not chosen"
            order = torch.sort((~chosen).to(torch.uint8), dim=1, stable=True).indices
            drawn.append((row[order], counts))
        w = int(width.max()) if total else 1
        idx = torch.zeros(len(rows), total, w, dtype=torch.long)
        mask = torch.zeros(len(rows), total, w, dtype=torch.bool)
        for k, (picked, counts) in enumerate(drawn):
            cols = min(w, picked.shape[1])
            idx[k, : len(counts), :cols] = picked[:, :cols]
            mask[k, : len(counts)] = torch.arange(w)[None, :] < counts[:, None]
        return idx.to(self.device), mask.to(self.device), width.tolist()

    def _dp_draws(
        self,
        gens: list[torch.Generator],
        rows: list[torch.Tensor],
        q: list[float],
        steps: torch.Tensor,
        s: int,
        params: dict[str, torch.Tensor],
        std: float,
    ) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
        """On the CPU, step ``s``'s Poisson batches (global indices) and DP noise, stacked per
        parameter: each client's generator draws its mask then its noise, as in the loop."""
        picks: list[torch.Tensor] = []
        per_client: list[list[torch.Tensor] | None] = []
        for k, (g, row) in enumerate(zip(gens, rows, strict=True)):
            if s >= int(steps[k]):
                picks.append(torch.zeros(0, dtype=torch.long))
                per_client.append(None)
                continue
            chosen = (torch.rand(len(row), generator=g) < q[k]).nonzero().flatten()
            picks.append(row[chosen])
            per_client.append(
                [torch.normal(0.0, std, size=v.shape[1:], generator=g) for v in params.values()]
            )
        noise = {}
        for j, name in enumerate(params):
            zero = torch.zeros(params[name].shape[1:], dtype=params[name].dtype)
            noise[name] = torch.stack(
                [zero if draws is None else draws[j] for draws in per_client]
            ).to(self.device)
        return picks, noise

    def _sgd(
        self,
        params: dict[str, torch.Tensor],
        buf: dict[str, torch.Tensor],
        grads: dict[str, torch.Tensor],
        anchor: dict[str, torch.Tensor] | None,
        lr: torch.Tensor,
        mu: torch.Tensor,
        active: torch.Tensor,
        scale: dict[str, float],
        *,
        uniform_lr: float | None,
        all_active: bool,
    ) -> None:
        """One SGD step of every active client on the parameters in ``grads``, in place, as
        torch's SGD takes it (module docstring); clients whose steps are done keep their
        parameters and momentum. With one learning rate, every client active and no proximal
        term (known on the host, no device sync), the step is torch's fused SGD kernel over the
        stacked tensors (an elementwise step: stacking changes nothing), the kernel the loop's
        optimizer runs (once per ``scale`` factor, as the loop's parameter groups); otherwise a
        masked step with per-client rates."""
        t = self._alg.training
        keys = list(grads)
        with torch.no_grad():
            if uniform_lr is not None and all_active and anchor is None:
                by_lr: dict[float, list[str]] = {}
                for k in keys:
                    by_lr.setdefault(uniform_lr * scale.get(k, 1.0), []).append(k)
                for step_lr, group in by_lr.items():
                    torch._fused_sgd_(
                        [params[k] for k in group],
                        # the kernel walks memory: a gradient laid out otherwise than its
                        # parameter (vmap's gradient of a permuted view: Pa3dFL's V) is copied
                        [_like(grads[k], params[k]) for k in group],
                        [buf[k] for k in group] if t.momentum else [],
                        weight_decay=t.weight_decay,
                        momentum=t.momentum,
                        lr=step_lr,
                        dampening=0.0,
                        nesterov=False,
                        maximize=False,
                        is_first_step=False,
                    )
                return
            on = active.to(lr.dtype)
            for k in keys:
                p, g = params[k], grads[k]
                if anchor is not None:
                    g = g + _per_client(mu, p) * (p - anchor[k])
                if t.weight_decay:
                    g = g.add(p, alpha=t.weight_decay)
                g = g * _per_client(on, p)  # a finished client: no gradient, ...
                if t.momentum:  # ... its momentum kept (x 1), ...
                    buf[k].mul_(_per_client(on * t.momentum + (1 - on), p)).add_(g)
                    g = buf[k]
                rate = lr * on if k not in scale else lr * scale[k] * on
                p.addcmul_(_per_client(rate, p), g, value=-1.0)  # ... and no step

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def _accuracy(
        self, params: dict[str, torch.Tensor], rows: list[torch.Tensor], records: _Records
    ) -> tuple[list[float], list[float]]:
        """Each client's accuracy and mean cross-entropy on its records (nan for none)."""
        self._model.eval()
        width = max(len(r) for r in rows)
        if width == 0:
            return [math.nan] * len(rows), [math.nan] * len(rows)
        idx, mask = _padded(rows, width)
        idx, mask = idx.to(self.device), mask.to(self.device)
        dtype = next(iter(params.values())).dtype
        correct = torch.zeros(len(rows), dtype=torch.long, device=self.device)
        loss = torch.zeros(len(rows), dtype=dtype, device=self.device)
        block = max(1, EVAL_ROWS // len(rows))
        forward = vmap(self._functional)
        for b in range(0, width, block):
            x, y = records.batch(idx[:, b : b + block])
            m = mask[:, b : b + block]
            logits = forward(params, x)
            ce = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none")
            loss += (ce.view_as(m) * m).sum(1)
            correct += ((logits.argmax(-1) == y) & m).sum(1)
        n = mask.sum(1).tolist()
        pairs = list(zip(correct.tolist(), loss.tolist(), n, strict=True))
        acc = [c / k if k else math.nan for c, _, k in pairs]
        return acc, [v / k if k else math.nan for _, v, k in pairs]

    def _evaluate_into(
        self,
        metrics: list[dict[str, float]],
        judged: list[int],
        params: dict[str, torch.Tensor],
        tasks: list[ClientTask],
        *,
        before: bool,
    ) -> None:
        """``client_eval``'s figures for the clients in ``judged`` (module docstring)."""
        fed = self._fed
        # every client judged (the usual case): no copy of the stacked parameters
        sub = params if len(judged) == len(tasks) else {k: v[judged] for k, v in params.items()}
        ids = [tasks[k].client_id for k in judged]
        test = [torch.tensor(fed.test.client_indices[c], dtype=torch.long) for c in ids]
        acc, loss = self._accuracy(sub, test, self._test_set)
        for j, k in enumerate(judged):
            if before:
                metrics[k]["accuracy_before"] = acc[j]
            else:
                metrics[k]["accuracy"], metrics[k]["test_loss"] = acc[j], loss[j]
        if fed.val is None:
            return
        val_rows = [torch.tensor(fed.val.client_indices[c], dtype=torch.long) for c in ids]
        has = [j for j, r in enumerate(val_rows) if len(r)]
        if not has:
            return
        val_acc, _ = self._accuracy(
            {k: v[has] for k, v in sub.items()}, [val_rows[j] for j in has], self._train_set
        )
        key = "val_accuracy_before" if before else "val_accuracy"
        for a, j in zip(val_acc, has, strict=True):
            metrics[judged[j]][key] = a


class _Net:
    """One group's network: the module called functionally, the names of its trainable
    parameters, its held ones, and the state keys a result is made of."""

    def __init__(self, model: torch.nn.Module, alg: Algorithm) -> None:
        self.model = model
        named = list(model.named_parameters())
        self.names = [k for k, p in named if p.requires_grad]
        self.frozen = {k: p.detach() for k, p in named if not p.requires_grad}
        keys = alg.vector_keys(model)
        self.keys = list(model.state_dict()) if keys is None else list(keys)


def _like(g: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """``g`` in ``p``'s memory layout (itself when it already is)."""
    return g if g.stride() == p.stride() else torch.empty_like(p).copy_(g)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors are views of the same memory with the same layout."""
    return a is b or (
        a.device == b.device
        and a.dtype == b.dtype
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.data_ptr() == b.data_ptr()
    )


def _clip_(grads: dict[str, torch.Tensor], group: tuple[str, ...], max_norm: float) -> None:
    """Scales each client's gradients of ``group`` together to norm ``max_norm`` at most, as
    ``torch.nn.utils.clip_grad_norm_`` does for one model (coefficient ``max_norm / (norm +
    1e-6)``, capped at 1)."""
    norms = torch.stack([grads[k].flatten(1).norm(dim=1) for k in group]).norm(dim=0)
    coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for k in group:
        grads[k].mul_(_per_client(coef, grads[k]))


def _client_state(task: ClientTask) -> torch.Tensor:
    from flcore.executor import client_generator

    return client_generator(task.seed, task.round, task.client_id).get_state()
