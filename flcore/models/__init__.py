"""The papers' networks, each split into a feature extractor and a classifier head."""

from __future__ import annotations

from flcore.models import adapters as _adapters  # noqa: F401  (registers the LPM backbones)
from flcore.models import cnn as _cnn  # noqa: F401  (registers the CNNs)
from flcore.models import conv4 as _conv4  # noqa: F401  (registers the few-shot CONV4)
from flcore.models import fedhkd as _fedhkd  # noqa: F401  (registers FedHKD's networks)
from flcore.models import scalable as _scalable  # noqa: F401  (registers Pa3dFL's CNNs)
from flcore.models.base import MODELS, SplitModel, build_model

__all__ = ["MODELS", "SplitModel", "build_model"]
