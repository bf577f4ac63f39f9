"""DLG, "Deep Leakage from Gradients": Zhu, Liu & Han, NeurIPS 2019, with iDLG's label
recovery (Zhao, Mopuri & Bilen 2020).

Finds records whose gradient equals the observed one in L2,

    min_x  sum_k |grad_k(x) - g*_k|^2,

with L-BFGS from random images (the paper's optimiser), the labels recovered by iDLG from the
classifier bias's gradient when it is uploaded (else taken as given, and then the paper's soft
dummy labels are not needed). Unknown client-side tensors are optimised jointly. Unlike IG the
loss depends on the gradient's scale, so DLG suits one-step uploads, whose pseudo-gradient is
exact. ``iterations`` counts L-BFGS steps of up to ``max_iter`` evaluations each (torch's and
the paper's code's defaults: 300 x 20); the images with the lowest loss seen are returned.
Each observation is solved on its own: L-BFGS's line search would couple a batch.
"""

from __future__ import annotations

import torch
from pydantic import Field

from flcore.attacks.base import ATTACKS, Attack, AttackParams, Observation, Reconstruction
from flcore.attacks.gradmatch import Problem, l2_distance, to_unit, without_onednn
from flcore.attacks.ig import labels_for

__all__ = ["DeepLeakage", "DLGParams"]


class DLGParams(AttackParams):
    iterations: int = Field(300, ge=1, description="L-BFGS iterations (the paper's 300)")
    lr: float = Field(1.0, gt=0, description="L-BFGS step size")
    history: int = Field(100, ge=1, description="L-BFGS history size")
    max_iter: int = Field(20, ge=1, description="L-BFGS inner iterations per step (torch's 20)")


@ATTACKS.register("dlg")
class DeepLeakage(Attack):
    """L2 gradient matching with L-BFGS (Zhu et al. 2019), iDLG labels."""

    name = "dlg"
    Params = DLGParams

    def reconstruct(self, observation: Observation) -> Reconstruction:
        p = self.params
        assert isinstance(p, DLGParams)
        labels, source = labels_for([observation])
        problem = Problem(
            surface=observation.surface,
            targets=[observation.target()],
            labels=labels.to(self.device),
            shape=observation.image_shape,
            info=observation.info,
            device=self.device,
            seed=p.seed,
        )
        x, unknowns = problem.initial()
        opt = torch.optim.LBFGS(
            [x, *unknowns.values()], lr=p.lr, history_size=p.history, max_iter=p.max_iter
        )

        def closure() -> torch.Tensor:
            opt.zero_grad(set_to_none=True)
            loss = problem.loss(x, unknowns, l2_distance, 0.0)
            loss.backward()
            return loss

        best, best_loss = x.detach().clone(), float("inf")
        with without_onednn():
            for _ in range(p.iterations + 1):
                before = x.detach().clone()
                # the last pass only measures the final images (step returns the loss it
                # started from); L-BFGS can overshoot, so the best finite images are kept
                loss = float(opt.step(closure).detach())
                if loss < best_loss:
                    best, best_loss = before, loss
                if not torch.isfinite(x).all():
                    break
        images = to_unit(best[0], observation.info).cpu()
        return Reconstruction(images, labels[0].cpu(), source, p.iterations)
