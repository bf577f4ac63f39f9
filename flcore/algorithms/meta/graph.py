"""Communication graphs and random walks of the decentralized algorithms (LoDMeta, L2C).

LoDMeta (Yang & Kwok, Sec. 5.1) runs on the Watts-Strogatz small world (Watts & Strogatz 1998)
and on a 3-regular expander; its model walks the graph as a Markov chain with transition matrix
P (Algorithm 2, line 14), and Theorem 4.3's rate depends on ``sigma_2(P)``, P's
second-largest eigenvalue modulus. Graphs come from networkx:

- ``watts_strogatz``: ``networkx.connected_watts_strogatz_graph(n, k, p, seed=...)`` (redrawn
  until connected, at most 100 times; the paper gives no k or p: default k 4, p 0.3, whose
  busiest client has 6-8 neighbours at n = 100 (seeds 0-9), where Sec. 5.2 says of its own
  graphs that "the maximum number of neighbors is 5");
- ``regular``: ``networkx.random_regular_graph(degree, n, seed=...)`` (``n x degree`` even);
- ``edges``: a user's edge list, two client ids ``0..n-1`` a line, ``#`` comments.

A disconnected graph is an error (the walk could never reach some clients). The transition
matrix is ``simple`` (``P_ij = 1 / deg(i)`` for a neighbour j: stationary distribution
``deg(i) / 2|E|``) or ``metropolis`` (Metropolis-Hastings, ``P_ij = min(1/deg(i), 1/deg(j))``
for a neighbour j and the rest on ``P_ii``: uniform stationary distribution on any connected
graph). The paper leaves P open; the configs use ``simple``, which on a regular graph is
already uniform.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from flcore.errors import ConfigError

__all__ = [
    "Graph",
    "build_graph",
    "check_graph",
    "read_edges",
    "second_eigenvalue_modulus",
    "stationary_distribution",
    "transition_matrix",
]


def read_edges(path: str | Path, n: int) -> list[tuple[int, int]]:
    """The edges of an edge-list file over clients ``0..n-1``."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError("graph.path", f"no edge-list file at {p}")
    edges = []
    for i, line in enumerate(p.read_text().splitlines(), 1):
        text = line.split("#", 1)[0].split()
        if not text:
            continue
        try:
            a, b = (int(t) for t in text)
        except ValueError:
            raise ConfigError(
                "graph.path", f"{p}:{i}: a line must be two client ids, got {line!r}"
            ) from None
        if not (0 <= a < n and 0 <= b < n) or a == b:
            raise ConfigError(
                "graph.path", f"{p}:{i}: edge ({a}, {b}) needs two distinct ids in 0..{n - 1}"
            )
        edges.append((a, b))
    return edges


def _nx_graph(name: str, n: int, *, k: int, p: float, degree: int, path: str | None, seed: int):  # type: ignore[no-untyped-def]
    import networkx as nx

    if name == "watts_strogatz":
        if not k < n:
            raise ConfigError("graph.k", f"must be < num_clients ({n}), got {k}")
        try:
            return nx.connected_watts_strogatz_graph(n, k, p, tries=100, seed=seed)
        except nx.NetworkXError as exc:
            raise ConfigError("graph", f"no connected Watts-Strogatz graph: {exc}") from None
    if name == "regular":
        if not degree < n or (n * degree) % 2:
            raise ConfigError(
                "graph.degree",
                f"a {degree}-regular graph on {n} clients needs degree < n and n x degree even",
            )
        return nx.random_regular_graph(degree, n, seed=seed)
    if name == "edges":
        if path is None:
            raise ConfigError("graph.path", "the edges graph needs an edge-list file")
        g = nx.Graph()
        g.add_nodes_from(range(n))
        g.add_edges_from(read_edges(path, n))
        return g
    raise ConfigError(
        "graph.name", f"unknown graph {name!r}; known: watts_strogatz, regular, edges"
    )


