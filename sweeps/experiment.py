"""Run one experiment in-process (no Ray): flcore engine + MLflow + Parquet + progress bar."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flcore.callbacks import Callback, RoundResult
from flcore.config import ExperimentConfig, flatten
from flcore.engine import Engine
from flcore.experiment import build_data, build_engine, check_early_stopping
from sweeps.attack_artifacts import ATTACK_GRID_DIR, attack_tags, grid_png
from sweeps.progress import ProgressCallback
from sweeps.provenance import provenance_tags
from sweeps.results import ParquetCallback
from sweeps.tracking import MLflowCallback, experiment_name

__all__ = ["attack_config", "attack_summary", "config_params", "run_experiment"]


class _Checkpointer(Callback):
    def __init__(self, engine: Engine, path: Path, every: int) -> None:
        self.engine, self.path, self.every = engine, path, every

    def on_round_end(self, result: RoundResult) -> None:
        if self.every and result.round % self.every == 0:
            self.engine.save_checkpoint(self.path)


def config_params(cfg: ExperimentConfig) -> dict[str, Any]:
    """Params as MLflow records them: flattened with '.', no prefix (``optimizer.momentum``)."""
    return flatten(cfg.model_dump(mode="json"))


def run_experiment(
    cfg: ExperimentConfig,
    *,
    progress: bool = True,
    resume_from: str | Path | None = None,
    parent_run_id: str | None = None,
    stop_after: int | None = None,
    tags: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run ``cfg`` to the end (or through round ``stop_after``) and return the summary (with
    ``run_id``, ``metrics_path`` and the algorithm's privacy tags: ``dp_guarantee``, and with DP
    ``dp_relation`` and for client-level DP ``client_sampling``; the MLflow run carries them
    as tags).

    The data and the engine are built before the MLflow run is created, so a missing dataset,
    or a config refused once its data is known (a privacy target no noise meets, a disconnected
    graph), writes nothing; an ``early_stopping`` without validation records is refused before
    that. A run that early stopping ends before ``cfg.rounds`` ends normally (FINISHED), its
    summary that of its best-validation round with ``rounds_completed``, ``best_round`` and
    ``early_stopped`` (with ``early_stopping.report: all_clients``, every client on that state,
    with the per-client rows as the artifact ``all_clients.json``).
    """
    check_early_stopping(cfg)
    data = build_data(cfg)
    # the engine before the MLflow run: what refuses a config only once its data is known
    # (privacy calibration, a disconnected graph, an algorithm's own checks) writes nothing,
    # and a weak delta's warning comes before any work
    engine = build_engine(cfg, data=data)
    tracker = MLflowCallback(
        experiment=experiment_name(cfg.experiment),
        params=config_params(cfg),
        tags=provenance_tags(data.splits.checksum)
        | {"fedsweep.data_source": data.splits.source[:5000]}
        | dict(tags or {}),
        run_name=f"{cfg.algorithm}-{cfg.dataset}-s{cfg.seed}",
        parent_run_id=parent_run_id,
    )
    run_dir = Path(cfg.output_dir) / tracker.run_id
    metrics_path = run_dir / "metrics.parquet"
    parquet = ParquetCallback(
        metrics_path,
        static={"run_id": tracker.run_id, "algorithm": cfg.algorithm, "seed": cfg.seed},
    )
    bar = ProgressCallback(enabled=progress)
    engine.callbacks.callbacks.extend([tracker, parquet, bar])
    if cfg.checkpoint_every:
        engine.callbacks.callbacks.append(
            _Checkpointer(engine, run_dir / "checkpoint.pt", cfg.checkpoint_every)
        )
    if resume_from is not None:
        engine.load_checkpoint(resume_from)
    try:
        if stop_after is None:
            summary = engine.run()
        else:
            for result in engine.iter_rounds():
                if result.round >= stop_after:
                    break
            summary = engine.summary()
            engine.callbacks.on_run_end(summary)
    except BaseException as exc:
        bar.close()
        if parquet.rows:  # keep what was measured before the failure
            parquet.write()
        tracker.finish("KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED")
        raise
    overlap = data.overlap
    # dp_guarantee, and with DP on dp_relation (and client_sampling for client-level DP):
    # what the run's epsilon means, read by analysis
    privacy_tags = engine.algorithm.privacy_tags()
    tracker.set_tags({f"partition.{k}": str(v) for k, v in overlap.items()} | privacy_tags)
    tracker.log_artifact(metrics_path)
    summary = {**summary, **_log_client_costs(engine, run_dir, tracker)}
    _log_best_state_evaluation(engine, run_dir, tracker)
    _log_embeddings(engine, cfg, run_dir, tracker)
    tracker.set_tags(attack_tags(summary, engine))
    grid = grid_png(engine, run_dir / ATTACK_GRID_DIR)
    if grid is not None:
        tracker.log_artifact(grid, ATTACK_GRID_DIR)
    tracker.finish()
    return {
        **summary,
        "run_id": tracker.run_id,
        "metrics_path": str(metrics_path.resolve()),
        "algorithm": cfg.algorithm,
        "dataset": cfg.dataset,
        **privacy_tags,
        **({"attack_grid": str(grid.resolve())} if grid is not None else {}),
    }


