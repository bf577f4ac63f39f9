"""Leakage metrics on real FMNIST images: PSNR and SSIM per image as scikit-image computes them,
LPIPS only with torchvision's real AlexNet weights, and batch matching."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch
from skimage.metrics import peak_signal_noise_ratio as sk_psnr
from skimage.metrics import structural_similarity as sk_ssim

from flcore.attacks import metrics
from flcore.attacks.metrics import LPIPS, match_to_truth, psnr, ssim
from flcore.data import DatasetSplits


@pytest.fixture(scope="module")
def pairs(fmnist: DatasetSplits) -> tuple[torch.Tensor, torch.Tensor]:
    """Known pairs: 6 real images against noisy, shifted, darkened and unrelated versions."""
    truth = fmnist.test.images[:6].float() / 255
    g = torch.Generator().manual_seed(0)
    noisy = (truth + 0.1 * torch.randn(truth.shape, generator=g)).clamp(0, 1)
    other = fmnist.test.images[100:106].float() / 255
    recon = torch.cat([noisy[:2], torch.roll(truth[2:4], 1, dims=-1), 0.7 * truth[4:5], other[5:6]])
    return recon, truth


def test_psnr_is_per_image_as_scikit_image(pairs) -> None:  # type: ignore[no-untyped-def]
    recon, truth = pairs
    ours = psnr(recon, truth)
    ref = [
        sk_psnr(t[0].numpy(), r[0].numpy(), data_range=1) for r, t in zip(recon, truth, strict=True)
    ]
    np.testing.assert_allclose(ours.numpy(), ref, rtol=1e-5)
    # the mean of per-image PSNRs, not one PSNR of the pooled batch (torchmetrics' default)
    from torchmetrics.functional.image import peak_signal_noise_ratio

    pooled = float(peak_signal_noise_ratio(recon, truth, data_range=1.0))
    assert abs(float(ours.mean()) - pooled) > 0.5


def test_ssim_matches_scikit_image_gaussian_window(pairs) -> None:  # type: ignore[no-untyped-def]
    recon, truth = pairs
    ours = ssim(recon, truth)
    ref = [
        sk_ssim(
            t[0].numpy().astype(np.float64),
            r[0].numpy().astype(np.float64),
            gaussian_weights=True,
            sigma=1.5,
            use_sample_covariance=False,
            data_range=1,
        )
        for r, t in zip(recon, truth, strict=True)
    ]
    np.testing.assert_allclose(ours.numpy(), ref, atol=1e-5)
    assert float(ssim(truth, truth).min()) == pytest.approx(1.0)


def test_metrics_reject_mismatched_batches(pairs) -> None:  # type: ignore[no-untyped-def]
    recon, truth = pairs
    with pytest.raises(ValueError, match="one shape"):
        psnr(recon[:2], truth)


def test_lpips_is_absent_without_the_alexnet_weights(tmp_path: Path, pairs) -> None:  # type: ignore[no-untyped-def]
    lp = LPIPS(hub_dir=tmp_path)
    assert not lp.available
    assert "alexnet-owt-7be5be79.pth" in lp.reason and "not reported" in lp.reason
    assert lp(*pairs) is None


def _fake_alexnet(hub: Path) -> Path:
    import torchvision

    path = hub / "checkpoints" / metrics.ALEXNET_FILE
    path.parent.mkdir(parents=True)
    torch.manual_seed(0)
    torch.save(torchvision.models.alexnet().state_dict(), path)
    return path


def test_lpips_refuses_a_file_that_is_not_torchvisions_weights(tmp_path: Path, pairs) -> None:  # type: ignore[no-untyped-def]
    """A random-backbone LPIPS is never reported: the file must be the real one."""
    _fake_alexnet(tmp_path)
    lp = LPIPS(hub_dir=tmp_path)
    assert not lp.available and "sha256" in lp.reason
    assert lp(*pairs) is None


def test_lpips_computes_with_the_package_on_accepted_weights(
    tmp_path: Path, pairs, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """The loading and preprocessing path, with the checksum check pointed at a stand-in file
    (the real weights cannot be had offline): the lpips package's own network on the same
    weights, fed 64x64 3-channel [-1, 1] images, gives the same distances."""
    import lpips
    import torch.nn.functional as F

    path = _fake_alexnet(tmp_path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    monkeypatch.setattr(metrics, "_ALEXNET_SHA256_PREFIX", digest[:8])
    lp = LPIPS(hub_dir=tmp_path)
    assert lp.available
    recon, truth = pairs
    ours = lp(recon, truth)
    ref_net = lpips.LPIPS(net="alex", pnet_rand=True, verbose=False)
    state = torch.load(path, weights_only=True)
    for name, p in ref_net.net.named_parameters():
        _, idx, kind = name.split(".")
        p.data.copy_(state[f"features.{idx}.{kind}"])

    def prep(x: torch.Tensor) -> torch.Tensor:
        x = F.interpolate(x, size=(64, 64), mode="bilinear", align_corners=False)
        return x.repeat(1, 3, 1, 1) * 2 - 1

    with torch.no_grad():
        ref = ref_net.eval()(prep(recon), prep(truth)).flatten()
    torch.testing.assert_close(ours, ref)
    assert float(lp(truth, truth).abs().max()) < 1e-6


def test_batches_are_matched_to_the_truth_before_scoring(pairs) -> None:  # type: ignore[no-untyped-def]
    _, truth = pairs
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    shuffled = truth[perm]
    order = match_to_truth(shuffled, truth)
    assert torch.equal(shuffled[order], truth)
