"""Capacity-heterogeneous algorithms (Pa3dFL and its width-scaling baselines) and the parts they
share: width slicing of a full model, decomposed layers. Each algorithm is one file here,
registered in ``ALGORITHMS`` when this package is imported."""

from __future__ import annotations

from flcore.algorithms.widths import fedrolex as _fedrolex  # noqa: F401  (registers)
from flcore.algorithms.widths import fjord as _fjord  # noqa: F401  (registers)
from flcore.algorithms.widths import flanc as _flanc  # noqa: F401  (registers)
from flcore.algorithms.widths import heterofl as _heterofl  # noqa: F401  (registers)
from flcore.algorithms.widths import pa3dfl as _pa3dfl  # noqa: F401  (registers)
from flcore.algorithms.widths import pfedgate as _pfedgate  # noqa: F401  (registers)
from flcore.algorithms.widths import tailorfl as _tailorfl  # noqa: F401  (registers)
