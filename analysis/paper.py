"""The HyperFL paper's published numbers, each keyed by the setting it was measured in.

Guo et al., "A New Federated Learning Framework Against Gradient Inversion Attacks", AAAI 2025.
Table 1: final test accuracy (%) after 200 rounds on HyperFL's dominant-class split (s = 20,
600 training samples per client), Fashion-MNIST with 20 clients (all in every round) or 100
clients (client fraction 0.3); the DP baselines at epsilon 4, delta 1e-5 (the setting of this
repository's ``sweeps/configs/*_fmnist.yaml``). Table 3: the Inverting Gradients attack on EMNIST
and CIFAR-10 (PSNR, SSIM: higher is more leakage; LPIPS: lower is more leakage).

A paper figure is shown beside ours only where a run's params match its setting: comparing a
3-round, 100-sample run with a 200-round figure would mislead. The paper reports no attack on
Fashion-MNIST. Pure data and pure functions.

Beside them, Pa3dFL's (:data:`PA3DFL_PAPER`): Table 1's Fashion-MNIST columns
(:data:`PA3DFL_FMNIST`), Table 3's ablations (:data:`PA3DFL_ABLATION_FMNIST`) and Table 2's
efficiency figures (:data:`PA3DFL_EFFICIENCY`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

__all__ = [
    "ACCURACY",
    "ATTACK",
    "ATTACK_DATASETS",
    "AccuracySetting",
    "PA3DFL_ABLATION_FMNIST",
    "PA3DFL_EFFICIENCY",
    "PA3DFL_FMNIST",
    "PA3DFL_PAPER",
    "PAPER",
    "accuracy_comparison",
    "attack_comparison",
    "paper_accuracy",
    "paper_attack",
    "setting_of",
]

PAPER = (
    'Guo et al., "A New Federated Learning Framework Against Gradient Inversion Attacks", AAAI 2025'
)
_DP = frozenset({"dp_fedavg", "ppsgd", "centaur"})


@dataclass(frozen=True)
class AccuracySetting:
    """What Table 1's numbers assume about a run."""

    dataset: str
    num_clients: int
    client_fraction: float
    rounds: int = 200
    partition: str = "dominant"
    s: float = 20.0
    samples_per_client: int = 600

    def describe(self) -> str:
        return (
            f"{self.dataset}, {self.num_clients} clients (fraction {self.client_fraction:g}), "
            f"{self.samples_per_client} samples/client, {self.partition} split s={self.s:g}, "
            f"{self.rounds} rounds"
        )


FMNIST_20 = AccuracySetting("fmnist", 20, 1.0)
FMNIST_100 = AccuracySetting("fmnist", 100, 0.3)

#: Table 1, final test accuracy in %; pFedHN-PC is not reported
ACCURACY: dict[AccuracySetting, dict[str, float]] = {
    FMNIST_20: {
        "local": 85.93,
        "fedavg": 85.67,
        "pfedhn": 87.64,
        "hyperfl": 88.28,
        "dp_fedavg": 59.88,
        "ppsgd": 84.47,
        "centaur": 83.07,
    },
    FMNIST_100: {
        "local": 87.01,
        "fedavg": 88.11,
        "pfedhn": 89.80,
        "hyperfl": 90.41,
        "dp_fedavg": 68.29,
        "ppsgd": 82.94,
        "centaur": 79.77,
    },
}
#: Table 1's DP baselines ran at this privacy budget
DP_BUDGET = {"privacy.target_epsilon": 4.0, "privacy.delta": 1e-5}

#: Table 3, the IG attack: (PSNR, SSIM, LPIPS) by dataset and algorithm
ATTACK: dict[str, dict[str, tuple[float, float, float]]] = {
    "emnist": {
        "fedavg": (32.64, 0.8925, 0.0526),
        "pfedhn": (31.24, 0.8701, 0.0807),
        "pfedhn_pc": (28.38, 0.8713, 0.0645),
        "dp_fedavg": (7.74, 0.2978, 0.7051),
        "centaur": (9.52, 0.2136, 0.6712),
        "ppsgd": (9.73, 0.1889, 0.6466),
        "hyperfl": (7.85, 0.3010, 0.7147),
    },
    "cifar10": {
        "fedavg": (16.16, 0.6415, 0.0536),
        "pfedhn": (16.02, 0.6351, 0.0504),
        "pfedhn_pc": (15.80, 0.6247, 0.4407),
        "dp_fedavg": (7.90, 0.2716, 0.3204),
        "centaur": (9.80, 0.2723, 0.2882),
        "ppsgd": (9.70, 0.2788, 0.2643),
        "hyperfl": (8.35, 0.2732, 0.3132),
    },
}
ATTACK_DATASETS = tuple(ATTACK)

