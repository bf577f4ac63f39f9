"""HyperFL's tailored attack (Guo et al., AAAI 2025, section 4.1, Eqs. 9-10, appendix D.1):
first recover the client's private embedding from the hypernetwork update, then invert the
generated feature extractor.

Stage 1, the embedding (the lower level of Eq. 9, Eq. 10). The hypernetwork's first layer is
linear in the embedding, ``a = W1 v + b1``, so its gradients are ``dL/dW1 = delta v^T`` and
``dL/db1 = delta``: every row of ``dL/dW1`` is a multiple of ``v``. The least-squares solution

    v_hat = (dL/dW1)^T (dL/db1) / |dL/db1|^2

is exact for an update of one local step (the pseudo-gradient is then exact up to a common
scale, which cancels), where the paper optimises Eq. 10 numerically. With several local steps
the embedding moves during the update and ``v_hat`` is an approximation.

Stage 2, the records (the upper level of Eq. 9). The extractor the client used is
``theta = h(v_hat; phi)``. Each generated tensor ``theta_k`` comes out of a linear head
``theta_k = W_k a + b_k`` whose bias gradient is ``dL/db_k = dL/dtheta_k``: the update carries
the extractor's gradient itself (the paper's ``Delta_theta``, which it could not obtain by
differencing generated weights; one step makes it exact). Where the paper, without
``Delta_theta``, solves this stage by model inversion (appendix D.1 cites He et al. 2019, 2020 and
others), this reads the gradient and matches it: a stronger attack than the paper's Figure 7
one, so its figures are not the paper's. The records are then recovered by IG
(cosine matching + TV, Adam, boxed) on that extractor gradient, with the private classifier
head optimised jointly from its public initial value and the labels given (no classifier bias
is uploaded, so iDLG has nothing to read).

``extra["embedding"]`` holds ``v_hat``, so an evaluation that knows the true embedding can say
how well stage 1 worked.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from flcore.attacks.base import ATTACKS, Observation, Reconstruction
from flcore.attacks.gradmatch import Problem, to_unit
from flcore.attacks.ig import IGParams, InvertingGradients, labels_for
from flcore.attacks.surface import HyperSurface, ModelSurface

__all__ = ["HyperFLTailored", "recover_embedding", "extractor_gradient"]


def recover_embedding(surface: HyperSurface, target: dict[str, torch.Tensor]) -> torch.Tensor:
    """Stage 1: the embedding from the first hypernetwork layer's gradients (least squares).
    Falls back to the public initial embedding where that layer received no gradient."""
    gw, gb = target["body.0.weight"], target["body.0.bias"]
    norm = gb.pow(2).sum()
    if float(norm) == 0.0:
        return surface.unknowns["embedding"].clone()
    return gw.t() @ gb / norm


def extractor_gradient(
    surface: HyperSurface, target: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Stage 2's target: ``dL/dtheta_k`` read off each generating head's bias gradient, keyed
    like the client network's state (``features.<name>``)."""
    hnet = surface.hnet
    return {
        f"features.{name}": target[f"heads.{i}.bias"].view(shape)
        for i, (name, shape) in enumerate(zip(hnet.names, hnet.shapes, strict=True))
    }


@ATTACKS.register("hyperfl_tailored")
class HyperFLTailored(InvertingGradients):
    """Embedding recovery from the hypernetwork update, then IG on the generated extractor."""

    name = "hyperfl_tailored"
    Params = IGParams
    algorithms = frozenset({"hyperfl", "hyperfl_lpm"})

    def reconstruct_many(self, observations: Sequence[Observation]) -> list[Reconstruction]:
        p = self.params
        assert isinstance(p, IGParams)
        first = observations[0]
        surface = first.surface
        if not isinstance(surface, HyperSurface):
            raise ValueError(
                f"hyperfl_tailored attacks a hypernetwork upload (hyperfl, hyperfl_lpm), not "
                f"{first.algorithm!r}"
            )
        labels, source = labels_for(observations)
        targets = [o.target() for o in observations]
        embeddings = [recover_embedding(surface, t) for t in targets]
        # One extractor per observation (each has its own recovered embedding), so each stage-2
        # problem is solved on its own surface.
        out = []
        for i, (obs, target, v_hat) in enumerate(
            zip(observations, targets, embeddings, strict=True)
        ):
            with torch.no_grad():
                theta = surface.generate(v_hat)
            start = {f"features.{k}": w for k, w in theta.items()}
            head = {k: v for k, v in surface.unknowns.items() if k.startswith("head.")}
            stage2 = ModelSurface(surface.model, start, unknowns=head)
            problem = Problem(
                surface=stage2,
                targets=[extractor_gradient(surface, target)],
                labels=labels[i : i + 1].to(self.device),
                shape=obs.image_shape,
                info=obs.info,
                device=self.device,
                seed=p.seed + i,
            )
            x, _ = self.solve(problem)
            out.append(
                Reconstruction(
                    to_unit(x[0], obs.info).cpu(),
                    labels[i].cpu(),
                    source,
                    p.iterations,
                    extra={"embedding": v_hat.detach().cpu()},
                )
            )
        return out
