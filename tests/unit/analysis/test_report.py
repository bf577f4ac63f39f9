"""render_report: a pure function from ReportData to one self-contained, escaped HTML page."""

from __future__ import annotations

import io
import math
import re
from html.parser import HTMLParser

import numpy as np
import pandas as pd

from analysis.fronts import analyse_front
from analysis.pareto import Objective
from analysis.report import AttackGrid, ReportData, SweepInfo, render_report, run_url

ACC, EPS = Objective("accuracy", "max"), Objective("epsilon", "min")
TABLE1 = {
    "params.dataset": "fmnist",
    "params.num_clients": 20,
    "params.client_fraction": 1.0,
    "params.rounds": 200,
    "params.partition.name": "dominant",
    "params.partition.s": 20.0,
    "params.samples_per_client": 600,
}


def png() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.arange(64, dtype=np.uint8).reshape(8, 8)).save(buf, format="PNG")
    return buf.getvalue()


def runs(**over: object) -> pd.DataFrame:
    rows = [
        ("h1", "hyperfl", 0.88, math.inf, 4.8e8, "FINISHED"),
        ("f1", "fedavg", 0.86, math.inf, 3.7e6, "FINISHED"),
        ("l1", "local", 0.85, 0.0, 0.0, "FINISHED"),
        ("x1", "<script>alert(1)</script>", 0.2, 1.0, 0.0, "FAILED"),
    ]
    df = pd.DataFrame(
        rows, columns=["run_id", "algorithm", "accuracy", "epsilon", "bytes_up", "status"]
    )
    df["bytes_down"] = df["bytes_up"]
    df["experiment_id"] = "7"
    df["dataset"] = "fmnist"
    df["failure_reason"] = [None, None, None, "error"]
    df["params.algorithm"] = df["algorithm"]
    df["params.seed"] = 0
    df["tags.fedsweep.git_commit"] = "abc123"
    for key, value in (TABLE1 | over).items():
        df[key] = value
    return df


def data(frame: pd.DataFrame, **kw: object) -> ReportData:
    fields = {
        "title": "report <of> tests",
        "experiments": [("exp", "7")],
        "tracking_uri": "sqlite:///x.db",
        "mlflow_url": "http://mlflow.example:5000/",
        "generated": "now",
        "runs": frame,
        "analysis": analyse_front(frame, [ACC, EPS]),
        "pareto_png": png(),
        "pareto_html": "<div id='plotly-here'></div>",
        "generator": {"fedsweep": "0.1.0"},
    }
    return ReportData(**(fields | kw))  # type: ignore[arg-type]


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.imgs: list[str] = []
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(str(a["id"]))
        if tag == "img":
            self.imgs.append(str(a.get("src")))
        if tag == "a" and a.get("href"):
            self.links.append(str(a["href"]))


def parse(html: str) -> _Collect:
    p = _Collect()
    p.feed(html)
    return p


def test_every_section_and_self_contained_images() -> None:
    grid = AttackGrid("f1", "fedavg", png())
    sweep = SweepInfo("s", "p1", "7", {"sweep.algorithms": "fedavg,local"}, {"name": "s"})

    html = render_report(data(runs(), attack_grids=[grid], sweeps=[sweep], curves_png=png()))
    page = parse(html)

    for section in ("summary", "spec", "pareto", "front", "best", "communication", "curves"):
        assert section in page.ids
    for section in ("attacks", "paper", "provenance", "front-table", "pareto-png"):
        assert section in page.ids
    assert len(page.imgs) == 3 and all(s.startswith("data:image/png;base64,") for s in page.imgs)
    assert "<div id='plotly-here'></div>" in html  # the plotly div, not escaped
    assert "comm-curves" not in page.ids  # no decentralized run: no communication plot
    assert not re.search(r'<(img|script)[^>]+src="(?!data:)', html)  # nothing fetched


def test_decentralized_runs_get_accuracy_against_communication() -> None:
    page = parse(render_report(data(runs(), comm_png=png())))
    assert {"comm-curves", "comm-png"} <= page.ids
    assert any(s.startswith("data:image/png;base64,") for s in page.imgs)


def test_run_ids_link_to_the_mlflow_ui() -> None:
    page = parse(render_report(data(runs())))

    url = run_url("http://mlflow.example:5000/", "7", "l1")
    assert url == "http://mlflow.example:5000/#/experiments/7/runs/l1"
    assert url in page.links


def test_failed_runs_are_counted_and_text_is_escaped() -> None:
    html = render_report(data(runs()))

    assert "<script>alert(1)</script>" not in html
    assert "4 runs" in html and "error × 1" in html
    assert "report &lt;of&gt; tests" in html


def test_paper_figures_beside_ours_in_the_papers_setting() -> None:
    html = render_report(data(runs()))

    assert "88.28" in html and "85.93" in html  # hyperfl, local in Table 1 setting
    assert "No run matches a Table 1 setting" not in html
    assert "reports no attack figure for fmnist" in html


def test_paper_table_shows_the_before_training_accuracy_where_logged() -> None:
    frame = runs()
    frame["accuracy_before"] = [None, 0.8533, None, None]  # only the FedAvg run logged it

    html = render_report(data(frame))

    row = re.search(r"<tr><td>[^<]*</td><td>fedavg</td>(.*?)</tr>", html)
    assert row is not None
    assert [c for c in re.findall(r"<td>([^<]*)</td>", row.group(1))] == [
        "1",
        "86",
        "85.33",
        "85.67",
    ]
    assert "ours (before)" in html


def test_other_settings_say_so_instead_of_showing_a_figure() -> None:
    html = render_report(data(runs(**{"params.rounds": 3})))

    assert "No run matches a Table 1 setting" in html and "88.28" not in html


def test_without_a_sweep_attacks_or_history_the_page_says_what_is_missing() -> None:
    html = render_report(data(runs(), pareto_html=None))

    assert "not started by a sweep" in html
    assert "No run of these experiments ran a privacy attack" in html
    assert "No round-by-round history" in html
    assert "pareto-interactive" not in html


def test_one_objective_has_no_plot_and_three_draw_the_first_two() -> None:
    frame = runs()
    one = render_report(
        data(frame, analysis=analyse_front(frame, [ACC]), pareto_png=None, pareto_html=None)
    )
    three = render_report(
        data(frame, analysis=analyse_front(frame, [ACC, EPS, Objective("bytes_up", "min")]))
    )

    assert "front-table" in parse(one).ids and "a 2-D front needs two objectives" in one
    assert "Only the first two objectives are drawn" in three
    assert "<th>bytes_up</th>" in three