PA3DFL_PAPER = (
    'Wang et al., "Selective Knowledge Sharing for Personalized Federated Learning Under '
    'Capacity Heterogeneity" (Pa3dFL), 2024'
)
#: Pa3dFL Table 1, Fashion-MNIST: mean test accuracy (%) of the clients over 3 seeds, by setting
#: (``ideal``: every capacity ratio 1; ``hetero``: ratios ~ U[0.01, 1]); 100 IID clients of 600
#: records, 500 rounds with early stopping after 0.2R rounds without validation gain
#: (benchmarks/reproduce_pa3dfl_table1.py, sweeps/configs/pa3dfl/)
PA3DFL_FMNIST: dict[str, dict[str, float]] = {
    "ideal": {
        "fedavg": 91.71,
        "ditto": 90.91,
        "pfedhn": 84.51,
        "flanc": 91.43,
        "fjord": 91.04,
        "heterofl": 90.56,
        "fedrolex": 91.78,
        "local": 75.72,
        "lg_fedavg": 78.96,
        "tailorfl": 91.63,
        "pfedgate": 88.33,
        "pa3dfl": 91.04,
    },
    "hetero": {
        "fedavg": 87.76,
        "ditto": 86.51,
        "pfedhn": 82.51,
        "flanc": 85.33,
        "fjord": 90.11,
        "heterofl": 85.66,
        "fedrolex": 87.40,
        "local": 74.98,
        "lg_fedavg": 78.21,
        "tailorfl": 88.41,
        "pfedgate": 76.58,
        "pa3dfl": 89.55,
    },
}
#: Pa3dFL Table 3, Fashion-MNIST (the Hetero setting, beside Pa3dFL's 89.55): the ablations
PA3DFL_ABLATION_FMNIST: dict[str, float] = {
    "without_hn_aggregation": 78.94,  # only the general parameters aggregated
    "flanc_decomposition": 84.58,  # FLANC's decomposition (its Eq. 3) instead of Pa3dFL's
}
#: Pa3dFL Table 2 (CIFAR-100 CNN, batch 128): (FLOPs x 1e7, peak memory MB, model size x 0.1 MB)
#: by method and capacity ratio r; FedAvg trains the full model only
PA3DFL_EFFICIENCY: dict[str, dict[float, tuple[float, float, float]]] = {
    "fedavg": {1.0: (188.0, 71.1, 30.4)},
    "p-width": {
        1 / 256: (3.5, 23.1, 0.1),
        1 / 64: (8.2, 26.2, 0.5),
        1 / 4: (59.1, 45.3, 7.6),
        1.0: (188.0, 71.1, 30.4),
    },
    "flanc": {
        1 / 256: (15.0, 30.1, 0.6),
        1 / 64: (18.2, 34.1, 0.9),
        1 / 4: (42.3, 58.4, 7.76),
        1.0: (87.7, 90.9, 29.3),
    },
    "pfedgate": {
        1 / 256: (5.5, 39.2, 36.3),
        1 / 64: (10.1, 42.3, 36.3),
        1 / 4: (61.0, 61.4, 36.3),
        1.0: (190.0, 87.2, 36.3),
    },
    "pa3dfl": {
        1 / 256: (3.6, 23.3, 0.8),
        1 / 64: (8.3, 26.5, 1.3),
        1 / 4: (59.9, 46.3, 8.5),
        1.0: (191.9, 74.8, 28.7),
    },
}
_ATTACK_METRICS = ("leak_psnr", "leak_ssim", "leak_lpips")


def _close(a: Any, b: float) -> bool:
    try:
        return math.isclose(float(a), b, rel_tol=1e-9, abs_tol=1e-12)
    except (TypeError, ValueError):
        return False


def setting_of(params: dict[str, Any]) -> AccuracySetting | None:
    """The Table 1 setting a run's flat params (``num_clients``, ``partition.s`` ...) match."""
    for setting in ACCURACY:
        if (
            params.get("dataset") == setting.dataset
            and _close(params.get("num_clients"), setting.num_clients)
            and _close(params.get("client_fraction"), setting.client_fraction)
            and _close(params.get("rounds"), setting.rounds)
            and params.get("partition.name") == setting.partition
            and _close(params.get("partition.s"), setting.s)
            and _close(params.get("samples_per_client"), setting.samples_per_client)
        ):
            return setting
    return None


