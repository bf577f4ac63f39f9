"""FedGen: Zhu, Hong & Zhou, "Data-Free Knowledge Distillation for Heterogeneous Federated
Learning", ICML 2021.

The server learns a conditional generator ``G_w(eps, y) -> z`` of representations (the input
of the classifier head) that the clients' heads agree on, and broadcasts it; clients use it as
an inductive bias. Models are averaged as in FedAvg (n_k-weighted).

Server, each round, after the clients' uploads (each client k sends its model and its label
counts n_k(y)): ``gen_epochs`` epochs of ``gen_iters`` Adam steps on

    L_G = sum_k (1/B) sum_b a_k(y_b) CE(h_k(G(eps_b, y_b)), y_b) + eta L_div,
    a_k(y) = n_k(y) / sum_j n_j(y),        eps_b ~ N(0, I),  y_b ~ U(labels some client holds),

where ``h_k`` is client k's OWN uploaded head (FL-bench's FedGen uses one head as every teacher;
FedHKD's supplementary script indexes one client's model inside the loop: neither is inherited),
and the diversity loss of the authors' code

    L_div = exp(-mean_{i,j} ||eps_i - eps_j||^2 / d_eps * ||z_i - z_j||_1 / d_z).

Client, from round 2 (once a generator exists), on each private batch (x, y) of size B:

    CE(f(x), y) + (B_g / B) alpha_t (1/B_g) sum CE(h(G(eps', y')), y')
                + beta_t KL( softmax(h(G(eps, y))) || softmax(f(x)) ),

with y' a batch of B_g = ``gen_batch_size`` labels drawn uniformly from the labels the generator
was trained on (broadcast beside it), eps, eps' fresh N(0, I) noise, G frozen and in eval mode;
the KL's target is detached (the authors' ``user_latent_loss``), averaged over the batch.
``alpha_t = max(1e-4, alpha x decay^(t-1))`` and the same for beta (alpha = beta = 10,
decay 0.98: FedHKD Appendix A.1; the floor is the authors' code's).

Choices where the papers are silent, and deviations, stated:

- Generator (the paper's MLP, FedHKD: hidden 512): ``[eps, onehot(y)] -> Linear(hidden) ->
  BatchNorm1d -> ReLU -> Linear(d)``, with noise dimension = latent dimension d = the model's
  representation size (the in-features of the head's first Linear layer). eps ~ N(0, I) as the
  paper writes (the authors' code draws U[0, 1): its noise distances are about 12 times
  smaller, so its diversity term saturates later).
- Generator training: the authors' code's optimiser (Adam, lr 3e-4, weight decay 1e-2, lr x0.98
  per round, state kept across rounds), its "epoch" of 5 steps, FedHKD's 5 epochs (25 steps a
  round, our reading of A.1's "5 epochs"; FedGen's code runs 10 such epochs, 50 steps, on
  batches of 32, and FedHKD's code 5 steps: a weaker generator than FedGen's), batch = the
  local batch size (at least 2, for BatchNorm; A.1's "generating batch-size 32" read as the
  clients'), eta = 1; its adversarial
  student term has weight 0 in every released config and is not implemented. The teacher
  weights a_k(y) multiply each record's cross-entropy (the authors' code multiplies a [B] by a
  [B, 1] tensor, which averages ce and weights separately: not inherited). Label counts are
  exact histograms of the client's training records (the authors' code starts each count at 1).
- The generator is trained on the heads of the round's clients, after averaging; round 1's
  clients train cross-entropy only (the authors' ``regularization = glob_iter > 0``). The
  teacher term is scaled by B_g / B as in the authors' code (FedHKD: "the ratio of the
  generating batch-size and the training batch-size was set to 0.5").
- What leaves the client: its model and its label counts (the server needs them for a_k).
- No DP mechanism (the label counts and the model are released as they are).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn
from torch.func import functional_call

from flcore.algorithms.base import (
    ALGORITHMS,
    AlgorithmParams,
    ClientData,
    ClientResult,
    ClientTask,
    seeded,
)
from flcore.algorithms.fedavg import FedAvg
from flcore.algorithms.training import LossFn, cross_entropy
from flcore.errors import ConfigError

__all__ = [
    "FedGen",
    "FedGenParams",
    "Generator",
    "diversity_loss",
    "label_weights",
    "representation_dim",
    "teacher_loss",
]

#: upload key: the client's label histogram over its training records
COUNTS = "label_counts"
#: broadcast key prefix of the generator's tensors, and the key of its label mask
GEN = "generator."
GEN_LABELS = "generator_labels"


class FedGenParams(AlgorithmParams):
    alpha: float = Field(
        10.0, ge=0, description="alpha: weight of the generated-latent CE (FedHKD: 10)"
    )
    beta: float = Field(
        10.0, ge=0, description="beta: weight of the KL to the generated latents (FedHKD: 10)"
    )
    decay: float = Field(
        0.98, gt=0, le=1, description="alpha and beta are multiplied by this each round"
    )
    gen_batch_size: int = Field(
        32, ge=1, description="generated latents per client step (FedHKD: 32)"
    )
    hidden: int = Field(512, ge=1, description="the generator's hidden width (FedHKD: 512)")
    gen_epochs: int = Field(
        5, ge=1, description="generator epochs per round on the server (FedHKD: 5)"
    )
    gen_iters: int = Field(
        5, ge=1, description="Adam steps per generator epoch (the authors' code: 5)"
    )
    gen_lr: float = Field(3e-4, gt=0, description="the generator's Adam learning rate")
    gen_lr_decay: float = Field(
        0.98, gt=0, le=1, description="the generator's lr is multiplied by this each round"
    )
    gen_weight_decay: float = Field(1e-2, ge=0, description="the generator's weight decay")
    diversity: float = Field(1.0, ge=0, description="eta: weight of the diversity loss")


class Generator(nn.Module):
    """FedGen's conditional MLP generator of representations: (eps, y) -> z."""

    def __init__(self, num_classes: int, noise_dim: int, latent_dim: int, hidden: int) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.noise_dim = noise_dim
        self.body = nn.Sequential(
            nn.Linear(noise_dim + num_classes, hidden), nn.BatchNorm1d(hidden), nn.ReLU()
        )
        self.out = nn.Linear(hidden, latent_dim)

    def forward(self, eps: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        onehot = F.one_hot(y, self.num_classes).to(eps.dtype)
        return self.out(self.body(torch.cat([eps, onehot], dim=1)))


def representation_dim(model: nn.Module) -> int:
    """The size of the representation the head reads: its first Linear layer's input."""
    for module in model.head.modules():  # type: ignore[union-attr]
        if isinstance(module, nn.Linear):
            return module.in_features
    raise ConfigError("model", "fedgen needs a classifier head that starts with a Linear layer")


def label_weights(counts: torch.Tensor) -> torch.Tensor:
    """a_k(y) = n_k(y) / sum_j n_j(y) as a [classes x clients] matrix, from per-client label
    counts [clients x classes]; a label no client holds gets weight 0 everywhere."""
    counts = counts.to(torch.float64)
    total = counts.sum(0, keepdim=True)
    return (counts / total.clamp_min(1)).T.to(torch.float32)


def teacher_loss(
    z: torch.Tensor,
    y: torch.Tensor,
    heads: list[Callable[[torch.Tensor], torch.Tensor]],
    weights: torch.Tensor,
) -> torch.Tensor:
    """sum_k mean_b a_k(y_b) CE(h_k(z_b), y_b): each client's own head, label-weighted."""
    total = z.new_zeros(())
    for k, head in enumerate(heads):
        ce = F.cross_entropy(head(z), y, reduction="none")
        total = total + (weights[y, k] * ce).mean()
    return total


def diversity_loss(eps: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """exp(-mean_ij d2(eps_i, eps_j) d1(z_i, z_j)): small when different noise gives different
    latents (mean squared distance of the noise, mean absolute distance of the outputs)."""
    noise = (eps[:, None] - eps[None]).pow(2).mean(2)
    spread = (z[:, None] - z[None]).abs().mean(2)
    return torch.exp(-(noise * spread).mean())


def _decayed(value: float, decay: float, round: int) -> float:
    return max(1e-4, value * decay ** (max(1, round) - 1))


def generator_regularizer(
    generator: nn.Module,
    labels: torch.Tensor,
    alpha: float,
    beta: float,
    gen_batch_size: int,
    batch_size: int,
    rng: torch.Generator,
) -> LossFn:
    """The client objective: CE plus FedGen's two generator terms (module docstring)."""
    noise_dim = int(generator.noise_dim)  # type: ignore[arg-type]
    ratio = gen_batch_size / batch_size

    def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = model(x)
        total = F.cross_entropy(logits, y)
        device = logits.device
        head = model.head  # type: ignore[union-attr]
        if beta > 0:
            eps = torch.randn(len(y), noise_dim, generator=rng).to(device)
            with torch.no_grad():
                target = F.softmax(head(generator(eps, y)), dim=1)
            kl = F.kl_div(F.log_softmax(logits, dim=1), target, reduction="batchmean")
            total = total + beta * kl
        if alpha > 0:
            pick = torch.randint(len(labels), (gen_batch_size,), generator=rng)
            y_gen = labels[pick].to(device)
            eps = torch.randn(gen_batch_size, noise_dim, generator=rng).to(device)
            with torch.no_grad():
                z = generator(eps, y_gen)
            total = total + ratio * alpha * F.cross_entropy(head(z), y_gen)
        return total

    return loss


@ALGORITHMS.register("fedgen")
class FedGen(FedAvg):
    """FedAvg plus a server-trained generator of representations that regularises clients."""

    name = "fedgen"
    privacy_mechanisms = frozenset()
    Params = FedGenParams

    def _new_generator(self) -> Generator:
        p = self.params
        assert isinstance(p, FedGenParams)
        d = representation_dim(self.model_spec())
        return Generator(self.model_spec.num_classes, d, d, p.hidden)

    # ------------------------------------------------------------------ server side
    def init_server(self) -> None:
        super().init_server()
        p = self.params
        assert isinstance(p, FedGenParams)
        self.generator = seeded((self.seed, 0x6E4), self._new_generator).to(self.device)
        self.gen_optimizer = torch.optim.Adam(
            self.generator.parameters(), lr=p.gen_lr, weight_decay=p.gen_weight_decay
        )
        #: the labels the generator was last trained on (None: not trained yet)
        self.gen_labels: torch.Tensor | None = None
        self._teachers: list[tuple[dict[str, torch.Tensor], torch.Tensor]] = []
        self._head = seeded((self.seed, 0x1417), self.model_spec).head.to(self.device).eval()

    def broadcast(self, round: int, client_id: int) -> dict[str, torch.Tensor]:
        out = self.shared_state()
        if self.gen_labels is not None:
            out |= {GEN + k: v for k, v in self.generator.state_dict().items()}
            out[GEN_LABELS] = self.gen_labels
        return out

    def begin_round(self, round: int, client_ids: list[int]) -> None:
        super().begin_round(round, client_ids)
        self._teachers = []

    def accumulate(self, result: ClientResult) -> None:
        upload = dict(result.upload)
        counts = upload.pop(COUNTS)
        head = {k[len("head.") :]: v.to(self.device) for k, v in upload.items() if k[:5] == "head."}
        self._teachers.append((head, counts))
        super().accumulate(dataclasses.replace(result, upload=upload))

    def end_round(self, round: int) -> None:
        super().end_round(round)
        teachers, self._teachers = self._teachers, []
        if teachers:
            self.train_generator(teachers, round)

    def train_generator(
        self, teachers: list[tuple[dict[str, torch.Tensor], torch.Tensor]], round: int
    ) -> float:
        """``gen_epochs x gen_iters`` steps of L_G with the given clients' heads and label
        counts as teachers; returns the mean loss. Seeded by (seed, round)."""
        p = self.params
        assert isinstance(p, FedGenParams)
        counts = torch.stack([c.to(torch.float64) for _, c in teachers])
        labels = torch.nonzero(counts.sum(0) > 0).flatten()
        words = np.random.SeedSequence([self.seed, 0x6E4, round]).generate_state(1, np.uint64)
        rng = torch.Generator().manual_seed(int(words[0]) % 2**63)
        batch = max(2, self.training.batch_size)
        for group in self.gen_optimizer.param_groups:
            group["lr"] = p.gen_lr * p.gen_lr_decay ** (max(1, round) - 1)
        from flcore.executor import one_torch_thread  # lazy: the executor imports algorithms

        self.generator.train()
        total = 0.0
        steps = p.gen_epochs * p.gen_iters
        # tiny tensors: one thread is faster than two contending ones, and bitwise repeatable
        with one_torch_thread():
            for _ in range(steps):
                y = labels[torch.randint(len(labels), (batch,), generator=rng)].to(self.device)
                eps = torch.randn(batch, self.generator.noise_dim, generator=rng).to(self.device)
                loss = self.generator_loss(teachers, eps, y)
                self.gen_optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.gen_optimizer.step()
                total += float(loss.detach())
        self.generator.eval()
        self.gen_labels = torch.zeros(self.model_spec.num_classes, dtype=torch.bool)
        self.gen_labels[labels] = True
        return total / steps

    def generator_loss(
        self,
        teachers: list[tuple[dict[str, torch.Tensor], torch.Tensor]],
        eps: torch.Tensor,
        y: torch.Tensor,
    ) -> torch.Tensor:
        """L_G at (eps, y): each teacher's own head, weighted by its share a_k(y) of the
        label, plus eta times the diversity loss."""
        p = self.params
        assert isinstance(p, FedGenParams)
        counts = torch.stack([c.to(torch.float64) for _, c in teachers])
        weights = label_weights(counts).to(self.device)
        heads = [self._teacher(h) for h, _ in teachers]
        z = self.generator(eps, y)
        return teacher_loss(z, y, heads, weights) + p.diversity * diversity_loss(eps, z)

    def _teacher(self, params: dict[str, torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
        """Client k's head h_k as a function of z (the shared architecture, its own tensors)."""
        return lambda z: functional_call(self._head, params, (z,))

    def state_dict(self) -> dict[str, Any]:
        labels = self.gen_labels
        return super().state_dict() | {
            "generator": {k: v.clone() for k, v in self.generator.state_dict().items()},
            "gen_optimizer": copy.deepcopy(self.gen_optimizer.state_dict()),
            "gen_labels": None if labels is None else labels.clone(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.generator.load_state_dict(state["generator"])
        self.gen_optimizer.load_state_dict(copy.deepcopy(state["gen_optimizer"]))
        labels = state["gen_labels"]
        self.gen_labels = None if labels is None else labels.clone()

    # ------------------------------------------------------------------ client side
    def frozen_generator(self) -> Generator:
        """The worker's frozen generator; its weights are overwritten from each broadcast."""
        if getattr(self, "_client_gen", None) is None:
            gen = self._new_generator().to(self.device).eval()
            gen.requires_grad_(False)
            self._client_gen = gen
        return self._client_gen

    def local_update(
        self, data: ClientData, task: ClientTask, generator: torch.Generator
    ) -> ClientResult:
        p = self.params
        assert isinstance(p, FedGenParams)
        weights = {k: v for k, v in task.payload.items() if not k.startswith(GEN)}
        weights.pop(GEN_LABELS, None)
        model = self.client_model()
        model.load_state_dict(weights)
        metrics = self.client_eval(task, model, data, before=True)
        loss_fn: LossFn = cross_entropy
        if GEN_LABELS in task.payload:
            gen = self.frozen_generator()
            n = len(GEN)
            gen.load_state_dict({k[n:]: v for k, v in task.payload.items() if k[:n] == GEN})
            labels = torch.nonzero(task.payload[GEN_LABELS]).flatten()
            loss_fn = generator_regularizer(
                gen,
                labels,
                _decayed(p.alpha, p.decay, task.round),
                _decayed(p.beta, p.decay, task.round),
                p.gen_batch_size,
                self.training.batch_size,
                generator,
            )
        opt = self.local_optimizer(model.parameters(), round=task.round)
        metrics["train_loss"] = self.run_epochs(model, data, opt, generator, loss_fn=loss_fn)
        metrics |= self.client_eval(task, model, data)
        upload = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        num_classes = self.model_spec.num_classes
        upload[COUNTS] = torch.bincount(data.train.labels, minlength=num_classes).float()
        return ClientResult(task.client_id, len(data.train), upload, None, metrics)
