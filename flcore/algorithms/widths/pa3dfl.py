"""Pa3dFL: Wang, Wang, Peng, Wang & Wang, "Selective Knowledge Sharing for Personalized Federated
Learning Under Capacity Heterogeneity", arXiv 2405.20589, 2024 (the paper file names no venue).
The name stands for "pruning and aggregation after decomposition".

Each layer but the head is decomposed as theta = Reshape(U V) (Eqs. 4-5, flcore.algorithms.widths
.decomposed: ranks, channel order ``c = j R1 + i``, pruning). Client i trains width p_i:

- general parameters U (every layer's, the same shape at every width) are averaged over the round's
  clients with equal weights, ``U <- (1/|S_t|) sum_i U_i`` (Eq. 6);
- personal parameters (each layer's V and bias, and the local head) are generated on the server by
  a hypernetwork from learnable client embeddings ``E = [e_1..e_N]``: ``E' = Encoder(E)`` (an MLP),
  ``s_i = E' e'_i``, per layer ``e_i^(l) = E'^T softmax(s_i / tau_l)`` with a learnable
  temperature ``tau_l`` (Eq. 9), one decoder per layer (and one more for the local head) maps
  ``e_i^(l)`` to that layer's V, pruned to the client's width (Eq. 10);
- the server sends U and the client's pruned personal tensors; the client trains them all
  (Algorithm 3) and returns them; the server minimises
  ``L_HN = (1/|S_t|) sum_i 1/2 ||theta_v,i^(t+1) - theta_v,i^(t)||^2`` (Eq. 7's 1/2; Algorithm 2
  line 14 prints the loss without it, which only doubles a plain step) with the returned
  ``theta_v,i^(t+1)`` held constant, by one plain SGD step of ``hn_lr`` on the hypernetwork and on
  every embedding (Eqs. 7-8, Algorithm 2 lines 14-16). As in pFedHN, the gradient is the
  vector-Jacobian product of each client's generated tensors with (generated - returned),
  accumulated as results arrive and divided by the number of clients at the end of the round;
- client loss (Algorithm 3): ``CE(global_head(x'), y) + CE(local_head(detach(x')), y) +
  lambda sum_conv ||S - diag(S)||^2`` with ``S = U^T U`` (Eq. 32), x' the recovered width-p
  network's representation (Sec. 3.3; Algorithm 3 line 9 prints the global head on the detached
  features, a slip: the global head is frozen, and the local head is the one Sec. 3.3 trains on
  them). Algorithm 3 line 11 multiplies Eq. 32, which already holds lambda, by lambda again;
  lambda is applied once here. Eq. 32's ``theta_w`` is read as the whole layer's U (``R1 k^2 x
  R2``), as printed; Appendix C.3's remark that for a linear layer (k = 1) the columns'
  orthogonality "is meaningless" fits the ``k^2 x R2`` block ``u_i`` better, so a per-block
  term is the other reading (lambda is 0.01 / 0.001, a small term either way). The global head
  is fixed at its seeded initial value and never trained, following the paper's [22], FedBABU
  (Oh, Kim & Yun, ICLR 2022), whose head is randomly initialised and frozen; at width p a head
  reads the first ``p T`` features (``fixed_global_head``). At width 1/16 that is 8 ReLU
  features into a fixed random 10 x 8 head: at seeds 1 and 2 one class can never win through
  it, and a width-1/16 CNN trained centrally through it stays 5.5-13.9 points below one whose
  head trains (seeds 0-2; 0.3-0.7 at width 1/8; BENCHMARKS.md session 69,
  ``benchmarks/pa3dfl_frozen_head.py``). Nested as Pa3dFL nests widths (each client training
  only its own), a width-1/16 submodel trained centrally on seed 2's client widths scores 53.4
  through this head, as Pa3dFL's width-1/16 client does in federation (53.3), and 79.2 with the
  head trained (session 70, ``--nested``);
- model selection (Algorithm 1) on the client's validation records: M0 = the received model with
  the global head, M1 = the trained model with the local head, both recovered to plain width-p
  networks (Appendix C.2: "recover ... first and then fuse"); ``g(alpha) = val_acc(M0 + alpha (M1 -
  M0))`` over ``n_alpha`` evenly spaced alphas in [0, 1], the best kept (ties: ``alpha_ties``,
  by default the largest alpha, the one closest to the trained model; the paper does not say,
  and on 60 validation records ties are common: ``smallest``, argmax's first, moved the
  all-client figure up by 0.6-1.1 points on three runs, BENCHMARKS.md session 52, where the
  search also proved to overfit its records; of Algorithm 1 the paper's text as we have it
  keeps its inputs, "the maximum number of iterations n" among them, and its first line, with
  no value for n: the evenly spaced grid and its ``n_alpha`` 11 are ours); each evaluation
  round logs the evaluated clients' mean alpha as ``selected_alpha`` (the all-client
  evaluation keeps each client's). The paper
  prints ``M0 + alpha (M0 - M1)``, which for alpha in [0, 1] moves away from the trained model
  and never reaches it, contradicting its text ("fuse the received model ... and the locally
  trained one"); we read it as a sign slip.
  ``accuracy`` is the selected model on the client's test records, ``accuracy_before`` is M0's;
  ``val_accuracy`` is the selected model's on the very records that chose alpha, so it reads
  high (early stopping only compares rounds with it; the test figure is not chosen on its own
  records).
  Without validation records alpha is 1 (the trained model with its local head). The selection
  only scores (it changes nothing that trains) and runs only on evaluation rounds.

Choices where the paper is silent, and deviations:

- The protocol of the Table 1 configs (sweeps/configs/pa3dfl/): each client's 600 records split
  0.8 / 0.1 / 0.1 into train, validation (Algorithm 1's selection and early stopping) and test
  (``client_split``), as Section 6.1 states; the paper does not state the clients' fraction per
  round, so the configs take FLGo's default, 0.2, with plain SGD (FLGo's default). Table 7's
  hypernetwork tuple is read as ``(lambda, hn_lr, [embed_dim, hidden_dim, encoder_depth])``:
  the table does not name the bracket's fields.
- p_min of Eq. 5 (``R1 = T p_min``): Algorithm 2 line 2 sets it to the narrowest client's
  width, min_i p_i, and Eq. 5 needs every ``T p_i`` to be a multiple of R1. Our widths are
  multiples of the width rule's step (``capacity.p_min``, 1/16; issue 24's one width rule), and
  the narrowest of them need not divide the others (under Hetero, seed 0, min_i p_i = 1/8 beside
  widths of 3/16), so by default (``rank_p_min: grid``) p_min is that step: R1 is T/16 in every
  layer, half the paper's T/8 at Hetero's seed 0, and in Ideal, where every client has width 1
  and the paper's R1 is T (one V block a layer), sixteen blocks. ``rank_p_min: clients`` is the
  paper's rule, refused where a width is no multiple of the narrowest. Both Table 1 configs use
  ``grid``: under ``clients`` in Ideal (R1 = T, J = 1) the balanced step below trains each
  conv's U and V at 4.3 x lr (1.1 x lr with J = 16), and at Table 7's lr 0.1 a client's
  two-head loss went 4.25, 5.97, 7.61, 44.7, 4350, NaN in six steps of round 1 (seed 0,
  client 20; BENCHMARKS.md, session 33). ``step_scale_max: 1`` caps that multiplier (no factor
  steps faster than lr; the J = 16 convs' 1.08 becomes 1, the linear layers' stay); with it
  ``clients`` trains in Ideal (session 34, BENCHMARKS.md). Default None: uncapped, so the
  Table 1 runs of earlier sessions keep their step. What ``grid`` changes beyond the step: in
  Ideal the paper's R1 = T makes U (averaged, shared) nearly all of each conv's filters, conv1
  20,000 values and conv2 51,200 against V's 25 and 1,024 (U 350K values over the model, 20%
  of it), where ``grid``'s U holds 1,250 and 3,200 and V 400 and 16,384 (U 5.5K values, 0.3%
  of the model): under ``grid`` almost every weight is personal, made by the hypernetwork,
  where the paper shares the convolutions by plain averaging. Under Hetero the paper's p_min
  (1/8 at seed 0) leaves U 13K values. The labelled run ``clients-cap1`` (queued) measures it.
- Biases are personal: the layer's decoder generates them with V, pruned with their channels.
- The hypernetwork: embeddings ``N x embed_dim`` drawn N(0, 1); the encoder is ``encoder_depth``
  linear layers ``embed_dim -> hidden_dim -> ... -> hidden_dim`` with ReLU between them (none after
  the last); ``tau_l = exp(log_tau_l)`` keeps the temperature positive, initialised to
  ``sqrt(hidden_dim)`` (scaled dot-product attention's scale). A decoder whose MLP maps ``e^(l)``
  to all of V at once is out of reach (fc1's V alone is 32 x 16 x 3136 = 1.6M values; a 64-unit
  output layer onto it is 103M weights), so each decoder generates V one row at a time: row ``n =
  (j, r)`` (``v_j``'s row r, S values) is ``base_n + g W_out relu(W_in e^(l) + c_n + b_in)``, a
  one-hidden-layer MLP over ``[e^(l); onehot(n)]`` (``c_n`` a learned code per row) whose output
  layer ``W_out`` (S x hidden) is shared by the rows, plus ``base``, one learned value per
  generated value (the output bias a full MLP decoder would have: with it the server step moves
  each generated value at least as a full decoder's would, ``hn_lr`` times the mean of the returned
  deltas). ``g = 1 / sqrt(rows)`` is a fixed gain: ``W_out``'s Jacobian sums over the rows, and the
  gain gives it the scale of one output weight per value. Rows are ordered by ``j`` so pruning is a
  prefix, and only the kept rows and inputs are computed. The bias is a linear map of ``e^(l)``
  (zero-initialised: biases start at 0). The local head is generated the same way, one row per
  class. The authors' code (FLGo / easyFL by WwZzz) holds no Pa3dFL in the stored snapshots, so
  these shapes are ours. For the FMNIST CNN at embed 64, hidden 64, depth 3 and 20 clients the
  hypernetwork has 2.12M parameters (the model has 1.73M): fc1's decoder 1.88M, of which 1.61M is
  its ``base``; U is 5.5K values.
- Initial scale and step size (balanced): a step on U moves theta by ``lr G V^T V`` and a step
  on V by ``lr U U^T G``. Each decoder's output (its per-value ``base`` and its shared part,
  half the variance each) is rescaled so that V has std ``b = (t^2 / (J S))^(1/4)``, and U
  (drawn N(0, 1)) so that the recovered weight has std ``t = 1 / sqrt(3 fan_in)`` (PyTorch's
  default for conv/linear weights): U's and V's rows then have equal squared norms
  ``sqrt(J S) t``, the smallest sum for that ``t``. That sum, ``2 sqrt(J / (3 k^2))``, is how
  much farther a step on (U, V) moves theta than a step on theta: 0.92 for the k = 5 convs but
  4.6 for the linear layers, where plain SGD at the paper's lr 0.1 diverged within a few epochs
  (with the decoders' default scale it was ~10^4 and the first round diverged). So each layer's
  U and V train at ``lr / (2 sqrt(J / (3 k^2)))`` (``step_scale``); biases and the local head
  at lr. Scales are measured on client 0's initial V; the local head starts at std ``t`` too.
- The hypernetwork's step (``hn_step: balanced``, the default) is Eq. 8's gradient step with one
  step size per parameter group, measured once at the start, so that ``hn_lr`` means the same
  for any decoder shape: a step of 1 moves the generated tensors by about the mean returned
  delta, as FedAvg's server step would move a shared tensor. Plain SGD (``hn_step: plain``, one
  step size ``hn_lr`` for every HN parameter, Eq. 8 as printed) moves them by ``J J^T`` times
  the delta (J the Jacobian of the generated tensors in the HN's parameters), whose largest
  eigenvalue is 13-18 at Table 7's FMNIST Hetero HN ([64, 64, 4]): at that table's ``hn_lr`` 1.0
  every step overshoots thirteen-fold, and the runs turned NaN at round 6 (session 17). The
  balanced step sizes are, per decoder: ``base`` 1 (its ``J J^T`` is the identity); the bias
  map ``1 / lambda``; the row-mixing part (input layer, row codes, shared output layer) ``kappa
  / lambda``; and for the embeddings, encoder and temperatures together ``kappa / lambda`` over
  every generated tensor; ``lambda`` is the group's largest eigenvalue of ``J J^T`` (power
  iteration, ``top_eigenvalue``, ``power_iterations`` steps, default 20, at client 0's
  full-width output) and ``kappa = 1/4``. (At Table 7's Hetero HN, 20 steps leave 6 of the 26
  groups' step sizes over 1% above their 60-step values, the largest by 3.3%: inside the margin
  below.) The top
  eigenvalue of the whole step is then at most ``1 + 2 kappa`` at the start (measured 1.21-1.25
  at Table 7's Hetero HN), under the 2 above which a repeated step diverges. The authors' code is
  not available, so how their decoders make Table 7's ``hn_lr`` 1.0 stable is not known; no
  momentum, weight decay or clipping on the server. The configs keep Table 7's ``hn_lr``
  values (Hetero 1.0, Ideal 0.1) as the balanced step's, so they do not mean what they mean
  under Eq. 8's plain step: Ideal's 0.1 moves the generated tensors by a tenth of the mean
  returned delta a round, where the plain step at 0.1 would move them by 0.1 times ``J J^T``'s
  eigenvalues (up to 1.3-1.8 times the delta at Hetero's HN). Ideal's V, nearly the whole
  model under ``grid`` (above), learns slowly for it: 1.0 averaged 84.93 over rounds 11-20
  against 0.1's 78.32 (BENCHMARKS.md, session 50; the labelled runs ``hnlr1`` and ``hnplain``,
  queued, measure the whole run).
- ``max_grad_norm`` (default None: Algorithm 3 as printed) clips each local step's gradient
  norm. With the plain HN step, Table 7's FMNIST Hetero runs turned NaN at round 6 (100 and 20
  clients); clipping at 10 only delayed it to round 10 with 100 clients (BENCHMARKS.md). The
  cause was the server step (above), not the local steps; clipping stays as an option.
- ``hn_aggregation: false`` (Table 3's ablation "without HN aggregation of personal parts"): each
  client keeps its personal tensors (V, biases, local head) as private state and trains them
  locally; they start from the initial hypernetwork's output for that client (a public value) and
  are never sent; only U travels and is averaged.
- ``decomposition: flanc`` (Table 3's ablation "FLANC decomposition", Eq. 3): every layer's
  weight is FLANC's basis U (``A R1 x R2``, averaged) times coefficients V (``R2 x T S / R1``,
  generated by the hypernetwork and pruned to ``T p S p / R1`` columns), with FLANC's R1 and R2
  (flcore.algorithms.widths.decomposed). The paper gives the scheme, not its R1 and R2 for the
  ablation nor how it starts; here they are our FLANC's, and the start is balanced the same way
  (the rows of U and of V's ``R2 x C`` matrix of equal norm, the recovered weights at PyTorch's
  default std), so U and V step at ``1 / (2 sqrt(C) t)`` (C = V's columns, t that std); the
  orthogonality term stays Eq. 32 on the convolutions' U.
- ``width_draw: upto`` (a labelled variant, not the paper's; default ``own``, Algorithm 3):
  each local step trains a width q drawn uniformly from the multiples of Eq. 5's p_min up to
  the client's p_i (FjORD's draw, without its distillation), the width-q network inside the
  client's width-p_i one (``sub_width_loss``: its entries outside the width-q network multiplied
  by 0, so the step's logits and gradients are the width-q network's, both heads reading the
  first ``q T`` features). What it tests: centrally, nesting through the frozen head under
  Pa3dFL's own-width draw left a width-1/16 submodel at 53.4 where the ``upto`` draw reached
  70.5 (session 70, ``benchmarks/pa3dfl_frozen_head.py --nested``); whether the draw lifts the
  narrowest clients in federation is the labelled run ``upto``. The client sends what it sends
  under ``own``; the attack surface simulates its own-width step (the server does not know the
  draws). As in FjORD, momentum and weight decay (none in the Table 1 configs) still move the
  entries a step leaves out. The loop executor only: ``executor: vectorized`` is refused.
- The attack surface: the server knows U and the personal tensors it sent and the architecture;
  a record's gradient is that of the client's two-head loss through the recovered network
  (``_DualHeadSurface``). The data-independent Eq. 32 term is left out of the simulation.
- No global model: ``global_accuracy`` is not reported. No privacy mechanism.
- The local head's step (``head_step: normalized``, the default) is normalized by the features'
  energy: its gradient is scaled so that its SGD step is ``min(lr, 1 / (1 + mean ||x'||^2))``
  over the batch (``two_head_loss``); the loss value is unchanged. Measured on one full-width
  client of Table 7's Hetero setting, first round (lr 0.1): the frozen global head drives the
  features' mean norm from 0.66 to 23.5 in 5 epochs, and the local head, a linear softmax model
  on those detached features whose curvature grows with ``||x'||^2``, diverges under the plain
  step (``head_step: plain``, Algorithm 3 as printed): its CE goes 2.30, 2.22, 2.12, 2.45, 4.78
  by epoch, against 2.30, 2.22, 1.99, 1.83, 1.60 with the normalized step. The attack surface
  simulates the normalized step at the first round's lr.
- The vectorized executor (``executor: vectorized``, issue 28) trains all of a round's clients
  as one stack in the full-width network, each client's tensors zero-padded from its width (V's
  blocks and inputs, biases and head columns past the width's: the width-p network is the full
  one's sub-network on the first channels, so the padded channels compute zeros and, behind a
  ReLU at 0 and zero next-layer weights, get zero gradients; the trained tensors are cut back
  to the width), on the same objective (masked means over padded batches), U and V at their
  layer's ``step_scale`` and the rest at lr, clipped as the loop clips; equal to the loop within
  1e-9 in float64 (``tests/unit/test_vectorized.py``). Session 23 stacked each width apart,
  which left a GPU launch-bound ten times over (1.17x the loop on an H100, BENCHMARKS.md).
  Evaluation rounds' model selection (Algorithm 1) and test metrics run client by client, the
  loop's code, after the training.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Mapping
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn
from torch.func import functional_call

from flcore.algorithms.aggregate import WeightedMean
from flcore.algorithms.base import (
    ALGORITHMS,
    Algorithm,
    AlgorithmParams,
    ClientData,
    ClientResult,
    ClientTask,
    VectorJob,
    seeded,
)
from flcore.algorithms.widths.decomposed import (
    DecomposedNet,
    LayerPlan,
    layer_plans,
    orthogonality_penalty,
    recover,
)
from flcore.algorithms.widths.slicing import leading_block, nested_widths, padded
from flcore.data import ArrayDataset, DatasetInfo
from flcore.errors import ConfigError

__all__ = [
    "Pa3dFL",
    "Pa3dFLParams",
    "Pa3dFLHyperNetwork",
    "fixed_global_head",
    "select_alpha",
    "interpolate",
]

TensorDict = dict[str, torch.Tensor]

_HEAD_SEED = 0x6EAD  # the fixed global head (public: every party builds it from the seed)
_HN_SEED = 0xA3D1
_U_SEED = 0xA3D2
_STEP_SEED = 0xA3D3  # the power iteration of the balanced HN step


def fixed_global_head(plain: Callable[[float], nn.Module], seed: int, width: float) -> nn.Linear:
    """Pa3dFL's fixed global head at ``width`` (FedBABU's frozen random head): the full-width
    network's head as seeded from ``seed``, reading the first ``in_features`` of the width's
    head (its first ``p T`` features), frozen. ``plain(width)`` builds the plain network."""
    full = seeded((seed, _HEAD_SEED), lambda: plain(1.0)).head
    n_in = plain(width).head.in_features
    head = nn.Linear(n_in, full.out_features)
    with torch.no_grad():
        head.weight.copy_(full.weight[:, :n_in])
        head.bias.copy_(full.bias)
    return head.requires_grad_(False)


class Pa3dFLParams(AlgorithmParams):
    embed_dim: int = Field(64, ge=1, description="size of each client embedding e_i")
    hidden_dim: int = Field(
        64, ge=1, description="width of the encoder's and decoders' hidden layers (and of E')"
    )
    encoder_depth: int = Field(3, ge=1, le=8, description="linear layers in the HN encoder")
    hn_lr: float = Field(0.1, gt=0, description="server SGD step on the HN and embeddings (Eq. 8)")
    reg_lambda: float = Field(0.01, ge=0, description="lambda of the Eq. 32 orthogonality term")
    n_alpha: int = Field(11, ge=2, description="grid points of Algorithm 1's linear search")
    alpha_ties: Literal["largest", "smallest"] = Field(
        "largest",
        description="which of Algorithm 1's equally scored alphas is kept: the largest (closest "
        "to the trained model) or the smallest (closest to the received one, argmax's first); "
        "the paper does not say (module docstring)",
    )
    max_grad_norm: float | None = Field(
        None,
        gt=0,
        description="clip each local step's gradient norm (None: no clipping, the paper's "
        "Algorithm 3); a stabiliser, see the module docstring",
    )
    power_iterations: int = Field(
        20,
        ge=1,
        description="power-iteration steps behind each balanced step size (hn_step: balanced; "
        "module docstring): fewer is cheaper at the start and estimates each top eigenvalue "
        "lower (larger steps)",
    )
    hn_step: Literal["balanced", "plain"] = Field(
        "balanced",
        description="the server's HN step: 'balanced' gives each parameter group a step size "
        "measured at the start (module docstring); 'plain': one step size hn_lr for all",
    )
    head_step: Literal["normalized", "plain"] = Field(
        "normalized",
        description="the local head's SGD step: 'normalized' divides it by 1 + the batch's mean "
        "squared feature norm (module docstring); 'plain': Algorithm 3 as printed",
    )
    hn_aggregation: bool = Field(
        True,
        description="personal parts generated and aggregated by the HN; false: kept and "
        "trained locally by each client (Table 3 ablation)",
    )
    decomposition: Literal["channel", "flanc"] = Field(
        "channel",
        description="the layers' decomposition: 'channel' (Eq. 4, Pa3dFL's) or 'flanc' (Eq. 3, "
        "FLANC's basis shared by every output channel: Table 3 ablation)",
    )
    step_scale_max: float | None = Field(
        None,
        gt=0,
        description="cap on the lr multiplier of each layer's U and V (step_scale; module "
        "docstring); None: uncapped",
    )
    width_draw: Literal["own", "upto"] = Field(
        "own",
        description="the width a client trains at each local step: 'own', its width p_i "
        "(Algorithm 3); 'upto', a width drawn uniformly from the multiples of p_min up to p_i "
        "(FjORD's draw, no distillation): a labelled variant, loop executor only (module "
        "docstring)",
    )
    rank_p_min: Literal["grid", "clients"] = Field(
        "grid",
        description="p_min of Eq. 5's R1 = T p_min: 'grid', the width rule's step "
        "(capacity.p_min, 1/16), or 'clients', the narrowest client's width (Algorithm 2 line "
        "2), which every client's width must then be a multiple of",
    )


class _RowDecoder(nn.Module):
    """One layer's decoder: ``e`` -> its personal weight, row by row, and its bias.

    Row ``n`` is ``base_n + gain W_out relu(W_in e + c_n + b_in)``: ``base`` is the output
    layer's own bias, one value per generated value (as in an MLP decoder with a full output
    layer); ``W_out`` is shared by the rows, told apart by their learned codes ``c_n``.
    """

    def __init__(self, dim: int, hidden: int, rows: int, row_len: int, bias_len: int) -> None:
        super().__init__()
        self.inp = nn.Linear(dim, hidden)
        self.row_code = nn.Parameter(torch.randn(rows, hidden))
        self.out = nn.Linear(hidden, row_len, bias=False)
        self.base = nn.Parameter(torch.randn(rows, row_len))
        self.bias = nn.Linear(dim, bias_len)
        nn.init.zeros_(self.bias.weight)
        nn.init.zeros_(self.bias.bias)
        # a fixed output gain: W_out is shared by every row, so its Jacobian sums over rows;
        # 1 / sqrt(rows) gives it the scale of one output weight per generated value
        self.register_buffer("gain", torch.tensor(rows**-0.5))

    def mixed(self, e: torch.Tensor, rows: int, row_len: int) -> torch.Tensor:
        """The client-dependent part of the first ``rows`` rows (first ``row_len`` values)."""
        h = F.relu(self.inp(e) + self.row_code[:rows])
        return self.gain * F.linear(h, self.out.weight[:row_len])

    def forward(
        self, e: torch.Tensor, rows: int, row_len: int, bias_len: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        weight = self.base[:rows, :row_len] + self.mixed(e, rows, row_len)
        bias = F.linear(e, self.bias.weight[:bias_len], self.bias.bias[:bias_len])
        return weight, bias

    @torch.no_grad()
    def rescale(self, e: torch.Tensor, std: float) -> None:
        """Scale ``base`` and ``W_out`` so that each part has std ``std / sqrt(2)`` at ``e``."""
        rows, row_len = self.base.shape
        part = std / math.sqrt(2)
        self.base.mul_(part / float(self.base.std()))
        self.out.weight.mul_(part / float(self.mixed(e, rows, row_len).std()))


class Pa3dFLHyperNetwork(nn.Module):
    """The server's hypernetwork (Eq. 9): embeddings -> encoder -> per-layer attention
    aggregation with temperature tau_l -> per-layer row decoders.

    Args:
        num_clients: rows of the embedding table.
        plans: the full-width decomposed layers (their V and bias are generated).
        head_in: the local head's inputs at full width; num_classes: its outputs.
    """

    def __init__(
        self,
        num_clients: int,
        plans: list[LayerPlan],
        head_in: int,
        num_classes: int,
        *,
        embed_dim: int,
        hidden_dim: int,
        encoder_depth: int,
    ) -> None:
        super().__init__()
        self.embeddings = nn.Parameter(torch.randn(num_clients, embed_dim))
        layers: list[nn.Module] = []
        d = embed_dim
        for n in range(encoder_depth):
            if n:
                layers.append(nn.ReLU())
            layers.append(nn.Linear(d, hidden_dim))
            d = hidden_dim
        self.encoder = nn.Sequential(*layers)
        self.log_tau = nn.Parameter(torch.full((len(plans) + 1,), 0.5 * math.log(hidden_dim)))
        self.decoders = nn.ModuleList(
            _RowDecoder(hidden_dim, hidden_dim, *p.v_rows(pruned=False), p.T) for p in plans
        )
        self.head_decoder = _RowDecoder(hidden_dim, hidden_dim, num_classes, head_in, num_classes)

    def aggregated(self, client_id: int) -> torch.Tensor:
        """``e_i^(l)`` of every layer (rows; the head's last): ``E'^T softmax(s_i / tau_l)``."""
        enc = self.encoder(self.embeddings)  # E', [N, hidden]
        sim = enc @ enc[client_id]  # s_i
        weights = torch.softmax(sim[None, :] / self.log_tau.exp()[:, None], dim=1)
        return weights @ enc

    def forward(self, client_id: int, plans: list[LayerPlan], head_in: int) -> TensorDict:
        """Client ``client_id``'s personal tensors, pruned to the widths of ``plans`` (Eq. 10)
        and a local head reading ``head_in`` features."""
        e = self.aggregated(client_id)
        out: TensorDict = {}
        for n, (p, dec) in enumerate(zip(plans, self.decoders, strict=True)):
            rows, bias = dec(e[n], *p.v_rows(), p.T_p)
            out[f"{p.key}.V"] = rows.reshape(p.v_shape())
            out[f"{p.key}.bias"] = bias
        classes = self.head_decoder.row_code.shape[0]
        weight, bias = self.head_decoder(e[len(plans)], classes, head_in, classes)
        out["local_head.weight"], out["local_head.bias"] = weight, bias
        return out


_KAPPA = 0.25  # the top curvature each step-scaled group may add to the per-value ``base``'s 1
_POWER_ITERS = 20
_JIT_DEPRECATED = r"`torch\.jit\.script` is deprecated"


def top_eigenvalue(
    fn: Callable[..., tuple[torch.Tensor, ...]],
    primals: tuple[torch.Tensor, ...],
    generator: torch.Generator,
    iters: int = _POWER_ITERS,
) -> float:
    """The largest eigenvalue of ``J J^T`` (J the Jacobian of ``fn`` at ``primals``), by power
    iteration on ``v -> J (J^T v)``: how far one unit gradient step on the primals moves
    ``fn``'s outputs along the most-moved direction."""
    from torch.func import jvp, vjp

    out, vjp_fn = vjp(fn, *primals)
    v = tuple(torch.randn(o.shape, generator=generator).to(o) for o in out)
    lam = 0.0
    for _ in range(iters):
        norm = torch.sqrt(sum((x * x).sum() for x in v))  # type: ignore[arg-type]
        if float(norm) == 0.0:
            return 0.0
        v = tuple(x / norm for x in v)
        with warnings.catch_warnings():
            # a process's first jvp loads torch's forward-mode decompositions through
            # torch.jit.script, which warns of its own deprecation: torch's, not a user's to act on
            warnings.filterwarnings("ignore", _JIT_DEPRECATED, FutureWarning)
            _, jv = jvp(fn, primals, vjp_fn(v))
        lam = float(sum((a.detach() * b).sum() for a, b in zip(jv, v, strict=True)))
        v = tuple(x.detach() for x in jv)
    return lam


def hn_step_sizes(
    hn: Pa3dFLHyperNetwork,
    plans: list[LayerPlan],
    head_in: int,
    generator: torch.Generator,
    kappa: float = _KAPPA,
    iters: int = _POWER_ITERS,
) -> dict[str, float]:
    """Per-parameter step multipliers of the balanced server step (module docstring), measured
    at client 0's full-width output: each decoder's ``base`` 1; its bias map ``1 / lambda``;
    its row-mixing part (input layer, row codes, shared output layer) ``kappa / lambda``; the
    shared embeddings, encoder and temperatures ``kappa / lambda`` over every output."""
    from torch.func import functional_call

    sizes: dict[str, float] = {}
    with torch.no_grad():
        e = hn.aggregated(0).detach()
    decoders = [*hn.decoders, hn.head_decoder]
    names = [*(f"decoders.{n}" for n in range(len(plans))), "head_decoder"]
    classes = hn.head_decoder.row_code.shape[0]
    shapes = [(*q.v_rows(pruned=False), q.T) for q in plans] + [(classes, head_in, classes)]
    for n, (dec, prefix, (rows, row_len, bias_len)) in enumerate(
        zip(decoders, names, shapes, strict=True)
    ):
        sizes[f"{prefix}.base"] = 1.0
        params = dict(dec.named_parameters())
        for group, which in (("bias", lambda k: k.startswith("bias.")), ("mixed", None)):
            keys = [
                k for k in params if (which(k) if which else not k.startswith(("bias.", "base")))
            ]
            sub = {k: params[k].detach() for k in keys}

            def fn(
                *ps: torch.Tensor,
                keys: list[str] = keys,
                dec: nn.Module = dec,
                args: tuple[Any, ...] = (e[n], rows, row_len, bias_len),
                out: int = 0 if group == "mixed" else 1,
            ) -> tuple[torch.Tensor]:
                return (functional_call(dec, dict(zip(keys, ps, strict=True)), args)[out],)

            lam = top_eigenvalue(fn, tuple(sub.values()), generator, iters)
            share = kappa if group == "mixed" else 1.0
            for k in keys:
                sizes[f"{prefix}.{k}"] = share / lam if lam > 0 else 1.0
    upstream = {
        k: p.detach()
        for k, p in hn.named_parameters()
        if k == "embeddings" or k == "log_tau" or k.startswith("encoder.")
    }
    keys = list(upstream)

    def full(*ps: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = functional_call(hn, dict(zip(keys, ps, strict=True)), (0, plans, head_in))
        return tuple(out.values())

    lam = top_eigenvalue(full, tuple(upstream.values()), generator, iters)
    for k in keys:
        sizes[k] = kappa / lam if lam > 0 else 1.0
    return sizes


def _init_std(q: LayerPlan) -> float:
    """PyTorch's default std of a conv/linear weight: ``1 / sqrt(3 fan_in)``."""
    return 1.0 / math.sqrt(3 * q.S * q.k * q.k)


def step_scale(q: LayerPlan) -> float:
    """The lr multiplier of a layer's U and V: the inverse of how much farther a step on (U, V)
    moves theta than a step on theta itself at the balanced start, ``||u row||^2 + ||v row||^2
    = 2 sqrt(J S) t = 2 sqrt(J / (3 k^2))`` (0.92 for a k = 5 conv, 4.6 for a linear layer);
    in FLANC's scheme (the ablation) ``2 sqrt(C) t`` with C V's columns (``T S / R1``)."""
    if q.scheme == "flanc":
        return 1.0 / (2.0 * math.sqrt(q.v_cols()) * _init_std(q))
    return 1.0 / (2.0 * math.sqrt(q.J / (3.0 * q.k * q.k)))


def select_alpha(
    score: Callable[[float], float], n: int, ties: Literal["largest", "smallest"] = "largest"
) -> tuple[float, float]:
    """Algorithm 1's linear search: the alpha of ``n`` evenly spaced points in [0, 1] with the
    highest ``score`` (``ties``: the largest or the smallest of the equally scored alphas), and
    that score."""
    best_alpha, best = 0.0, -math.inf
    for k in range(n):
        alpha = k / (n - 1)
        s = score(alpha)
        if s > best or (s == best and ties == "largest"):
            best_alpha, best = alpha, s
    return best_alpha, best


def interpolate(m0: Mapping[str, torch.Tensor], m1: Mapping[str, torch.Tensor], alpha: float):  # type: ignore[no-untyped-def]
    """``M0 + alpha (M1 - M0)``, tensor by tensor."""
    return {k: m0[k] + alpha * (m1[k] - m0[k]) for k in m0}


class _TwoHeadLoss(nn.Module):
    """The client's data loss (Algorithm 3 lines 7-9), as a module for functional calls."""

    def __init__(self, net: DecomposedNet, head_lr: float | None) -> None:
        super().__init__()
        self.net = net
        self.head_lr = head_lr

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return two_head_loss(self.net, x, y, head_lr=self.head_lr)


def two_head_loss(
    net: DecomposedNet,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    head_lr: float | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """``CE(global_head(x'), y) + CE(local_head(detach(x')), y)``. With ``head_lr`` (the local
    head's SGD step size) the gradient reaching the local head is scaled by ``min(1, 1 / (head_lr
    (1 + mean ||x'||^2)))`` over the batch, the loss value unchanged: the head's effective step is
    then ``min(head_lr, 1 / (1 + mean ||x'||^2))`` (the normalized step of the module docstring).
    ``mask`` (the vectorized executor's padded batches): the means are over the rows where it
    is 1 (None: every row, the loop's arithmetic)."""
    f = net.features(x)
    fd = f.detach()
    local = net.local_head(fd)
    if mask is None:

        def mean(v: torch.Tensor) -> torch.Tensor:
            return v.mean()

    else:
        weight = mask / mask.sum().clamp(min=1)

        def mean(v: torch.Tensor) -> torch.Tensor:
            return (v * weight).sum()

    if head_lr is not None:
        energy = 1.0 + mean(fd.pow(2).sum(1))
        scale = torch.clamp(1.0 / (head_lr * energy), max=1.0)
        local = scale * local + (1.0 - scale) * local.detach()
    if mask is None:
        return F.cross_entropy(net.head(f), y) + F.cross_entropy(local, y)
    ce = F.cross_entropy(net.head(f), y, reduction="none")
    return mean(ce) + mean(F.cross_entropy(local, y, reduction="none"))


class _VectorObjective(nn.Module):
    """A width's client objective for the vectorized executor (``Algorithm.vector_objective``):
    ``forward(x, y, mask)`` is Algorithm 3's loss of a padded batch, the two heads' and Eq. 32's;
    ``head_lr`` is set to the round's before each training (``Pa3dFL.vector_job``)."""

    def __init__(self, net: DecomposedNet, reg_lambda: float) -> None:
        super().__init__()
        self.net = net
        self.reg_lambda = reg_lambda
        self.head_lr: float | None = None

    def forward(self, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        loss = two_head_loss(self.net, x, y, head_lr=self.head_lr, mask=mask)
        if self.reg_lambda > 0:
            loss = loss + self.reg_lambda * orthogonality_penalty(self.net)
        return loss


@functools.cache
def _surface_class() -> type:
    # flcore.attacks imports the algorithms: import it only when a surface is asked for
    from torch.func import functional_call, grad

    from flcore.attacks.surface import ModelSurface

    class _DualHeadSurface(ModelSurface):
        """ModelSurface whose simulated loss is the client's two-head loss."""

        def __init__(
            self, net: DecomposedNet, *args: Any, head_lr: float | None, **kwargs: Any
        ) -> None:
            super().__init__(net, *args, **kwargs)
            self.objective = _TwoHeadLoss(net, head_lr)

        def gradient(self, unknowns: TensorDict, x: torch.Tensor, y: torch.Tensor) -> TensorDict:
            def loss(shared: TensorDict) -> torch.Tensor:
                params = self.fixed | dict(unknowns) | shared
                named = {f"net.{k}": v for k, v in params.items()}
                return functional_call(self.objective, named, (x, y))

            return grad(loss)(self.start)

    return _DualHeadSurface


@ALGORITHMS.register("pa3dfl")
class Pa3dFL(Algorithm):
    """Decomposed layers: averaged general U, hypernetwork-generated personal V (see module)."""

    name = "pa3dfl"
    reports = Algorithm.reports - {"global_accuracy"}
    Params = Pa3dFLParams
    capacity_aware = True
    static_bn_ok = False  # it rebuilds (or gates) the layers; no rule for BatchNorm
    vectorized = True  # padded to full width, with its own objective (vector_objective)
    vector_objective = True
    #: Algorithm 1's alpha of each evaluated client; the round logs the clients' mean
    client_metrics = ("selected_alpha",)

    # ------------------------------------------------------------------ structure
    @property
    def p_min(self) -> float:
        """Eq. 5's p_min (``rank_p_min``; module docstring).

        Raises:
            ConfigError: ``rank_p_min: clients`` where a client's width is no multiple of the
                narrowest (``T p_i mod R1`` would not be 0).
        """
        if self.params.rank_p_min == "grid":  # type: ignore[attr-defined]
            return self.capacity.p_min if self.capacity is not None else 1 / 16
        if self.capacity is None:
            return 1.0
        narrowest = self.capacity.min_width
        for cid in range(self.num_clients):
            steps = self.capacity.width(cid) / narrowest
            if abs(steps - round(steps)) > 1e-9:
                raise ConfigError(
                    "algorithm_params.rank_p_min",
                    f"'clients' sets p_min to the narrowest width {narrowest:g}, and client "
                    f"{cid}'s width {self.capacity.width(cid):g} is no multiple of it: use "
                    "'grid' (the width rule's step)",
                )
        return narrowest

    def _plain(self, width: float) -> nn.Module:
        """A fresh plain network at ``width`` (the spec's own model without a capacity)."""
        return self.model_spec(**({"width": width} if self.capacity is not None else {}))

    def _cache(self) -> dict[str, Any]:
        if getattr(self, "_cached", None) is None:
            self._cached: dict[str, Any] = {"plans": {}, "nets": {}, "plain": {}}
        return self._cached

    def plans(self, width: float) -> list[LayerPlan]:
        """The decomposed layers at ``width`` (1: the full model)."""
        cache = self._cache()["plans"]
        if width not in cache:
            full = self._plain(1.0)
            narrow = full if width == 1.0 else self._plain(width)
            cache[width] = layer_plans(full, narrow, self.p_min, self.params.decomposition)  # type: ignore[attr-defined]
        return cache[width]

    def global_head(self, width: float) -> nn.Linear:
        """The fixed global head (FedBABU's frozen random head), reading the first features."""
        return fixed_global_head(self._plain, self.seed, width)

    def build_net(self, width: float) -> DecomposedNet:
        """A fresh client network at ``width`` (its U, V, biases and local head still zero)."""
        return DecomposedNet(self._plain(width), self.plans(width), self.global_head(width)).to(
            self.device
        )

    def _net(self, width: float) -> DecomposedNet:
        nets = self._cache()["nets"]
        if width not in nets:
            nets[width] = self.build_net(width)
        return nets[width]

    def _plain_cached(self, width: float) -> nn.Module:
        plain = self._cache()["plain"]
        if width not in plain:
            plain[width] = self._plain(width).to(self.device)
        return plain[width]

    def cost_model(self, client_id: int) -> nn.Module:
        """The decomposed width-p network: its FLOPs include recovering theta from U V."""
        return self.build_net(self.client_width(client_id))

    def _head_in(self, width: float) -> int:
        return self._plain_cached(width).head.in_features  # type: ignore[union-attr,return-value]

    # ------------------------------------------------------------------ server
    def init_server(self) -> None:
        p = self.params
        assert isinstance(p, Pa3dFLParams)
        self.p_min  # noqa: B018  (refuses a rank_p_min the widths do not allow, before any work)
        plans = self.plans(1.0)
        model = self._plain(1.0)
        self.hn = seeded(
            (self.seed, _HN_SEED),
            lambda: Pa3dFLHyperNetwork(
                self.num_clients,
                plans,
                model.head.in_features,  # type: ignore[arg-type]
                model.head.out_features,  # type: ignore[arg-type]
                embed_dim=p.embed_dim,
                hidden_dim=p.hidden_dim,
                encoder_depth=p.encoder_depth,
            ),
        ).to(self.device)
        u = seeded(
            (self.seed, _U_SEED),
            lambda: {f"{q.key}.U": torch.randn(q.u_shape()) for q in plans},
        )
        self.U: TensorDict = self._balanced_init(u, plans, model.head)
        names = [k for k, _ in self.hn.named_parameters()]
        if p.hn_step == "balanced":
            words = np.random.SeedSequence([self.seed, _STEP_SEED]).generate_state(1)
            gen = torch.Generator().manual_seed(int(words[0]))
            self.hn_step_sizes = hn_step_sizes(  # type: ignore[arg-type]
                self.hn, plans, model.head.in_features, gen, iters=p.power_iterations
            )
        else:
            self.hn_step_sizes = dict.fromkeys(names, 1.0)
        self._mean: WeightedMean | None = None
        self._count = 0

    def _balanced_init(self, u: TensorDict, plans: list[LayerPlan], head: nn.Linear) -> TensorDict:
        """Scale the decoders and U so that the recovered weights start at PyTorch's default
        std with U's and V's rows of equal norm (module docstring), and the local head's decoder
        to PyTorch's default std too. Measured at client 0."""
        with torch.no_grad():
            e = self.hn.aggregated(0)
            for n, (q, dec) in enumerate(zip(plans, self.hn.decoders, strict=True)):
                # balanced rows: R2 a^2 = C b^2 (C = V's columns, J S), R2 a^2 b^2 = std^2
                dec.rescale(e[n], (_init_std(q) ** 2 / q.v_cols()) ** 0.25)
            self.hn.head_decoder.rescale(e[len(plans)], 1.0 / math.sqrt(3 * head.in_features))
            v = self.hn(0, plans, head.in_features)
            for q in plans:
                key = f"{q.key}.U"
                w = recover(q, u[key], v[f"{q.key}.V"].cpu())
                u[key] = (u[key] * (_init_std(q) / float(w.std()))).to(self.device)
        return u

    def _personal(self, client_id: int) -> TensorDict:
        """The HN's personal tensors for ``client_id`` at its width (with the autograd graph)."""
        w = self.client_width(client_id)
        return self.hn(client_id, self.plans(w), self._head_in(w))

    def init_client_state(self, client_id: int) -> Any:
        if self.params.hn_aggregation:  # type: ignore[attr-defined]
            return None
        with torch.no_grad():
            return {k: v.detach().cpu().clone() for k, v in self._personal(client_id).items()}

    def broadcast(self, round: int, client_id: int) -> TensorDict:
        out = {k: v.detach().clone() for k, v in self.U.items()}
        if self.params.hn_aggregation:  # type: ignore[attr-defined]
            with torch.no_grad():
                out |= {k: v.detach().clone() for k, v in self._personal(client_id).items()}
        return out

    def begin_round(self, round: int, client_ids: list[int]) -> None:
        self._mean = WeightedMean()
        self._count = 0
        self.hn.zero_grad(set_to_none=True)

    def accumulate(self, result: ClientResult) -> None:
        """U joins the round's plain mean; the personal tensors' (generated - returned) is
        back-propagated through the HN (Eq. 7's gradient, summed until ``end_round``)."""
        assert self._mean is not None, "begin_round was not called"
        self._mean.add({k: result.upload[k] for k in self.U}, 1.0)
        if self.params.hn_aggregation:  # type: ignore[attr-defined]
            gen = self._personal(result.client_id)
            names = list(gen)
            torch.autograd.backward(
                [gen[k] for k in names],
                grad_tensors=[gen[k].detach() - result.upload[k].to(self.device) for k in names],
            )
        self._count += 1

    def end_round(self, round: int) -> None:
        if not self._count or self._mean is None:
            raise ValueError("no client was aggregated this round")
        self.U = {k: v.to(self.device) for k, v in self._mean.result().items()}
        self._mean = None
        lr = self.params.hn_lr  # type: ignore[attr-defined]
        with torch.no_grad():
            for name, p in self.hn.named_parameters():
                if p.grad is not None:
                    p.sub_(p.grad, alpha=lr * self.hn_step_sizes[name] / self._count)
        self.hn.zero_grad(set_to_none=True)

    def state_dict(self) -> dict[str, Any]:
        return {
            "hn": {k: v.detach().clone() for k, v in self.hn.state_dict().items()},
            "U": {k: v.detach().clone() for k, v in self.U.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.hn.load_state_dict(state["hn"])
        self.U = {k: v.detach().clone().to(self.device) for k, v in state["U"].items()}

    def attack_surface(self, broadcast: TensorDict, client_id: int) -> Any:
        """The client's decomposed network at its width, started from the broadcast; with
        ``hn_aggregation: false`` the personal tensors are unknowns at their public initial
        values (the initial HN's output)."""
        net = self.build_net(self.client_width(client_id)).eval()
        unknowns = self.init_client_state(client_id) or {}
        return _surface_class()(
            net,
            broadcast,
            unknowns={k: v.to(self.device) for k, v in unknowns.items()},
            label_key="local_head.bias",
            head_lr=self._head_lr(None),
        )

    # ------------------------------------------------------------------ client
    def _objective(self, net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        assert isinstance(net, DecomposedNet)
        loss = two_head_loss(net, x, y, head_lr=getattr(self, "_round_head_lr", None))
        lam = self.params.reg_lambda  # type: ignore[attr-defined]
        return loss + lam * orthogonality_penalty(net) if lam > 0 else loss

    def drawn_widths(self, client_id: int) -> list[float]:
        """The widths ``width_draw: upto`` draws from for ``client_id``, ascending: the
        multiples of Eq. 5's p_min up to the client's width (the last)."""
        return nested_widths(self.client_width(client_id), self.p_min)

    def width_masks(self, width: float, sub: float) -> TensorDict:
        """The 0/1 masks of the width-``sub`` network's entries in each trained tensor of the
        width-``width`` one (its leading block: :func:`padded`); tensors of the same shape at
        both widths (every U) are left out."""
        cache = self._cache().setdefault("masks", {})
        if (width, sub) not in cache:
            big, small = self._net(width), self._net(sub)
            shapes = {k: v.shape for k, v in big.state_dict().items()}
            keys = [*big.general_keys(), *big.personal_keys()]
            cache[width, sub] = {
                k: padded(torch.ones_like(v), shapes[k], f"pa3dfl: {k}")
                for k, v in small.state_dict().items()
                if k in keys and v.shape != shapes[k]
            }
        return cache[width, sub]

    def _upto_objective(
        self, widths: list[float], generator: torch.Generator
    ) -> Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]:
        """``width_draw: upto``'s step loss: a width q drawn uniformly from ``widths``
        (:meth:`drawn_widths`, the client's own the last) once a step from the client's
        generator; below the client's own width the step's loss is the width-q network's,
        computed in the width-p one with the entries outside the width-q network multiplied by 0
        (their outputs are 0, as the vectorized executor's padding, so the logits are the
        width-q network's and those entries get zero gradients). Eq. 32's term is on U, the same
        at every width."""

        def loss(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            j = int(torch.randint(len(widths), (1,), generator=generator))
            return self.sub_width_loss(net, widths[-1], widths[j], x, y)

        return loss

    def sub_width_loss(
        self, net: nn.Module, width: float, sub: float, x: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor:
        """The client objective of the width-``sub`` network inside ``net``, the client's
        width-``width`` network (:meth:`width_masks`; ``sub == width``: the objective itself)."""
        if sub == width:
            return self._objective(net, x, y)
        assert isinstance(net, DecomposedNet)
        params = dict(net.named_parameters())
        masked = {f"net.{k}": params[k] * m for k, m in self.width_masks(width, sub).items()}
        wrapper = _TwoHeadLoss(net, getattr(self, "_round_head_lr", None))
        data_loss = functional_call(wrapper, masked, (x, y))
        lam = self.params.reg_lambda  # type: ignore[attr-defined]
        return data_loss + lam * orthogonality_penalty(net) if lam > 0 else data_loss

    def _head_lr(self, round: int | None) -> float | None:
        """The local head's lr for the normalized step (None: the plain step)."""
        normalized = self.params.head_step == "normalized"  # type: ignore[attr-defined]
        return self.training.lr_at(round) if normalized else None

    def _step_scale(self, q: LayerPlan) -> float:
        """:func:`step_scale`, capped at ``step_scale_max`` where set."""
        cap = self.params.step_scale_max  # type: ignore[attr-defined]
        return step_scale(q) if cap is None else min(step_scale(q), cap)

    def _param_groups(self, net: DecomposedNet, round: int) -> list[dict[str, Any]]:
        """U and V of each layer at ``lr x step_scale``; biases and the local head at lr."""
        lr = self.training.lr_at(round)
        factored: list[dict[str, Any]] = []
        for q in net.plans:
            layer = net.features[q.index]
            factored.append({"params": [layer.U, layer.V], "lr": lr * self._step_scale(q)})  # type: ignore[list-item]
        seen = {id(p) for g in factored for p in g["params"]}
        rest = [p for p in net.parameters() if p.requires_grad and id(p) not in seen]
        return [*factored, {"params": rest, "lr": lr}]

    def _evaluate_state(self, width: float, state: TensorDict) -> nn.Module:
        model = self._plain_cached(width)
        model.load_state_dict(state)
        return model

    def local_update(
        self, data: ClientData, task: ClientTask, generator: torch.Generator
    ) -> ClientResult:
        width = self.client_width(task.client_id)
        net = self._net(width)
        self._client_model = net
        start, keys = self._start(task, net)
        net.load_state_dict({k: start[k].to(self.device) for k in keys}, strict=False)
        metrics: dict[str, float] = {}
        m0: TensorDict = {}
        if task.evaluate:
            m0, metrics = self._received_eval(task, net, data, width)
        opt = self.local_optimizer(self._param_groups(net, task.round), round=task.round)
        self._round_head_lr = self._head_lr(task.round)
        loss_fn = self._objective
        if self.params.width_draw == "upto":  # type: ignore[attr-defined]
            loss_fn = self._upto_objective(self.drawn_widths(task.client_id), generator)
        metrics["train_loss"] = self.run_epochs(
            net,
            data,
            opt,
            generator,
            loss_fn=loss_fn,
            max_grad_norm=self.params.max_grad_norm,  # type: ignore[attr-defined]
        )
        if task.evaluate:
            metrics |= self._select_and_evaluate(task, net, data, width, m0)
        state = net.state_dict()
        trained = {k: state[k].detach().to("cpu", copy=True) for k in keys}
        if self.params.hn_aggregation:  # type: ignore[attr-defined]
            return ClientResult(task.client_id, len(data.train), trained, None, metrics)
        upload = {k: trained[k] for k in net.general_keys()}
        personal = {k: trained[k] for k in net.personal_keys()}
        return ClientResult(task.client_id, len(data.train), upload, personal, metrics)

    # ------------------------------------------------------------------ vectorized rounds
    def vector_unsupported(self) -> str | None:
        if self.params.width_draw == "upto":  # type: ignore[attr-defined]
            return "width_draw 'upto' draws a width each step, which only the loop runs"
        return super().vector_unsupported()

    def vector_model(self) -> nn.Module:
        """The full-width decomposed network inside its objective: every client trains in it,
        its tensors zero-padded from its width (:meth:`vector_job`). The executor's copy of the
        algorithm keeps it, to set the round's ``head_lr`` in :meth:`vector_job`."""
        model = _VectorObjective(self.build_net(1.0), self.params.reg_lambda)  # type: ignore[attr-defined]
        self._cache()["objective"] = model
        return model

    def vector_keys(self, model: nn.Module) -> list[str] | None:
        assert isinstance(model, _VectorObjective)
        return [f"net.{k}" for k in (*model.net.general_keys(), *model.net.personal_keys())]

    def vector_job(self, task: ClientTask) -> VectorJob:
        """Algorithm 3's epochs: U and V of each layer at ``lr x step_scale``, biases and the
        local head at lr (the loop's parameter groups), clipped over all of them where
        ``max_grad_norm`` is set."""
        objective = self._cache()["objective"]
        objective.head_lr = self._head_lr(task.round)
        start, keys = self._start(task, objective.net)
        full = objective.net.state_dict()
        scale = tuple(
            (f"net.{q.key}.{part}", self._step_scale(q))
            for q in objective.net.plans
            for part in "UV"
        )
        clip: tuple[tuple[tuple[str, ...], float], ...] = ()
        max_norm = self.params.max_grad_norm  # type: ignore[attr-defined]
        if max_norm is not None:
            trained = tuple(k for k, p in objective.named_parameters() if p.requires_grad)
            clip = ((trained, max_norm),)
        return VectorJob(
            start={f"net.{k}": padded(start[k], full[k].shape, f"pa3dfl: {k}") for k in keys},
            lr=self.training.lr_at(task.round),
            lr_scale=scale,
            clip=clip,
        )

    def vector_result(
        self,
        task: ClientTask,
        weights: TensorDict,
        num_samples: int,
        metrics: dict[str, float],
        kept: TensorDict | None = None,
        data: ClientData | None = None,
    ) -> ClientResult:
        """What ``local_update`` returns; on an evaluation round the loop's evaluation (the
        received model, then Algorithm 1's selection) on the client's data."""
        width = self.client_width(task.client_id)
        net = self._net(width)
        shapes = {k: v.shape for k, v in net.state_dict().items()}
        named = {k.removeprefix("net."): v for k, v in weights.items()}
        trained = {k: leading_block(v, shapes[k]) for k, v in named.items()}
        if task.evaluate:
            assert data is not None, "the executor gives an evaluation round's client data"
            start = dict(task.payload) | dict(task.state or {})
            net.load_state_dict({k: start[k].to(self.device) for k in trained}, strict=False)
            m0, before = self._received_eval(task, net, data, width)
            metrics |= before
            net.load_state_dict(trained, strict=False)
            metrics |= self._select_and_evaluate(task, net, data, width, m0)
        if self.params.hn_aggregation:  # type: ignore[attr-defined]
            return ClientResult(task.client_id, num_samples, trained, None, metrics)
        upload = {k: trained[k] for k in net.general_keys()}
        personal = {k: trained[k] for k in net.personal_keys()}
        return ClientResult(task.client_id, num_samples, upload, personal, metrics)

    @staticmethod
    def _start(task: ClientTask, net: DecomposedNet) -> tuple[TensorDict, list[str]]:
        """What the client starts from (broadcast and kept state) and the keys it trains."""
        start = dict(task.payload) | dict(task.state or {})
        keys = [*net.general_keys(), *net.personal_keys()]
        missing = [k for k in keys if k not in start]
        if missing:
            raise KeyError(f"pa3dfl: the client has no {missing}")
        return start, keys

    def _received_eval(
        self, task: ClientTask, net: DecomposedNet, data: ClientData, width: float
    ) -> tuple[TensorDict, dict[str, float]]:
        """M0 (the received model with the global head, ``net`` as loaded) and its metrics."""
        with torch.no_grad():
            m0 = {k: v.detach().clone() for k, v in net.recovered_state("global").items()}
        return m0, self.client_eval(task, self._evaluate_state(width, m0), data, before=True)

    def _select_and_evaluate(
        self, task: ClientTask, net: DecomposedNet, data: ClientData, width: float, m0: TensorDict
    ) -> dict[str, float]:
        """Algorithm 1 on the validation records, then the selected model's test metrics."""
        with torch.no_grad():
            m1 = {k: v.detach().clone() for k, v in net.recovered_state("local").items()}
        alpha = self.choose_alpha(width, m0, m1, data.val, data.info)
        model = self._evaluate_state(width, interpolate(m0, m1, alpha))
        return self.client_eval(task, model, data) | {"selected_alpha": alpha}

    def choose_alpha(
        self,
        width: float,
        m0: TensorDict,
        m1: TensorDict,
        val: ArrayDataset | None,
        info: DatasetInfo,
    ) -> float:
        """Algorithm 1: the alpha in [0, 1] (``n_alpha`` points) whose plain width-p model
        ``M0 + alpha (M1 - M0)`` is most accurate on ``val``; 1 without validation records."""
        from flcore.algorithms.training import evaluate

        if val is None or not len(val):
            return 1.0

        def score(a: float) -> float:
            model = self._evaluate_state(width, interpolate(m0, m1, a))
            return evaluate(model, val, info, device=self.device)[0]

        params = self.params
        return select_alpha(score, params.n_alpha, params.alpha_ties)[0]  # type: ignore[attr-defined]
