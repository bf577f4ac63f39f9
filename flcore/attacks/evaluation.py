"""The privacy evaluation any experiment (and so any sweep trial) can run: HyperFL's protocol.

At each chosen round, for each chosen client, ``images`` of the client's training records are
drawn (seeded). For each upload of ``batch`` records (1 in the paper's tables) the client's own
local update of that round is replayed on just those records, ``local_steps`` steps, through the
algorithm's own ``local_update`` and upload code, from the very payload and private state the
engine gives the client that round. The server's view of that upload (an
:class:`~flcore.attacks.base.Observation`) goes to the attack, and the reconstructions are
scored against the real records on de-normalised ``[0, 1]`` images: PSNR, SSIM and (with real
AlexNet weights) LPIPS per record, then the mean over every attacked (round, client, record)
and the worst case (``leak_psnr_max``, ``leak_ssim_max``, ``leak_lpips_min``).

The replay runs in the engine's process before the round's clients train, on a separate
instance of the algorithm, so it changes nothing in the run: no server state, no client
state, no random stream of the training (its own streams are derived from the seed, the
round and the client). An algorithm that uploads nothing (``local``) has nothing to attack:
its leakage metrics are null with the reason ``nothing uploaded``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from flcore.algorithms.base import ClientData, ClientTask
from flcore.attacks.base import ATTACKS, Observation
from flcore.attacks.metrics import LPIPS, match_to_truth, psnr, ssim
from flcore.data import ArrayDataset
from flcore.executor import AlgorithmFactory, client_generator, one_torch_thread

__all__ = ["AttackSettings", "LeakageEvaluator", "LEAK_METRICS", "NOTHING_UPLOADED"]

NOTHING_UPLOADED = "nothing uploaded"
#: the summary metrics an evaluation reports (null where not measurable)
LEAK_METRICS = (
    "leak_psnr",
    "leak_ssim",
    "leak_lpips",
    "leak_psnr_max",
    "leak_ssim_max",
    "leak_lpips_min",
)


@dataclass(frozen=True)
class AttackSettings:
    """A validated ``attack`` config, as typed arguments.

    Attributes:
        name: the registered attack.
        rounds: rounds whose uploads are attacked (1-based).
        clients: attacked client ids.
        images: records attacked per (round, client).
        batch: records per replayed upload (``images`` is a multiple of it).
        local_steps: local steps of the replayed update.
        labels: ``auto`` (recovered by iDLG where the upload allows it, else given) or
            ``given``.
        params: the attack's own validated parameters (iterations included).
        seed: seed of the record draw and of the replay's streams.
    """

    name: str
    rounds: tuple[int, ...]
    clients: tuple[int, ...]
    images: int = 10
    batch: int = 1
    local_steps: int = 1
    labels: str = "auto"
    params: Mapping[str, Any] = field(default_factory=dict)
    seed: int = 0


@dataclass
class _Record:
    round: int
    client: int
    psnr: float
    ssim: float
    lpips: float | None
    label_ok: float | None
    embedding_cos: float | None = None


class LeakageEvaluator:
    """An engine probe: attacks the chosen uploads before their round trains.

    Args:
        settings: what to attack.
        factory: builds the algorithm (a fresh instance replays each update).
        lpips: the LPIPS metric (default: torchvision's AlexNet when present).
        grid_images: records kept for the image grid (originals and reconstructions).
    """

    def __init__(
        self,
        settings: AttackSettings,
        factory: AlgorithmFactory,
        *,
        lpips: LPIPS | None = None,
        grid_images: int = 10,
    ) -> None:
        self.settings = settings
        training = factory.kwargs["training"]
        self.training = replace(training, epochs=settings.local_steps, batch_size=settings.batch)
        self.factory = AlgorithmFactory(factory.name, factory.kwargs | {"training": self.training})
        self.attack = ATTACKS.create(
            settings.name,
            params=dict(settings.params),
            device=str(factory.kwargs.get("device", "cpu")),
        )
        self.lpips = lpips if lpips is not None else LPIPS()
        self.grid_images = grid_images
        self.records: list[_Record] = []
        self.grid: list[tuple[torch.Tensor, torch.Tensor]] = []  # (original, reconstruction)
        self.seconds = 0.0
        self.label_source: str | None = None
        self.skipped: list[str] = []
        self._replayer: Any = None
        self._round_start = 0

    # ------------------------------------------------------------------ probe hooks
    def before_round(self, engine: Any, round: int, tasks: Sequence[ClientTask]) -> None:
        """Attack the chosen clients' uploads of ``round`` (before the round trains)."""
        s = self.settings
        self._round_start = len(self.records)
        if round not in s.rounds:
            return
        if not engine.algorithm.uploads:
            return
        by_client = {t.client_id: t for t in tasks}
        for cid in s.clients:
            task = by_client.get(cid)
            if task is None:
                self.skipped.append(f"client {cid} was not sampled in round {round}")
                continue
            self._attack_client(engine, round, task)

    def round_metrics(self, round: int) -> dict[str, float | None]:
        """The leakage of this round's attacks (empty when it attacked nothing)."""
        return (
            self._aggregate(self.records[self._round_start :])
            if round in self.settings.rounds
            else {}
        )

    def summary(self, engine: Any) -> dict[str, Any]:
        """The final leakage metrics, over every attacked (round, client, record)."""
        out: dict[str, Any] = {k: None for k in LEAK_METRICS}
        out |= {"leak_images": 0, "leak_iterations": self._iterations()}
        if not engine.algorithm.uploads:
            out["leak_reason"] = NOTHING_UPLOADED
            return out
        out |= self._aggregate(self.records)
        if not self.records:
            out["leak_reason"] = "; ".join(self.skipped) or "no attacked round was reached"
        if self.lpips.reason is not None:
            out["leak_lpips_reason"] = self.lpips.reason
        return out

    # ------------------------------------------------------------------ the replay
    def _iterations(self) -> int:
        return int(self.attack.params.iterations)

    def _draw(self, round: int, cid: int, n_train: int) -> np.ndarray:
        rng = np.random.default_rng([self.settings.seed, 0xA77, round, cid])
        n = min(self.settings.images, n_train)
        return rng.choice(n_train, size=n, replace=False)

    def observe(
        self, engine: Any, round: int, task: ClientTask
    ) -> tuple[list[Observation], list[ArrayDataset]]:
        """Replay ``task``'s client on its drawn records (``batch`` per upload) and return
        what the server sees of each replayed upload, with the records behind it."""
        s, data = self.settings, engine.data
        cid = task.client_id
        if self._replayer is None:
            self._replayer = self.factory()
        train = data.client_train(cid)
        picks = self._draw(round, cid, len(train))
        surface = engine.algorithm.attack_surface(task.payload, cid)
        observations, truths = [], []
        for start in range(0, len(picks), s.batch):
            idx = torch.from_numpy(picks[start : start + s.batch])
            records = ArrayDataset(train.images[idx], train.labels[idx])
            cdata = ClientData(cid, records, data.client_test(cid), data.info)
            replay_task = replace(task, evaluate=False)
            gen = client_generator(s.seed ^ 0xA77, round, cid * 100_003 + start)
            with one_torch_thread():
                result = self._replayer.local_update(cdata, replay_task, gen)
            observations.append(
                Observation(
                    algorithm=engine.algorithm.name,
                    round=round,
                    client_id=cid,
                    upload=result.upload,
                    broadcast=task.payload,
                    surface=surface,
                    training=self.training,
                    local_steps=s.local_steps,
                    num_records=len(idx),
                    info=data.info,
                    image_shape=tuple(train.images.shape[1:]),
                    labels=records.labels,
                    recover_labels=s.labels == "auto",
                )
            )
            truths.append(records)
        return observations, truths

    def _attack_client(self, engine: Any, round: int, task: ClientTask) -> None:
        cid = task.client_id
        observations, truths = self.observe(engine, round, task)
        t0 = time.perf_counter()
        with one_torch_thread():  # repeatable to the bit on any machine, as the clients are
            recons = self.attack.reconstruct_many(observations)
        self.seconds += time.perf_counter() - t0
        for obs, rec, records in zip(observations, recons, truths, strict=True):
            self._score(round, cid, obs, rec, records, task)

    def _score(self, round, cid, obs, rec, records, task) -> None:  # type: ignore[no-untyped-def]
        truth = records.images.float() / 255.0
        order = match_to_truth(rec.images, truth) if len(truth) > 1 else torch.arange(1)
        images = rec.images[order]
        labels = rec.labels.reshape(-1)[order] if rec.labels.numel() == len(order) else rec.labels
        p, q = psnr(images, truth), ssim(images, truth)
        lp = self.lpips(images, truth)
        self.label_source = rec.label_source
        emb = rec.extra.get("embedding")
        cos = None
        if emb is not None and isinstance(task.state, Mapping) and "embedding" in task.state:
            true = task.state["embedding"].flatten().float()
            cos = float(torch.nn.functional.cosine_similarity(emb.flatten(), true, dim=0))
        for i in range(len(truth)):
            ok = float(int(labels.reshape(-1)[i]) == int(records.labels[i]))
            self.records.append(
                _Record(
                    round,
                    cid,
                    float(p[i]),
                    float(q[i]),
                    None if lp is None else float(lp[i]),
                    ok,
                    cos,
                )
            )
            if len(self.grid) < self.grid_images:
                self.grid.append((truth[i], images[i]))

    # ------------------------------------------------------------------ results
    def _aggregate(self, records: Sequence[_Record]) -> dict[str, Any]:
        if not records:
            return {}
        ps = np.array([r.psnr for r in records])
        ss = np.array([r.ssim for r in records])
        out: dict[str, Any] = {
            "leak_psnr": float(ps.mean()),
            "leak_ssim": float(ss.mean()),
            "leak_psnr_max": float(ps.max()),
            "leak_ssim_max": float(ss.max()),
            "leak_images": len(records),
            "leak_label_accuracy": float(np.mean([r.label_ok for r in records])),
            "leak_seconds": self.seconds,
        }
        lp = [r.lpips for r in records if r.lpips is not None]
        out["leak_lpips"] = float(np.mean(lp)) if lp else None
        out["leak_lpips_min"] = float(np.min(lp)) if lp else None
        cos = [r.embedding_cos for r in records if r.embedding_cos is not None]
        if cos:
            out["leak_embedding_cosine"] = float(np.mean(cos))
        if math.isinf(out["leak_psnr"]):  # an exact copy: say so rather than average inf
            out["leak_psnr"] = float("inf")
        return out

    def grid_tensors(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(originals, reconstructions)`` of the first attacked records, or None."""
        if not self.grid:
            return None
        return torch.stack([g[0] for g in self.grid]), torch.stack([g[1] for g in self.grid])

    def state_dict(self) -> dict[str, Any]:
        return {
            "records": [vars(r).copy() for r in self.records],
            "grid": self.grid,
            "seconds": self.seconds,
            "label_source": self.label_source,
            "skipped": list(self.skipped),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.records = [_Record(**r) for r in state["records"]]
        self.grid = list(state["grid"])
        self.seconds = float(state["seconds"])
        self.label_source = state["label_source"]
        self.skipped = list(state["skipped"])
