"""flcore: the federated-learning core of FedSweep, in pure PyTorch.

It never imports ray, optuna or mlflow (an import-linter contract and a test enforce this);
logging backends plug in through :mod:`flcore.callbacks`.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
