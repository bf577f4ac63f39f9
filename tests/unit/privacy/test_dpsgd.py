"""DP-SGD on real FMNIST samples and the paper's CNN."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from flcore.algorithms.training import train_epochs
from flcore.data import ArrayDataset, normalize
from flcore.models import build_model
from flcore.privacy.dpsgd import DPSGD, clip_per_sample, per_sample_gradients


def _batch(fmnist, n: int = 8):  # type: ignore[no-untyped-def]
    x = normalize(fmnist.train.images[:n], fmnist.info)
    return x, fmnist.train.labels[:n]


def test_per_sample_gradients_equal_a_per_example_loop(fmnist) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = build_model("cnn_fmnist", num_classes=10, in_channels=1)
    x, y = _batch(fmnist)
    fast = per_sample_gradients(model, x, y)
    for i in range(len(y)):
        model.zero_grad()
        F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        for name, p in model.named_parameters():
            torch.testing.assert_close(fast[name][i], p.grad, rtol=1e-4, atol=1e-6)


def test_clipped_norms_stay_within_the_bound(fmnist) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(1)
    model = build_model("cnn_fmnist", num_classes=10, in_channels=1)
    x, y = _batch(fmnist, 16)
    grads = per_sample_gradients(model, x, y)
    raw_norms = torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in grads.values()))
    clip = float(raw_norms.median())  # half the samples get clipped
    assert (raw_norms > clip).any() and (raw_norms < clip).any()
    for i in range(16):
        one = {k: g[i : i + 1] for k, g in grads.items()}
        clipped = clip_per_sample(one, clip)
        norm = torch.sqrt(sum(c.pow(2).sum() for c in clipped.values()))
        assert norm <= clip * (1 + 1e-5)
        if raw_norms[i] < clip:  # unclipped samples are untouched
            torch.testing.assert_close(norm, raw_norms[i])
    total = clip_per_sample(grads, clip)
    assert torch.sqrt(sum(t.pow(2).sum() for t in total.values())) <= 16 * clip * (1 + 1e-5)


def test_poisson_batches_sample_each_record_at_rate_q() -> None:
    dp = DPSGD(1.0, 1.0, batch_size=50)
    g = torch.Generator().manual_seed(0)
    sizes = [len(b) for _ in range(50) for b in dp.batches(600, 50, g)]
    assert len(sizes) == 50 * 12  # ceil(600 / 50) steps per epoch
    assert abs(sum(sizes) / len(sizes) - 50) < 1.0  # E[batch] = q n = 50
    assert len(set(sizes)) > 5  # sizes vary: Poisson, not fixed batches


def test_noise_has_the_expected_scale(fmnist) -> None:  # type: ignore[no-untyped-def]
    """One DP-SGD step with sigma vs sigma = 0 on the same batch: the weights differ by
    lr * N(0, (sigma C)^2) / B exactly (plain SGD, q = 1 so the batch is the whole set)."""
    data = ArrayDataset(fmnist.train.images[:50], fmnist.train.labels[:50])
    sigma, clip, lr = 2.0, 0.5, 0.1
    out = {}
    for s in (0.0, sigma):
        torch.manual_seed(3)
        model = build_model("cnn_fmnist", num_classes=10, in_channels=1)
        dp = DPSGD(s, clip, batch_size=50)
        gen = torch.Generator().manual_seed(7)
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        train_epochs(
            model,
            data,
            fmnist.info,
            opt,
            epochs=1,
            batch_size=50,
            generator=gen,
            sampler=dp.batches,
            backward=dp.make_backward(50, gen),
        )
        out[s] = torch.cat([p.detach().flatten() for p in model.parameters()])
    diff = out[sigma] - out[0.0]
    expected = lr * sigma * clip / 50
    assert abs(float(diff.std()) / expected - 1) < 0.02, (float(diff.std()), expected)
    assert abs(float(diff.mean())) < 0.02 * expected


def test_dpsgd_refuses_an_objective_it_would_not_clip(fmnist) -> None:  # type: ignore[no-untyped-def]
    # per-sample gradients are of the cross-entropy: an added term would vanish silently
    data = ArrayDataset(fmnist.train.images[:20], fmnist.train.labels[:20])
    model = build_model("cnn_fmnist", num_classes=10, in_channels=1)
    dp = DPSGD(1.0, 1.0, batch_size=10)
    gen = torch.Generator().manual_seed(0)

    def with_penalty(m, x, y):  # type: ignore[no-untyped-def]
        return F.cross_entropy(m(x), y) + sum(p.pow(2).sum() for p in m.parameters())

    with pytest.raises(NotImplementedError, match="cross-entropy only"):
        train_epochs(
            model,
            data,
            fmnist.info,
            torch.optim.SGD(model.parameters(), lr=0.1),
            epochs=1,
            batch_size=10,
            generator=gen,
            sampler=dp.batches,
            backward=dp.make_backward(20, gen),
            loss_fn=with_penalty,
        )


def _latent_model():  # type: ignore[no-untyped-def]
    torch.manual_seed(4)
    return build_model("fedhkd_cnn", num_classes=10, in_channels=1, latent_dim=8)


def test_a_split_objective_at_sigma_0_and_no_clipping_is_its_plain_gradient(fmnist) -> None:  # type: ignore[no-untyped-def]
    # Prepare: a per-record term that reads the representation, a record-free term on the head;
    # every record sampled (q = 1), no noise, a clip no gradient reaches
    from flcore.privacy.dpsgd import SplitObjective, freeze_batchnorm

    model = _latent_model()
    x, y = _batch(fmnist, 12)
    anchor = torch.randn(10, 8)

    def per_record(m, xb, yb):  # type: ignore[no-untyped-def]
        h = m.represent(xb)
        return F.cross_entropy(m.head(h), yb, reduction="none") + 0.3 * (h - anchor[yb]).norm(dim=1)

    def record_free(m):  # type: ignore[no-untyped-def]
        return 0.7 * m.head(anchor).logsumexp(1).mean()

    objective = SplitObjective(per_record, record_free)
    dp = DPSGD(0.0, 1e9, batch_size=12)
    # Execute: DP-SGD's gradient, then the plain one of the same objective (BN frozen in both)
    model.train()
    dp.make_backward(12, torch.Generator().manual_seed(0))(model, x, y, objective)
    private = {k: p.grad.clone() for k, p in model.named_parameters()}
    assert not model.features.norm.training  # DP-SGD froze the latent's BatchNorm
    model.zero_grad()
    model.train()
    freeze_batchnorm(model)
    objective(model, x, y).backward()
    # Assert: the same gradient, the record-free term included
    for k, p in model.named_parameters():
        torch.testing.assert_close(private[k], p.grad, rtol=1e-4, atol=1e-6)
    assert private["head.weight"].abs().sum() > 0


def test_dpsgd_leaves_batchnorm_running_statistics_untouched(fmnist) -> None:  # type: ignore[no-untyped-def]
    # running statistics from the records would leave the client unnoised with the model
    model = _latent_model()
    before = {k: b.clone() for k, b in model.named_buffers()}
    data = ArrayDataset(fmnist.train.images[:64], fmnist.train.labels[:64])
    dp = DPSGD(1.0, 1.0, batch_size=16)
    gen = torch.Generator().manual_seed(0)
    train_epochs(
        model,
        data,
        fmnist.info,
        torch.optim.SGD(model.parameters(), lr=0.1),
        epochs=1,
        batch_size=16,
        generator=gen,
        sampler=dp.batches,
        backward=dp.make_backward(64, gen),
    )
    for k, b in model.named_buffers():
        torch.testing.assert_close(b, before[k], rtol=0, atol=0)
    # while plain training moves them: the check above can fail
    train_epochs(
        model,
        data,
        fmnist.info,
        torch.optim.SGD(model.parameters(), lr=0.1),
        epochs=1,
        batch_size=16,
        generator=gen,
    )
    assert not torch.equal(model.features.norm.running_mean, before["features.norm.running_mean"])
