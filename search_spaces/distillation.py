"""The distillation baselines of FedHKD (Chen & Vikalo, ICLR 2023): FedMD and FedGen.

FedHKD (Appendix A.2) trains every method with Adam at lr 1e-3, halved every 10 rounds, and
fixes each method's own coefficients; these spaces search around them:

| key | range | why |
|---|---|---|
| ``lr`` | 1e-4 .. 1e-2, log | one decade either side of FedHKD's Adam 1e-3 |
| ``algorithm_params.lam`` (FedMD) | 0.005 .. 0.5, log | lambda_md, FedHKD's 0.05 in the middle |
| ``algorithm_params.alpha`` (FedGen) | 1 .. 100, log | generated-latent CE weight, FedHKD's 10 |
| ``algorithm_params.beta`` (FedGen) | 1 .. 100, log | latent KL weight, FedHKD's 10 |

The public set's size (FedMD: one local train set) and the generator's architecture are part of
the protocol, not searched; local epochs (5) and batch size (64) are fixed by FedHKD for all
methods.
"""

from __future__ import annotations

from typing import Any

from search_spaces.base import SPACES, param_name

__all__ = ["fedmd_space", "fedgen_space"]


def _lr(trial: Any, algorithm: str) -> None:
    trial.suggest_float(param_name(algorithm, "lr"), 1e-4, 1e-2, log=True)


@SPACES.register("fedmd")
def fedmd_space(trial: Any, algorithm: str = "fedmd") -> None:
    """FedMD: learning rate and the distillation weight lambda_md."""
    _lr(trial, algorithm)
    trial.suggest_float(param_name(algorithm, "algorithm_params.lam"), 0.005, 0.5, log=True)


@SPACES.register("fedgen")
def fedgen_space(trial: Any, algorithm: str = "fedgen") -> None:
    """FedGen: learning rate and the two generator-term weights alpha and beta."""
    _lr(trial, algorithm)
    trial.suggest_float(param_name(algorithm, "algorithm_params.alpha"), 1.0, 100.0, log=True)
    trial.suggest_float(param_name(algorithm, "algorithm_params.beta"), 1.0, 100.0, log=True)
