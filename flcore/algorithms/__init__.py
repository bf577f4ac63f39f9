"""FL algorithms, one file each, found through the ``ALGORITHMS`` registry."""

from __future__ import annotations

from flcore.algorithms import centaur as _centaur  # noqa: F401  (registers)
from flcore.algorithms import ditto as _ditto  # noqa: F401  (registers)
from flcore.algorithms import dp_fedavg as _dp_fedavg  # noqa: F401  (registers)
from flcore.algorithms import dp_fedavg_client as _dp_fedavg_client  # noqa: F401  (registers)
from flcore.algorithms import fedalign as _fedalign  # noqa: F401  (registers)
from flcore.algorithms import fedavg as _fedavg  # noqa: F401  (registers)
from flcore.algorithms import fedgen as _fedgen  # noqa: F401  (registers)
from flcore.algorithms import fedhkd as _fedhkd  # noqa: F401  (registers)
from flcore.algorithms import fedmd as _fedmd  # noqa: F401  (registers)
from flcore.algorithms import fedproto as _fedproto  # noqa: F401  (registers)
from flcore.algorithms import fedprox as _fedprox  # noqa: F401  (registers)
from flcore.algorithms import hyperfl as _hyperfl  # noqa: F401  (registers)
from flcore.algorithms import hyperfl_lpm as _hyperfl_lpm  # noqa: F401  (registers)
from flcore.algorithms import lg_fedavg as _lg_fedavg  # noqa: F401  (registers)
from flcore.algorithms import local as _local  # noqa: F401  (registers)
from flcore.algorithms import meta as _meta  # noqa: F401  (registers the meta-learning family)
from flcore.algorithms import moon as _moon  # noqa: F401  (registers)
from flcore.algorithms import pfedhn as _pfedhn  # noqa: F401  (registers)
from flcore.algorithms import pfedhn_pc as _pfedhn_pc  # noqa: F401  (registers)
from flcore.algorithms import ppsgd as _ppsgd  # noqa: F401  (registers)
from flcore.algorithms import widths as _widths  # noqa: F401  (registers the capacity family)
from flcore.algorithms.base import (
    ALGORITHMS,
    Algorithm,
    AlgorithmParams,
    ClientData,
    ClientResult,
    ClientTask,
    LocalTraining,
    ModelSpec,
    tensor_bytes,
)

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "AlgorithmParams",
    "ClientData",
    "ClientResult",
    "ClientTask",
    "LocalTraining",
    "ModelSpec",
    "tensor_bytes",
]
