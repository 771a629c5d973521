"""The results tables: each field of a row a column, written as its column says, and the GLUE
average as the last row."""

from __future__ import annotations

from dataclasses import dataclass

from egbert.finetune.metrics import GlueAverage, format_metrics
from egbert.finetune.tables import column, glue_score_table, percent, results_table
from egbert.finetune.tasks import SCORED_TASKS


@dataclass(frozen=True)
class ScoreRow:
    task: str = column("task")
    metrics: dict = column("dev metrics", format_metrics)
    score: float | None = column("score", percent, numeric=True)
    note: str = column("note")


def test_results_table_writes_each_field_as_a_column_and_the_glue_average_last() -> None:
    rows = [
        ScoreRow("rte", {"validation": {"accuracy": 0.5}}, 0.5, "x"),
        ScoreRow("stsb", {"validation": {"pearson": 0.2}}, None, ""),
    ]
    table = results_table(ScoreRow, rows, GlueAverage(0.375, ("rte", "stsb")), "GLUE average")
    assert table.splitlines() == [
        "| task | dev metrics | score | note |",
        "|---|---|---:|---|",
        "| rte | acc 50.00 | 50.00 | x |",
        "| stsb | pearson 20.00 |  |  |",
        "| GLUE average (rte, stsb) | | 37.50 | |",
    ]
    every = GlueAverage(0.5, tuple(SCORED_TASKS))
    last_line = results_table(ScoreRow, [], every, "average").splitlines()[-1]
    assert last_line == "| average (all nine tasks) | | 50.00 | |"
    one_task = results_table(ScoreRow, rows[:1], GlueAverage(0.5, ("rte",)), "average")
    assert len(one_task.splitlines()) == 3  # an average of one task is that task's row


def test_glue_score_table_averages_all_but_the_tasks_left_out_and_marks_them() -> None:
    """Two models on CoLA, STS-B (whose score is its two correlations' mean, already in the
    score given) and WNLI left out: the average is CoLA's and STS-B's, 0.5 x (0.2 + 0.6) and
    0.5 x (0.1 + 0.4); WNLI follows it, marked; the extra column goes last, blank where a
    model has no cell."""
    scores = {
        "bert": {"cola": 0.2, "stsb": 0.6, "wnli": 0.56},
        "twin": {"cola": 0.1, "stsb": 0.4, "wnli": 0.44},
    }
    table = glue_score_table(scores, ["cola", "stsb", "wnli"], ("wnli",), {"seeds": {"bert": "3"}})
    assert table.splitlines() == [
        "| model | cola (Matthews) | stsb (Pearson/Spearman) | average | wnli (acc)* | seeds |",
        "|---|---:|---:|---:|---:|---:|",
        "| bert | 20.0 | 60.0 | 40.0 | 56.0 | 3 |",
        "| twin | 10.0 | 40.0 | 25.0 | 44.0 |  |",
        "",
        r"\* not averaged: wnli dev sets do not move at this scale.",
    ]
    nothing_left_out = glue_score_table({"bert": scores["bert"]}, ["cola", "wnli"])
    assert nothing_left_out.splitlines()[-1] == "| bert | 20.0 | 56.0 | 38.0 |"


def test_glue_score_table_names_mrpc_and_qqp_by_f1_and_averages_nothing_when_all_are_left_out():
    """MRPC and QQP both left out: their columns say F1/acc, the average cell stays blank (no
    task to average), and the footnote names the two, comma-separated."""
    table = glue_score_table({"m": {"mrpc": 0.8, "qqp": 0.7}}, ["mrpc", "qqp"], ("mrpc", "qqp"))
    assert table.splitlines() == [
        "| model | average | mrpc (F1/acc)* | qqp (F1/acc)* |",
        "|---|---:|---:|---:|",
        "| m |  | 80.0 | 70.0 |",
        "",
        r"\* not averaged: mrpc, qqp dev sets do not move at this scale.",
    ]