def paper_accuracy(params: dict[str, Any]) -> float | None:
    """Table 1's accuracy (%) for a run's params, or None where the paper has no such setting
    (or no figure for the algorithm, or, for a DP baseline, another privacy budget)."""
    setting = setting_of(params)
    if setting is None:
        return None
    algorithm = params.get("algorithm")
    if algorithm in _DP and not all(_close(params.get(k), v) for k, v in DP_BUDGET.items()):
        return None
    return ACCURACY[setting].get(str(algorithm))


def paper_attack(dataset: Any, algorithm: Any) -> tuple[float, float, float] | None:
    """Table 3's (PSNR, SSIM, LPIPS) for a dataset and algorithm, or None."""
    return ATTACK.get(str(dataset), {}).get(str(algorithm))


def _params(row: pd.Series) -> dict[str, Any]:
    out = {k[len("params.") :]: v for k, v in row.items() if str(k).startswith("params.")}
    out.setdefault("dataset", row.get("dataset"))
    out.setdefault("algorithm", row.get("algorithm"))
    return out


def _finished(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[runs["status"] == "FINISHED"] if "status" in runs.columns else runs


def accuracy_comparison(runs: pd.DataFrame) -> pd.DataFrame:
    """Our final accuracy (%) beside Table 1's, for the finished runs in a Table 1 setting.

    One row per (setting, algorithm): ``setting``, ``algorithm``, ``runs``, ``ours`` (mean over
    runs of ``accuracy``, after local training), ``ours_std`` (over runs; NaN for one run),
    ``ours_before`` (mean of ``accuracy_before``, the models the clients start the last round
    with; NaN where no run logged it), ``paper``. Empty when no run matches.
    """
    rows: dict[tuple[str, str], list[tuple[float, float]]] = {}
    paper: dict[tuple[str, str], float] = {}
    for _, row in _finished(runs).iterrows():
        params = _params(row)
        figure = paper_accuracy(params)
        accuracy = row.get("accuracy")
        if figure is None or accuracy is None or pd.isna(accuracy):
            continue
        key = (setting_of(params).describe(), str(params["algorithm"]))  # type: ignore[union-attr]
        before = pd.to_numeric(row.get("accuracy_before"), errors="coerce")
        rows.setdefault(key, []).append((100.0 * float(accuracy), 100.0 * float(before)))
        paper[key] = figure
    columns = ["setting", "algorithm", "runs", "ours", "ours_std", "ours_before", "paper"]
    out = []
    for (s, a), v in sorted(rows.items()):
        after, before = pd.Series([x for x, _ in v]), pd.Series([y for _, y in v])
        out.append((s, a, len(v), after.mean(), after.std(ddof=1), before.mean(), paper[(s, a)]))
    return pd.DataFrame(out, columns=columns).astype({c: float for c in columns[3:]})


def attack_comparison(runs: pd.DataFrame) -> pd.DataFrame:
    """Our attack metrics beside Table 3's, for finished runs on EMNIST or CIFAR-10 that report
    ``leak_psnr`` / ``leak_ssim`` / ``leak_lpips``. One row per (dataset, algorithm): ``runs``,
    our means and the paper's ``paper_psnr``, ``paper_ssim``, ``paper_lpips``."""
    columns = ["dataset", "algorithm", "runs", *_ATTACK_METRICS]
    columns += ["paper_psnr", "paper_ssim", "paper_lpips"]
    if "leak_psnr" not in runs.columns or "dataset" not in runs.columns:
        return pd.DataFrame(columns=columns)
    ok = _finished(runs)
    ok = ok[ok["leak_psnr"].notna() & ok["dataset"].isin(ATTACK_DATASETS)]
    out = []
    for (dataset, algorithm), group in ok.groupby(["dataset", "algorithm"], sort=True):
        figure = paper_attack(dataset, algorithm)
        if figure is None:
            continue
        ours = [float(group[m].mean()) if m in group.columns else math.nan for m in _ATTACK_METRICS]
        out.append((dataset, algorithm, len(group), *ours, *figure))
    return pd.DataFrame(out, columns=columns)
