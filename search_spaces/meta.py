"""The meta-learning family (LoDMeta, Yang & Kwok): the walk's privacy knobs, MAML's inner loop,
the meta step, the graph.

LoDMeta's Appendix C fixes eta = 1e-3 and K = 5; alpha and M are not given (ours: alpha 0.1 on
FMNIST's CONV4; M from measured meta-gradient norms, benchmarks/lodmeta_grad_norms.py):

| key | range | why |
|---|---|---|
| ``lr`` | 3e-4, 1e-3, 3e-3 | the meta step eta around the paper's 1e-3 |
| ``algorithm_params.inner_lr`` | 0.03, 0.1, 0.3 | alpha around our 0.1 |
| ``algorithm_params.inner_steps`` (walks, FedMAML) | 1, 3, 5 | K up to the paper's 5 (eval: 5) |
| ``graph.name`` (walks, L2C) | regular, watts_strogatz | the paper's two networks |
| ``privacy.release_epsilon`` (walks) | 0.3 .. 0.95 | Algorithm 2's per-release epsilon (< 1) |
| ``privacy.delta`` (walks) | 1e-5, 1e-3 | below 1 / 100 records a client (else weak-delta) |
| ``privacy.clip`` (walks) | 0.05 .. 5, log | M: a decade either side of the measured median norm |
| ``clients_per_round`` (FedMAML, FedAlt) | 1, 4 | "MAML (1 client)" and MAML's 4 |

Every walk variant gets the same privacy knobs (the paper's Algorithm 1 and LoDMeta(SGD) have
none; with them they are compared at equal epsilon and delta).
"""

from __future__ import annotations

from typing import Any

from search_spaces.base import SPACES, param_name

__all__ = ["fedalt_space", "fedmaml_space", "l2c_space", "walk_space"]


def _inner(trial: Any, algorithm: str, *, steps: bool = True) -> None:
    """alpha, and K where the algorithm has a MAML inner loop (the evaluation's K stays 5:
    ``eval_steps``, never searched)."""
    trial.suggest_categorical(param_name(algorithm, "algorithm_params.inner_lr"), [0.03, 0.1, 0.3])
    if steps:
        trial.suggest_categorical(param_name(algorithm, "algorithm_params.inner_steps"), [1, 3, 5])


def _graph(trial: Any, algorithm: str) -> None:
    trial.suggest_categorical(param_name(algorithm, "graph.name"), ["regular", "watts_strogatz"])


def walk_space(trial: Any, algorithm: str) -> None:
    """A random-walk algorithm: eta, the inner loop, the graph, the per-release epsilon, delta
    and the clip M."""
    trial.suggest_categorical(param_name(algorithm, "lr"), [3e-4, 1e-3, 3e-3])
    _inner(trial, algorithm)
    _graph(trial, algorithm)
    trial.suggest_categorical(param_name(algorithm, "privacy.mechanism"), ["perturbation"])
    trial.suggest_float(param_name(algorithm, "privacy.release_epsilon"), 0.3, 0.95)
    trial.suggest_categorical(param_name(algorithm, "privacy.delta"), [1e-5, 1e-3])
    trial.suggest_float(param_name(algorithm, "privacy.clip"), 0.05, 5.0, log=True)


for _name in ("lodmeta", "lodmeta_basic", "lodmeta_sgd"):
    SPACES.register(_name)(walk_space)


@SPACES.register("fedmaml")
def fedmaml_space(trial: Any, algorithm: str = "fedmaml") -> None:
    """Federated MAML: eta, the inner loop, clients a round."""
    trial.suggest_categorical(param_name(algorithm, "lr"), [3e-4, 1e-3, 3e-3])
    _inner(trial, algorithm)
    trial.suggest_categorical(param_name(algorithm, "algorithm_params.clients_per_round"), [1, 4])


@SPACES.register("fedalt")
def fedalt_space(trial: Any, algorithm: str = "fedalt") -> None:
    """FedAlt: the local step size and steps, clients a round."""
    _inner(trial, algorithm, steps=False)
    trial.suggest_categorical(param_name(algorithm, "algorithm_params.local_steps"), [1, 5, 10])
    trial.suggest_categorical(param_name(algorithm, "algorithm_params.clients_per_round"), [1, 4])


@SPACES.register("l2c")
def l2c_space(trial: Any, algorithm: str = "l2c") -> None:
    """L2C: the local step size and steps, the mixing step, the neighbours kept, the graph."""
    _inner(trial, algorithm, steps=False)
    _graph(trial, algorithm)
    trial.suggest_categorical(param_name(algorithm, "algorithm_params.local_steps"), [1, 5])
    trial.suggest_categorical(param_name(algorithm, "algorithm_params.mix_lr"), [0.03, 0.1, 0.3])
    trial.suggest_categorical(param_name(algorithm, "algorithm_params.top_k"), [1, 2, 3])
