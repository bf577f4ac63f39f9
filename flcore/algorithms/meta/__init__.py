"""The meta-learning family over few-shot clients (LoDMeta, Yang & Kwok): shared parts
(graph.py: graphs and random walks; maml.py: MAML's loops; base.py: the meta-model and its
evaluation) and one file per algorithm, registered on import."""

from __future__ import annotations

from flcore.algorithms.meta import fedalt as _fedalt  # noqa: F401  (registers)
from flcore.algorithms.meta import fedmaml as _fedmaml  # noqa: F401  (registers)
from flcore.algorithms.meta import l2c as _l2c  # noqa: F401  (registers)
from flcore.algorithms.meta import lodmeta as _lodmeta  # noqa: F401  (registers)
