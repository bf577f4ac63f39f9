"""Capacity-heterogeneous algorithms (Pa3dFL and its width-scaling baselines) and the parts they
share: width slicing of a full model, decomposed layers. Each algorithm is one file here,
registered in ``ALGORITHMS`` when this package is imported."""

from __future__ import annotations
