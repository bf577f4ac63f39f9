"""IG, "Inverting Gradients": Geiping, Bauermeister, Droge & Moeller, "Inverting Gradients - How
easy is it to break privacy in federated learning?", NeurIPS 2020.

Finds records whose gradient points the way the observed one does:

    min_x  1 - <grad(x), g*> / (|grad(x)| |g*|)  +  tv * TV(x)

over all uploaded tensors jointly, with Adam (lr 0.1) decayed x0.1 at 3/8, 5/8 and 7/8 of the
iterations, the sign of the image gradient (``signed``, as the paper's code), and the images
boxed to the valid pixel range after every step. HyperFL's protocol (appendix D.1): 10,000
iterations, TV weight 1e-6, batch size 1; its unknown client-side tensors (embedding, head) are
optimised jointly with the images, from their public initial values.

Labels are recovered by iDLG when the classifier's bias is uploaded, else taken as given.
Reconstructions of several uploads are optimised together (``reconstruct_many``).

A long optimisation can be resumed (HyperFL's 10,000 iterations take hours on a CPU): with
``resume_dir`` set on the attack (an execution option, not a parameter), the loop saves its
state there (images, unknowns, Adam's and the schedule's state, the iteration) at most every
``save_seconds``, in a file named by a digest of the problem and the parameters, and a later
run of the same problem continues from it; the result equals an uninterrupted run's.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from pydantic import Field

from flcore.attacks.base import ATTACKS, Attack, AttackParams, Observation, Reconstruction
from flcore.attacks.gradmatch import (
    Problem,
    cosine_distance,
    idlg_labels,
    pixel_box,
    to_unit,
    without_onednn,
)

__all__ = ["InvertingGradients", "IGParams", "labels_for"]


class IGParams(AttackParams):
    tv: float = Field(1e-6, ge=0, description="total-variation weight")
    signed: bool = Field(True, description="step on the sign of the image gradient")
    boxed: bool = Field(True, description="clamp images to the valid pixel range")
    unknown_lr: float = Field(0.1, gt=0, description="Adam step of the unknown private tensors")


def labels_for(observations: Sequence[Observation]) -> tuple[torch.Tensor, str]:
    """The labels an attack uses: iDLG's where every upload gives them away (one record each),
    else the given ones. Raises when neither is possible."""
    recovered = []
    for o in observations:
        can = o.recover_labels and o.num_records == 1
        lab = idlg_labels(o.surface, o.target()) if can else None
        if lab is None:
            break
        recovered.append(lab)
    else:
        return torch.stack(recovered), "idlg"
    if any(o.labels is None for o in observations):
        raise ValueError(
            "the labels cannot be recovered from this upload (the classifier is not uploaded, "
            "or the update has several records) and none were given"
        )
    return torch.stack([o.labels for o in observations]), "given"  # type: ignore[misc]


def problem_digest(problem: Problem, **params: object) -> str:
    """A digest of what an optimisation depends on: the targets, labels, shape, seed, the
    records the attacker knows (two records of one step share its target) and ``params`` (a
    saved state is resumed only by the same problem)."""
    h = hashlib.sha256(repr(sorted(params.items())).encode())
    h.update(repr((tuple(problem.shape), problem.seed, sorted(problem.surface.unknowns))).encode())
    h.update(problem.labels.detach().cpu().numpy().tobytes())
    known = problem.surface.known
    tensors = [("known", t) for batch in known or () for t in batch]
    for t in problem.targets:
        tensors += sorted(t.items())
    for k, t in tensors:
        v = t.detach().to("cpu").contiguous()
        h.update(f"{k}:{v.dtype}:{tuple(v.shape)}".encode())
        h.update(v.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:24]


def run_adam(
    problem: Problem,
    *,
    iterations: int,
    lr: float,
    unknown_lr: float,
    tv: float,
    signed: bool,
    boxed: bool,
    distance=cosine_distance,  # type: ignore[no-untyped-def]
    resume: Path | None = None,
    save_seconds: float = 60.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Geiping et al.'s optimisation loop; returns the normalised images and the unknowns.

    ``resume``: a state file this loop writes at most every ``save_seconds`` (atomically) and
    continues from when it exists; left in place at the end, so the same problem solved again
    returns the same images at once (remove the file, or its folder, to optimise afresh)."""
    x, unknowns = problem.initial()
    groups = [{"params": [x], "lr": lr}]
    if unknowns:
        groups.append({"params": list(unknowns.values()), "lr": unknown_lr})
    opt = torch.optim.Adam(groups)
    milestones = [int(iterations * f) for f in (3 / 8, 5 / 8, 7 / 8)]
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=milestones, gamma=0.1)
    lo, hi = pixel_box(problem.info, problem.device)
    done = 0
    if resume is not None and resume.is_file():
        state = torch.load(resume, map_location=problem.device, weights_only=False)
        with torch.no_grad():
            x.copy_(state["x"])
            for k, v in unknowns.items():
                v.copy_(state["unknowns"][k])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        done = int(state["iteration"])
    saved = time.monotonic()

    def save(iteration: int) -> None:
        assert resume is not None
        tmp = resume.with_name(resume.name + ".tmp")
        torch.save(
            {
                "iteration": iteration,
                "x": x.detach(),
                "unknowns": {k: v.detach() for k, v in unknowns.items()},
                "opt": opt.state_dict(),
                "sched": sched.state_dict(),
            },
            tmp,
        )
        os.replace(tmp, resume)

    with without_onednn():
        for it in range(done, iterations):
            opt.zero_grad(set_to_none=True)
            problem.loss(x, unknowns, distance, tv).backward()
            if signed:
                x.grad.sign_()
            opt.step()
            sched.step()
            if boxed:
                with torch.no_grad():
                    x.copy_(torch.maximum(torch.minimum(x, hi), lo))
            if resume is not None and time.monotonic() - saved >= save_seconds:
                save(it + 1)
                saved = time.monotonic()
    if resume is not None and done < iterations:
        save(iterations)
    return x.detach(), {k: v.detach() for k, v in unknowns.items()}


