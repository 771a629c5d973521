"""The results tables: each field of a row a column, written as its column says, and the GLUE
average as the last row."""

from __future__ import annotations

from dataclasses import dataclass

from egbert.finetune.metrics import GlueAverage, format_metrics
from egbert.finetune.tables import column, percent, results_table
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