def check_graph(
    name: str, n: int, *, seed: int, k: int, p: float, degree: int, path: str | None
) -> None:
    """Config time: the graph the run will draw (with its seed) is drawn and must be connected,
    its sizes right and an edge-list file readable. The drawing is cheap (no P, no sigma_2):
    a random graph that comes out disconnected (a 2-regular one is a union of cycles) is an
    error before any work, as an edge list is."""
    _connected(_nx_graph(name, n, k=k, p=p, degree=degree, path=path, seed=seed), name)


def _connected(g, name: str):  # type: ignore[no-untyped-def]
    import networkx as nx

    if not nx.is_connected(g):
        parts = nx.number_connected_components(g)
        raise ConfigError(
            "graph",
            f"the {name} graph is disconnected ({parts} components): the walk "
            "could never reach every client",
        )
    return g


def transition_matrix(adjacency: np.ndarray, kind: str) -> np.ndarray:
    """The random walk's ``P`` from a 0/1 symmetric adjacency matrix (module docstring)."""
    a = np.asarray(adjacency, dtype=np.float64)
    deg = a.sum(1)
    if (deg == 0).any():
        raise ConfigError("graph", "a client has no neighbour")
    if kind == "simple":
        return a / deg[:, None]
    if kind == "metropolis":
        p = a * np.minimum(1.0 / deg[:, None], 1.0 / deg[None, :])
        p[np.diag_indices_from(p)] = 1.0 - p.sum(1)
        return p
    raise ConfigError("graph.walk", f"unknown walk {kind!r}; known: simple, metropolis")


def second_eigenvalue_modulus(p: np.ndarray) -> float:
    """``sigma_2(P)``: the second-largest modulus among P's eigenvalues."""
    moduli = np.sort(np.abs(np.linalg.eigvals(p)))[::-1]
    return float(moduli[1]) if moduli.size > 1 else 0.0


def stationary_distribution(p: np.ndarray) -> np.ndarray:
    """The walk's stationary distribution (left eigenvector of P for eigenvalue 1)."""
    values, vectors = np.linalg.eig(p.T)
    v = np.real(vectors[:, np.argmin(np.abs(values - 1.0))])
    return v / v.sum()


@dataclass(frozen=True)
class Graph:
    """A connected communication graph and its walk (picklable: workers receive it).

    Attributes:
        neighbours: per client, its neighbours' ids (sorted).
        transition: the walk's transition matrix P.
        sigma2: ``sigma_2(P)``.
    """

    neighbours: tuple[tuple[int, ...], ...]
    transition: np.ndarray = field(repr=False)
    sigma2: float
    name: str = ""

    @property
    def num_nodes(self) -> int:
        return len(self.neighbours)

    def degree(self, i: int) -> int:
        return len(self.neighbours[i])

    def start(self, rng: np.random.Generator) -> int:
        """The walk's first client, uniform over the clients."""
        return int(rng.integers(self.num_nodes))

    def step(self, position: int, rng: np.random.Generator) -> int:
        """The client the walk moves to from ``position`` (one draw from row P[position])."""
        row = self.transition[position]
        return int(rng.choice(self.num_nodes, p=row / row.sum()))


def build_graph(
    name: str,
    n: int,
    *,
    seed: int,
    k: int = 4,
    p: float = 0.3,
    degree: int = 3,
    path: str | None = None,
    walk: str = "simple",
) -> Graph:
    """The graph the config names over ``n`` clients, drawn with ``seed`` (module docstring).

    Raises:
        ConfigError: bad sizes, an unreadable edge list, or a disconnected graph.
    """
    import networkx as nx

    g = _connected(_nx_graph(name, n, k=k, p=p, degree=degree, path=path, seed=seed), name)
    adjacency = nx.to_numpy_array(g, nodelist=range(n), dtype=np.float64)
    adjacency = (adjacency > 0).astype(np.float64)
    np.fill_diagonal(adjacency, 0.0)
    pmat = transition_matrix(adjacency, walk)
    pmat.setflags(write=False)
    neighbours = tuple(tuple(int(j) for j in np.flatnonzero(adjacency[i])) for i in range(n))
    return Graph(neighbours, pmat, second_eigenvalue_modulus(pmat), name)
