"""Frozen pretrained backbones with trainable adapters, for HyperFL-LPM (Guo et al., AAAI 2025,
section 3.3 and appendix D.1) and its Table 2 baselines.

- ``resnet18_adapter``: torchvision's ResNet-18 with a residual bottleneck adapter (1x1 conv
  down to ``channels / reduction``, ReLU, 1x1 conv up) behind each of its 8 residual blocks
  ("the adapter is inserted behind each resnet block"; the paper gives no ResNet adapter's
  form, this one borrows its transformer adapter's; the authors' code has one per stage, BN
  and a 1x1 conv).
- ``vit_s16_adapter``: timm's ViT-S/16 with a bottleneck adapter (Linear down to
  ``adapter_dim``, ReLU, Linear up, residual) behind each of its 12 transformer blocks, on the
  residual stream. Appendix D.1 puts the adapter "within each transformer block" (the authors'
  code: on the MLP branch, width 24, with a LayerNorm): ours sits after the block, width 64, a
  deviation.

Each is a :class:`SplitModel`: ``features`` is the backbone with its adapters (parameters whose
names contain ``adapter``; everything else is frozen), ``head`` a linear classifier. Inputs are
resized to ``image_size`` and grey images repeated to 3 channels. The frozen backbone's
BatchNorm layers stay in eval mode in training too.

Pretrained weights (``pretrained``):
- ``false`` (default): random initialisation (what the tests use);
- ``true``: the library's ImageNet weights: torchvision's ``ResNet18_Weights.IMAGENET1K_V1``,
  timm's ``vit_small_patch16_224`` (augreg, in21k fine-tuned on in1k). torchvision looks for the
  file in ``$TORCH_HOME/hub/checkpoints`` (default ``~/.cache/torch/hub/checkpoints``), timm in
  the Hugging Face cache (``$HF_HOME``, default ``~/.cache/huggingface``); both download when
  the file is missing and the network is reachable;
- a path: a backbone ``state_dict`` saved with ``torch.save`` (the library's key names), for
  offline machines.

``tiny: true`` builds a small backbone of the same design (ResNet: 16 base channels and one
block per stage; ViT: 2 blocks of width 48) for tests and smoke runs.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from flcore.errors import ConfigError
from flcore.models.base import MODELS, SplitModel

__all__ = ["ResNet18Adapter", "ViTS16Adapter", "ConvAdapter", "BottleneckAdapter"]


class ConvAdapter(nn.Module):
    """``x + up(relu(down(x)))`` with 1x1 convolutions (the up-projection starts at zero)."""

    def __init__(self, channels: int, hidden: int) -> None:
        super().__init__()
        self.down = nn.Conv2d(channels, hidden, 1)
        self.up = nn.Conv2d(hidden, channels, 1)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.up(F.relu(self.down(x)))


class BottleneckAdapter(nn.Module):
    """``x + up(relu(down(x)))`` over the last dimension (the up-projection starts at zero)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.down = nn.Linear(dim, hidden)
        self.up = nn.Linear(hidden, dim)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.up(F.relu(self.down(x)))


class _Adapted(nn.Sequential):
    """A backbone block followed by its adapter (``block``, ``adapter``)."""

    def __init__(self, block: nn.Module, adapter: nn.Module) -> None:
        super().__init__()
        self.block = block
        self.adapter = adapter


def _load(backbone: nn.Module, pretrained: bool | str, library_weights) -> None:  # type: ignore[no-untyped-def]
    if pretrained is False or pretrained is None:
        return
    if pretrained is True:
        try:
            state = library_weights()
        except Exception as exc:  # network or cache problems, reported with where to look
            raise ConfigError(
                "model_params.pretrained",
                f"could not get the library's pretrained weights ({exc}); put the file in the "
                "library's cache (see flcore/models/adapters.py) or give a path to a state_dict",
            ) from None
    else:
        path = Path(str(pretrained)).expanduser()
        if not path.is_file():
            raise ConfigError("model_params.pretrained", f"no weights file at {path}")
        state = torch.load(path, map_location="cpu", weights_only=True)
    missing, unexpected = backbone.load_state_dict(state, strict=False)
    wanted = [k for k in missing if not k.startswith(("fc.", "head."))]
    if wanted:
        raise ConfigError(
            "model_params.pretrained", f"the weights lack {len(wanted)} tensors, e.g. {wanted[0]}"
        )


