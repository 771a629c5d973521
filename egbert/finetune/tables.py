"""The Markdown results tables that `egbert finetune`, `egbert probe` and `egbert prompt-eval`
print: each command's rows are a small dataclass whose fields are the columns (`column`), and
`results_table` writes them, with the GLUE average as a last row. `glue_score_table` is the
table of several models' scores side by side, a column per task (quickstart's results)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import field, fields
from typing import Any

from egbert.finetune.metrics import GlueAverage, glue_average
from egbert.finetune.tasks import SCORED_TASKS


def percent(value: float | None) -> str:
    """A fraction as a percentage with two decimals; "" for None."""
    return "" if value is None else f"{100 * value:.2f}"


def one_decimal(value: float) -> str:
    return f"{value:.1f}"


def column(title: str, cell: Callable[[Any], str] = str, *, numeric: bool = False) -> Any:
    """A field of a results row: its column's title, how a value is written (`cell`) and whether
    the column is right-aligned (`numeric`)."""
    return field(metadata={"title": title, "cell": cell, "numeric": numeric})


def results_table(
    row_type: type, rows: Sequence[Any], average: GlueAverage | None = None, average_label: str = ""
) -> str:
    """A Markdown table of `rows` (instances of the dataclass `row_type`, one column a field), and
    with `average` over more than one task a last row: `average_label (the tasks)` and the
    average under the `score` column."""
    columns = fields(row_type)
    lines = [
        _table_line(column.metadata["title"] for column in columns),
        "|" + "|".join("---:" if column.metadata["numeric"] else "---" for column in columns) + "|",
    ]
    for row in rows:
        lines.append(
            _table_line(column.metadata["cell"](getattr(row, column.name)) for column in columns)
        )
    if average is not None and len(average.tasks) > 1:
        every = len(average.tasks) == len(SCORED_TASKS)
        label = f"{average_label} ({'all nine tasks' if every else ', '.join(average.tasks)})"
        cells = {columns[0].name: f" {label} ", "score": f" {percent(average.score)} "}
        lines.append("|" + "|".join(cells.get(column.name, " ") for column in columns) + "|")
    return "\n".join(lines)


def metric_header(task: str) -> str:
    """A task's column title: its name and the GLUE score it shows."""
    metric = {"cola": "Matthews", "mrpc": "F1/acc", "qqp": "F1/acc", "stsb": "Pearson/Spearman"}
    return f"{task} ({metric.get(task, 'acc')})"


def glue_score_table(
    rows: Mapping[str, Mapping[str, float]],
    tasks: Sequence[str],
    leave_out: Collection[str] = (),
    extra: Mapping[str, Mapping[str, str]] | None = None,
) -> str:
    """Markdown: one row per label, a column per task (its GLUE score x 100), the GLUE average
    over the tasks not in `leave_out`, then those marked * (and any `extra` column, label ->
    cell, e.g. per-seed averages)."""
    averaged = [task for task in tasks if task not in leave_out]
    apart = [task for task in tasks if task in leave_out]
    columns = [*map(metric_header, averaged), "average", *(f"{metric_header(t)}*" for t in apart)]
    columns += list(extra or {})
    lines = ["| model | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    for label, scores in rows.items():
        average = glue_average({task: scores[task] for task in averaged})
        cells = [f"{100 * scores[task]:.1f}" for task in averaged]
        cells.append("" if average is None else f"{100 * average.score:.1f}")
        cells += [f"{100 * scores[task]:.1f}" for task in apart]
        cells += [values.get(label, "") for values in (extra or {}).values()]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if apart:
        lines.append("")
        lines.append(f"\\* not averaged: {', '.join(apart)} dev sets do not move at this scale.")
    return "\n".join(lines)


def _table_line(cells: Iterable[str]) -> str:
    return "| " + " | ".join(cells) + " |"