@ATTACKS.register("ig")
class InvertingGradients(Attack):
    """Cosine gradient matching with total variation (Geiping et al. 2020)."""

    name = "ig"
    Params = IGParams

    def reconstruct(self, observation: Observation) -> Reconstruction:
        return self.reconstruct_many([observation])[0]

    #: where the optimisation saves its state to be resumed (module doc); None: not saved
    resume_dir: Path | None = None

    def solve(self, problem: Problem) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Run the IG optimisation on ``problem`` with this attack's parameters."""
        p = self.params
        assert isinstance(p, IGParams)
        settings = {
            "iterations": p.iterations,
            "lr": p.lr,
            "unknown_lr": p.unknown_lr,
            "tv": p.tv,
            "signed": p.signed,
            "boxed": p.boxed,
        }
        resume = None
        if self.resume_dir is not None:
            self.resume_dir.mkdir(parents=True, exist_ok=True)
            digest = problem_digest(problem, attack=self.name, **settings)
            resume = self.resume_dir / f"{self.name}-{digest}.pt"
        return run_adam(problem, **settings, resume=resume)  # type: ignore[arg-type]

    def reconstruct_many(self, observations: Sequence[Observation]) -> list[Reconstruction]:
        p = self.params
        assert isinstance(p, IGParams)
        first = observations[0]
        labels, source = labels_for(observations)
        problem = Problem(
            surface=first.surface,
            targets=[o.target() for o in observations],
            labels=labels.to(self.device),
            shape=first.image_shape,
            info=first.info,
            device=self.device,
            seed=p.seed,
        )
        x, _ = self.solve(problem)
        return [
            Reconstruction(to_unit(x[i], first.info).cpu(), labels[i].cpu(), source, p.iterations)
            for i in range(len(observations))
        ]
