"""The contracts on CUDA: ``pytest -m gpu`` on a machine with a GPU (CI has none and leaves
these out; without a CUDA device they fail, they do not skip).

Every registered algorithm runs a short experiment with ``device: cuda`` and reports what it
declares, with its uploads on the CPU and evaluation passive, and its checkpoint written on one
device resumes on the other; every attack passes its contract on observations made on CUDA;
the vectorized executor equals the loop on CUDA in float64 where no DP noise is drawn
(DP-SGD's noise comes from a device generator there, so only its repeatability is checked).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator

import pytest
import torch

from flcore.attacks import ATTACKS
from flcore.config import validate_config
from flcore.testing import algorithm_contract as contract
from flcore.testing import attack_contract
from tests.contract.test_algorithms import ALL, small  # noqa: F401  (the fixture)
from tests.contract.test_attacks import _cfg as attack_cfg
from tests.contract.test_attacks import small as attack_small  # noqa: F401
from tests.unit.test_vectorized import CASES, _config, _engine, _weights, float64  # noqa: F401

pytestmark = pytest.mark.gpu
# cuBLAS reads this when it starts: with it, its kernels are deterministic
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


@pytest.fixture(scope="module", autouse=True)
def cuda() -> None:
    if not torch.cuda.is_available():
        pytest.fail("pytest -m gpu needs a CUDA device and none is visible", pytrace=False)


@pytest.fixture(autouse=True)
def deterministic() -> Iterator[None]:
    """Deterministic kernels where PyTorch has them (a warning where it has not): the
    contracts compare runs bit for bit, and cuDNN's default convolution backward adds in an
    order that varies from run to run."""
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)


def _on_cuda(cfg):  # type: ignore[no-untyped-def]
    return validate_config(cfg.model_dump(exclude_unset=True) | {"device": "cuda"})


@pytest.mark.parametrize("algorithm", ALL)
def test_every_algorithm_runs_on_cuda(algorithm: str, small) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    cfg, data = small(algorithm)
    cfg = _on_cuda(cfg)
    contract.check_reports(cfg, data)
    contract.check_uploads(cfg, data)
    contract.check_evaluation_is_passive(cfg, data)


@pytest.mark.parametrize("direction", ["cuda-to-cpu", "cpu-to-cuda"])
@pytest.mark.parametrize("algorithm", ALL)
def test_a_checkpoint_resumes_on_the_other_device(
    algorithm: str,
    direction: str,
    small,  # noqa: F811
    tmp_path,
) -> None:
    cfg, data = small(algorithm)
    pair = (_on_cuda(cfg), cfg) if direction == "cuda-to-cpu" else (cfg, _on_cuda(cfg))
    contract.check_checkpoint_changes_device(*pair, data, tmp_path / "checkpoint.pt")


@pytest.mark.parametrize("attack", ATTACKS.names())
def test_every_attack_runs_on_cuda(attack: str, attack_small) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    raw, data = attack_small
    supported = ATTACKS.get(attack).algorithms
    algorithm = "fedavg" if supported is None else sorted(supported)[0]
    cfg = _on_cuda(attack_cfg(raw, algorithm))
    _, _, obs, _ = attack_contract.observations(cfg, data)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            attack_contract.check_attack_contract(attack, obs[0])
        except AssertionError as exc:
            # what ran without a deterministic kernel (warn_only), for whoever reads the failure
            ops = sorted({str(w.message)[:300] for w in caught if "determinis" in str(w.message)})
            raise AssertionError(f"{exc}; kernels without determinism: {ops or 'none'}") from exc


@pytest.mark.parametrize(
    "case", sorted(c for c in CASES if "privacy" not in CASES[c] or "client" in c)
)
def test_vectorized_equals_the_loop_on_cuda(tiny_config: dict, float64: None, case: str):  # noqa: F811
    raw = _config(tiny_config, device="cuda", **CASES[case])
    loop, vec = _engine(raw, "loop"), _engine(raw, "vectorized")
    loop.run()
    vec.run()
    a, b = _weights(loop), _weights(vec)
    for k in a:
        assert torch.allclose(a[k].cpu(), b[k].cpu(), rtol=0, atol=1e-9), k


def test_vectorized_dpsgd_on_cuda_is_repeatable(tiny_config: dict) -> None:
    raw = _config(tiny_config, device="cuda", **CASES["dp_fedavg"])
    runs = []
    for _ in range(2):
        engine = _engine(raw, "auto")
        assert engine.executor == "vectorized"
        engine.run()
        runs.append(_weights(engine))
    for k in runs[0]:
        assert torch.equal(runs[0][k], runs[1][k]), k