def _log_client_costs(engine: Engine, run_dir: Path, tracker: Any) -> dict[str, float]:
    """Under a capacity setting: each client's width, parameters, FLOPs of one training batch
    and peak memory of one step, as ``client_costs.json``, and per width as metrics."""
    costs = engine.client_costs()
    if not costs:
        return {}
    import json

    path = run_dir / "client_costs.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({str(k): v for k, v in costs.items()}, indent=1))
    tracker.log_artifact(path)
    metrics = engine.cost_metrics()
    tracker.log_summary(metrics, step=engine.round)
    return metrics


def _log_best_state_evaluation(engine: Engine, run_dir: Path, tracker: Any) -> None:
    """Under ``early_stopping.report: all_clients``: every client's accuracies on the best
    state (the summary's means come from these rows) as ``all_clients.json``."""
    evaluation = engine.best_state_evaluation()
    if evaluation is None:
        return
    import json

    path = run_dir / "all_clients.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(evaluation, indent=1))
    tracker.log_artifact(path)


def _log_embeddings(engine: Any, cfg: ExperimentConfig, run_dir: Path, tracker: Any) -> None:
    """Algorithms with learned client embeddings (HyperFL) log them as an array and a 2-D plot,
    so the client groups can be seen (HyperFL's Figure 8)."""
    get = getattr(engine.algorithm, "client_embeddings", None)
    if get is None:
        return
    import numpy as np

    from analysis.plots import plot_embeddings

    emb = get(engine.client_states)
    npy = run_dir / "client_embeddings.npy"
    np.save(npy, emb)
    labels = None
    if cfg.partition.name == "dominant":
        groups = engine.data.info.class_groups or ()
        if groups:

            def name(g: int) -> str:
                classes = groups[g]
                shown = ",".join(map(str, classes)) if len(classes) <= 4 else f"{len(classes)}"
                return f"group {g} (classes {shown})"

            labels = [name(i % len(groups)) for i in range(len(emb))]
    png = plot_embeddings(emb, run_dir / "client_embeddings.png", labels=labels)
    tracker.log_artifact(npy)
    tracker.log_artifact(png)


def attack_config(cfg: ExperimentConfig, checkpoint: Path | None) -> ExperimentConfig:
    """``cfg`` with an attack mapping (the default one if it has none) whose rounds are
    explicit; with a checkpoint, the attacked round defaults to the one after it."""
    from flcore.config import AttackConfig, validate_config
    from flcore.engine import checkpoint_round

    attack = cfg.attack or AttackConfig()
    rounds = attack.rounds
    if rounds is None:
        rounds = [checkpoint_round(checkpoint) + 1] if checkpoint is not None else [cfg.rounds]
    raw = cfg.model_dump(mode="json")
    raw["attack"] = attack.model_dump(mode="json") | {"rounds": rounds}
    return validate_config(raw)


def attack_summary(result: dict[str, Any], cfg: ExperimentConfig) -> dict[str, Any]:
    """What ``fedsweep attack`` reports of a run's privacy evaluation."""
    from flcore.attacks.evaluation import LEAK_METRICS

    assert cfg.attack is not None
    doc = {k: result.get(k) for k in LEAK_METRICS}
    doc |= {
        "images": result.get("leak_images", 0),
        "iterations": result.get("leak_iterations"),
        "attack": cfg.attack.name,
        "algorithm": cfg.algorithm,
        "rounds": list(cfg.attack.resolved_rounds(cfg.rounds)),
        "clients": cfg.attack.clients,
        "label_accuracy": result.get("leak_label_accuracy"),
        "identified_rate": result.get("leak_identified_rate"),
        "identified_chance": result.get("leak_identified_chance"),
        "identified_by": result.get("leak_identified_by"),
        "attack_seconds": result.get("leak_seconds"),
        "reason": result.get("leak_reason"),
        "lpips_reason": result.get("leak_lpips_reason"),
        "run_id": result.get("run_id"),
        "grid": result.get("attack_grid"),
    }
    if "leak_embedding_cosine" in result:
        doc["embedding_cosine"] = result["leak_embedding_cosine"]
    return doc