class _FrozenBackbone(SplitModel):
    """Freezes every feature parameter except the adapters', and keeps BatchNorm in eval."""

    def _freeze(self) -> None:
        for name, p in self.features.named_parameters():
            p.requires_grad_("adapter" in name)

    def train(self, mode: bool = True) -> _FrozenBackbone:
        super().train(mode)
        for m in self.features.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.eval()
        return self

    def adapter_keys(self) -> list[str]:
        """State-dict keys of the adapters (what HyperFL-LPM generates)."""
        return [f"features.{k}" for k, _ in self.features.named_parameters() if "adapter" in k]


class _Input(nn.Module):
    def __init__(self, image_size: int) -> None:
        super().__init__()
        self.image_size = image_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        if x.shape[-1] != self.image_size or x.shape[-2] != self.image_size:
            x = F.interpolate(x, size=(self.image_size, self.image_size), mode="bilinear")
        return x


@MODELS.register("resnet18_adapter")
class ResNet18Adapter(_FrozenBackbone):
    """ResNet-18 (frozen) with a conv adapter behind each residual block."""

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 3,
        *,
        reduction: int = 4,
        image_size: int = 32,
        pretrained: bool | str = False,
        tiny: bool = False,
    ) -> None:
        super().__init__()
        from torchvision.models import ResNet18_Weights, resnet18

        net = _narrow_resnet(16) if tiny else resnet18(weights=None)
        weights = ResNet18_Weights.IMAGENET1K_V1
        _load(net, pretrained, lambda: weights.get_state_dict(progress=False))
        stages: list[nn.Module] = [_Input(image_size), net.conv1, net.bn1, net.relu, net.maxpool]
        for layer in (net.layer1, net.layer2, net.layer3, net.layer4):
            for block in layer:
                c = block.conv2.out_channels
                stages.append(_Adapted(block, ConvAdapter(c, max(1, c // reduction))))
        stages += [net.avgpool, nn.Flatten()]
        self.features = nn.Sequential(*stages)
        self.head = nn.Linear(net.fc.in_features, num_classes)
        self._freeze()


def _narrow_resnet(base: int) -> nn.Module:
    """A ResNet-18-shaped network with one BasicBlock per stage and ``base`` channels."""
    from torchvision.models.resnet import BasicBlock, ResNet

    net = ResNet(BasicBlock, [1, 1, 1, 1], width_per_group=64)
    # rebuild the stages at the narrow width
    net.inplanes = base
    net.conv1 = nn.Conv2d(3, base, kernel_size=7, stride=2, padding=3, bias=False)
    net.bn1 = nn.BatchNorm2d(base)
    net.layer1 = net._make_layer(BasicBlock, base, 1)
    net.layer2 = net._make_layer(BasicBlock, base * 2, 1, stride=2)
    net.layer3 = net._make_layer(BasicBlock, base * 4, 1, stride=2)
    net.layer4 = net._make_layer(BasicBlock, base * 8, 1, stride=2)
    net.fc = nn.Linear(base * 8, 1000)
    return net


@MODELS.register("vit_s16_adapter")
class ViTS16Adapter(_FrozenBackbone):
    """ViT-S/16 (frozen) with a bottleneck adapter behind each transformer block."""

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 3,
        *,
        adapter_dim: int = 64,
        image_size: int = 224,
        pretrained: bool | str = False,
        tiny: bool = False,
    ) -> None:
        super().__init__()
        import timm

        kw = {"num_classes": 0, "img_size": image_size}
        if tiny:
            kw |= {"depth": 2, "embed_dim": 48, "num_heads": 2}
        vit = timm.create_model("vit_small_patch16_224", pretrained=False, **kw)
        _load(vit, pretrained, lambda: _timm_weights(image_size))
        vit.blocks = nn.Sequential(
            *(_Adapted(b, BottleneckAdapter(vit.num_features, adapter_dim)) for b in vit.blocks)
        )
        self.features = nn.Sequential(_Input(image_size), vit)
        self.head = nn.Linear(vit.num_features, num_classes)
        self._freeze()


def _timm_weights(image_size: int) -> dict[str, torch.Tensor]:
    import timm

    model = timm.create_model(
        "vit_small_patch16_224", pretrained=True, num_classes=0, img_size=image_size
    )
    return model.state_dict()
