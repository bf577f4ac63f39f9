"""Leakage metrics of reconstructed images, on de-normalized ``[0, 1]`` images, per image.

- PSNR: ``10 log10(1 / MSE)`` of each image (data range 1), from torchmetrics with the
  reduction over each image's pixels only; torchmetrics' default pools the whole batch into
  one MSE, which is not the mean of per-image PSNRs.
- SSIM: torchmetrics' Gaussian-window SSIM (sigma 1.5, 11 taps, K1 0.01, K2 0.03, data range 1)
  with the map cropped by the window radius before averaging, which is what scikit-image's
  ``structural_similarity(gaussian_weights=True, sigma=1.5, use_sample_covariance=False,
  data_range=1)`` computes (torchmetrics averages the uncropped, reflect-padded map: on 28x28
  images that differs by about 0.005).
- LPIPS (Zhang et al. 2018, AlexNet): the ``lpips`` package's linear heads over torchvision's
  ImageNet AlexNet. The AlexNet weights must be torchvision's file
  (``alexnet-owt-7be5be79.pth`` under ``torch.hub.get_dir()/checkpoints``, i.e.
  ``$TORCH_HOME/hub/checkpoints``), checked against the sha256 prefix in its name; without it
  the metric is absent and :attr:`LPIPS.reason` says why. A random-backbone LPIPS is never
  computed. Images are resized to 64x64 (AlexNet cannot take 28x28), grey is repeated to 3
  channels and values are scaled to ``[-1, 1]``, as the package expects.

A reconstructed batch is matched to the originals (Hungarian assignment on MSE) before scoring,
so a batch attack that recovers the right images in another order is scored fairly. The
assignment reads the originals, which no attacker has: each original gets the closest of the
batch's outputs, so at ``attack.batch`` > 1 the scores (and the calibrated gains and
identification built on them) lean toward the attack, and an attack that recovers nothing can
score a little above its baseline and chance. The no-information guesses are per record and are
not matched. At ``batch`` 1 (the default, the papers' protocol) nothing is assigned.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["psnr", "ssim", "LPIPS", "match_to_truth", "ALEXNET_FILE"]

ALEXNET_FILE = "alexnet-owt-7be5be79.pth"
_ALEXNET_SHA256_PREFIX = "7be5be79"
_SSIM_SIGMA = 1.5
_SSIM_RADIUS = int(3.5 * _SSIM_SIGMA + 0.5)  # scikit-image's window: truncate 3.5 -> 11 taps


def _check(recon: torch.Tensor, truth: torch.Tensor) -> None:
    if recon.shape != truth.shape or recon.dim() != 4:
        raise ValueError(
            f"expected two [N, C, H, W] batches of one shape, got {tuple(recon.shape)} "
            f"and {tuple(truth.shape)}"
        )


def psnr(recon: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Per-image PSNR in dB of ``[0, 1]`` images (``inf`` for an exact copy)."""
    from torchmetrics.functional.image import peak_signal_noise_ratio

    _check(recon, truth)
    return peak_signal_noise_ratio(
        recon.double(), truth.double(), data_range=1.0, reduction="none", dim=(1, 2, 3)
    ).float()


def ssim(recon: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Per-image SSIM of ``[0, 1]`` images, as scikit-image computes it (see module doc)."""
    from torchmetrics.functional.image import structural_similarity_index_measure

    _check(recon, truth)
    r = _SSIM_RADIUS
    if min(recon.shape[-2:]) <= 2 * r:
        raise ValueError(f"SSIM needs images larger than {2 * r + 1} pixels a side")
    _, full = structural_similarity_index_measure(
        recon.double(),
        truth.double(),
        gaussian_kernel=True,
        sigma=_SSIM_SIGMA,
        data_range=1.0,
        k1=0.01,
        k2=0.03,
        reduction="none",
        return_full_image=True,
    )
    return full[..., r:-r, r:-r].mean(dim=(1, 2, 3)).float()


class LPIPS:
    """LPIPS with the AlexNet backbone, available only with torchvision's real weights.

    Args:
        hub_dir: where torch looks for checkpoints (default ``torch.hub.get_dir()``).
    """

    def __init__(self, hub_dir: str | Path | None = None) -> None:
        hub = Path(hub_dir) if hub_dir is not None else Path(torch.hub.get_dir())
        self.weights = hub / "checkpoints" / ALEXNET_FILE
        self.reason: str | None = None
        self._net: torch.nn.Module | None = None
        if not self.weights.is_file():
            self.reason = (
                f"LPIPS needs torchvision's ImageNet AlexNet weights at {self.weights} "
                "(set TORCH_HOME, or copy the file there); none were found, so LPIPS is not "
                "reported"
            )
        elif not _sha256(self.weights).startswith(_ALEXNET_SHA256_PREFIX):
            self.reason = (
                f"{self.weights} is not torchvision's AlexNet weights file (sha256 does not "
                f"start with {_ALEXNET_SHA256_PREFIX}); LPIPS is not reported"
            )

    @property
    def available(self) -> bool:
        return self.reason is None

    def _model(self) -> torch.nn.Module:
        if self._net is None:
            import warnings

            try:
                import lpips
            except ImportError as exc:  # pragma: no cover - a dependency
                raise ImportError("LPIPS needs the lpips package: pip install lpips") from exc
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                # The backbone is built empty and filled from the checked file below: the
                # package's own loader would try to download it.
                net = lpips.LPIPS(net="alex", pnet_rand=True, verbose=False)
            state = torch.load(self.weights, map_location="cpu", weights_only=True)
            mapped = {}
            for name, _ in net.net.named_parameters():  # slice1.0.weight -> features.0.weight
                _, idx, kind = name.split(".")
                mapped[name] = state[f"features.{idx}.{kind}"]
            net.net.load_state_dict(mapped)
            self._net = net.eval()
        return self._net

    @torch.no_grad()
    def __call__(self, recon: torch.Tensor, truth: torch.Tensor) -> torch.Tensor | None:
        """Per-image LPIPS distance, or None where the metric is not available."""
        _check(recon, truth)
        if not self.available:
            return None

        def prep(x: torch.Tensor) -> torch.Tensor:
            x = F.interpolate(x.float(), size=(64, 64), mode="bilinear", align_corners=False)
            if x.shape[1] == 1:
                x = x.repeat(1, 3, 1, 1)
            return x * 2 - 1

        return self._model()(prep(recon), prep(truth)).flatten()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def match_to_truth(recon: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Indices ``p`` such that ``recon[p[i]]`` is the reconstruction matched to ``truth[i]``
    (minimum total MSE, Hungarian assignment)."""
    from scipy.optimize import linear_sum_assignment

    _check(recon, truth)
    cost = torch.cdist(truth.flatten(1).double(), recon.flatten(1).double()).pow(2).numpy()
    rows, cols = linear_sum_assignment(cost)
    order = np.empty(len(rows), dtype=np.int64)
    order[rows] = cols
    return torch.from_numpy(order)
