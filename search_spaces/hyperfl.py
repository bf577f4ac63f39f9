"""The hypernetwork family: HyperFL (main configuration), pFedHN and pFedHN-PC: FedAvg's
utility knobs plus the hypernetwork's shape (and, for pFedHN, the server's learning rate).

Around the paper's setup (Guo et al., AAAI 2025, appendix D.1 and the authors' code: embedding
64, one hidden layer of 128, classifier lr 0.1 for one epoch):

| key | range | why |
|---|---|---|
| ``algorithm_params.embed_dim`` | 8 .. 128 (powers of 2) | around the paper's 64 |
| ``algorithm_params.hidden_dim`` | 32 .. 256 (powers of 2) | the generator's width |
| ``algorithm_params.depth`` | 1 .. 3 | hidden layers of the generator's body |
| ``algorithm_params.head_lr`` | 0.01 .. 0.5, log | the classifier step's 0.1 in the middle |

pFedHN's server hypernetwork (paper code: embedding 1 + N/4, 3 hidden layers of 100, server
SGD lr 1e-2) searches ``hidden_dim`` 50 .. 200, ``depth`` 1 .. 4 and ``server_lr`` 1e-3 .. 1e-1
(log).

HyperFL's hypernetwork has ``hidden_dim x numel(extractor)`` weights in its heads (15M at 128
for the FMNIST CNN), so ``hidden_dim`` is also the sweep's main cost and upload-size knob.
"""

from __future__ import annotations

from typing import Any

from search_spaces.base import SPACES, param_name
from search_spaces.fedavg import fedavg_space

__all__ = ["hyperfl_space", "hyperfl_lpm_space", "pfedhn_space", "pfedhn_pc_space"]


@SPACES.register("hyperfl")
def hyperfl_space(trial: Any, algorithm: str = "hyperfl") -> None:
    """HyperFL: FedAvg's knobs plus embedding size, hypernetwork width/depth, head lr."""
    fedavg_space(trial, algorithm)
    trial.suggest_categorical(
        param_name(algorithm, "algorithm_params.embed_dim"), [8, 16, 32, 64, 128]
    )
    trial.suggest_categorical(
        param_name(algorithm, "algorithm_params.hidden_dim"), [32, 64, 128, 256]
    )
    trial.suggest_int(param_name(algorithm, "algorithm_params.depth"), 1, 3)
    trial.suggest_float(param_name(algorithm, "algorithm_params.head_lr"), 0.01, 0.5, log=True)


@SPACES.register("pfedhn")
def pfedhn_space(trial: Any, algorithm: str = "pfedhn") -> None:
    """pFedHN: FedAvg's knobs plus the server hypernetwork's width, depth and learning rate."""
    fedavg_space(trial, algorithm)
    trial.suggest_int(param_name(algorithm, "algorithm_params.hidden_dim"), 50, 200, log=True)
    trial.suggest_int(param_name(algorithm, "algorithm_params.depth"), 1, 4)
    trial.suggest_float(param_name(algorithm, "algorithm_params.server_lr"), 1e-3, 1e-1, log=True)


@SPACES.register("pfedhn_pc")
def pfedhn_pc_space(trial: Any, algorithm: str = "pfedhn_pc") -> None:
    """pFedHN-PC: pFedHN's space."""
    pfedhn_space(trial, algorithm)


@SPACES.register("hyperfl_lpm")
def hyperfl_lpm_space(trial: Any, algorithm: str = "hyperfl_lpm") -> None:
    """HyperFL-LPM: HyperFL's space (the hypernetwork generates adapters instead)."""
    hyperfl_space(trial, algorithm)
