"""quickstart's results: typed table rows, the Markdown tables (public: scripts/recipe_compare.py
prints its scores with `score_table`), the plot, and results.md/.json."""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from egbert.finetune.metrics import glue_average
from egbert.models.families import MODEL_FAMILIES
from egbert.quickstart.options import NOT_AVERAGED, PROMPT_SHOTS
from egbert.quickstart.steps import PretrainingSummary


@dataclass(frozen=True)
class Row:
    """A row of quickstart's tables: a family's pretrained model or its twin at random initial
    weights, and where a table has several rows per model, the head or the number of shots."""

    family: str
    pretrained: bool = True
    head: str | None = None
    shots: int | None = None

    @property
    def label(self) -> str:
        """`bert`, `bert (no pretraining)`, `bert, cls-frozen`, `gpt, 4-shot`, ..."""
        parts = [self.family if self.pretrained else f"{self.family} (no pretraining)"]
        if self.head is not None:
            parts.append(self.head)
        if self.shots is not None:
            parts.append(f"{self.shots}-shot")
        return ", ".join(parts)

    def twin(self) -> Row:
        return replace(self, pretrained=False)


@dataclass(frozen=True)
class Evaluation:
    """A probe or prompt-eval run of one model: its results as the command returns them, and
    its examples per task (the probe's training examples, the prompts' dev examples)."""

    results: dict[str, Any]
    size: int


def averaged_tasks(tasks: Sequence[str]) -> list[str]:
    """The tasks that averages hold: all but those NOT_AVERAGED."""
    return [task for task in tasks if task not in NOT_AVERAGED]


def task_average(scores: Mapping[str, float]) -> float | None:
    """The GLUE average of a row's scores over its averaged tasks (None: no such task)."""
    average = glue_average(scores, leave_out=NOT_AVERAGED)
    return None if average is None else average.score


def metric_header(task: str) -> str:
    metric = {"cola": "Matthews", "mrpc": "F1/acc", "qqp": "F1/acc", "stsb": "Pearson/Spearman"}
    return f"{task} ({metric.get(task, 'acc')})"


def score_table(
    rows: Mapping[str, Mapping[str, float]],
    tasks: Sequence[str],
    extra: Mapping[str, Mapping[str, str]] | None = None,
) -> str:
    """Markdown: one row per label, a column per task (GLUE score x 100), the average over the
    tasks not NOT_AVERAGED, then those (and any `extra` column, e.g. per-seed averages)."""
    averaged = averaged_tasks(tasks)
    apart = [t for t in tasks if t in NOT_AVERAGED]
    columns = [*map(metric_header, averaged), "average", *(f"{metric_header(t)}*" for t in apart)]
    columns += list(extra or {})
    lines = ["| model | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    for label, scores in rows.items():
        average = task_average({t: scores[t] for t in averaged})
        cells = [f"{100 * scores[t]:.1f}" for t in averaged]
        cells.append("" if average is None else f"{100 * average:.1f}")
        cells += [f"{100 * scores[t]:.1f}" for t in apart]
        cells += [values.get(label, "") for values in (extra or {}).values()]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if apart:
        lines.append("")
        lines.append(f"\\* not averaged: {', '.join(apart)} dev sets do not move at this scale.")
    return "\n".join(lines)


def pretraining_table(pretraining: Mapping[str, PretrainingSummary]) -> str:
    lines = ["| model | steps | tokens | minutes | validation |", "|---|---:|---:|---:|---|"]
    shown = ("mlm_loss", "mlm_accuracy", "nsp_accuracy", "perplexity")
    for family, summary in pretraining.items():
        metrics = ", ".join(f"{k} {v:.4g}" for k, v in summary.eval.items() if k in shown)
        tokens = f"{summary.tokens:,}" if summary.tokens is not None else "?"
        lines.append(
            f"| {family} | {summary.steps:,} | {tokens} | {summary.minutes:.1f} "
            f"| {metrics or 'none'} |"
        )
    return "\n".join(lines)


def sizes_note(evaluations: Mapping[Row, Evaluation], what: str) -> str:
    """One line saying how many examples per task each model's evaluation used."""
    sizes = ", ".join(f"{row.label} {evaluation.size}" for row, evaluation in evaluations.items())
    return f"{what} per task (at most): {sizes}."


def plot_results(path: Path, scores: Mapping[str, Mapping[str, float]], tasks: Sequence[str]):
    """Grouped bars of the fine-tuning scores: one group per task (and the average)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers
    import matplotlib.pyplot as plt

    groups = [*tasks, "average"]
    width = 0.8 / max(len(scores), 1)
    figure, axes = plt.subplots(figsize=(max(6, 1.4 * len(groups)), 4))
    for index, (label, by_task) in enumerate(scores.items()):
        values = [100 * by_task[t] for t in tasks]
        values.append(100 * (task_average(by_task) or 0.0))
        positions = [g + (index - (len(scores) - 1) / 2) * width for g in range(len(groups))]
        axes.bar(positions, values, width, label=label)
    axes.set_xticks(range(len(groups)), groups)
    axes.axhline(0, color="black", linewidth=0.5)
    axes.set_ylabel("dev score (GLUE metric x 100)")
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def seed_averages(runs: Mapping[str, Mapping[int, float]], tasks: Sequence[str]) -> list[float]:
    """The task average of each fine-tuning seed that every averaged task was run with."""
    averaged = averaged_tasks(tasks)
    common = set.intersection(*(set(runs[task]) for task in averaged))
    return [task_average({t: runs[t][seed] for t in averaged}) for seed in sorted(common)]


def margins_over_twins(
    finetuned: Mapping[Row, Mapping[str, float]], probed: Mapping[Row, Mapping[str, float]]
) -> dict[str, float]:
    """Average points each pretrained model gains over its twin: bert's fine-tuning rows (every
    head) and every family's probe."""
    pairs = [(f"fine-tuning, {r.label}", finetuned, r) for r in finetuned if r.pretrained]
    pairs = [pair for pair in pairs if pair[2].family == "bert"]
    pairs += [(f"probe, {family}", probed, Row(family)) for family in MODEL_FAMILIES]
    return {
        name: round(100 * (task_average(scores[row]) - task_average(scores[row.twin()])), 2)
        for name, scores, row in pairs
    }


def write_report(
    output_dir: Path,
    tasks: list[str],
    prompt_tasks: list[str],
    pretraining: Mapping[str, PretrainingSummary],
    finetune: Mapping[Row, Mapping[str, Mapping[int, float]]],
    probes: Mapping[Row, Evaluation],
    prompts: Mapping[Row, Evaluation],
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    """Every table to results.md/.json (and the fine-tuning scores to results.png), printed;
    `extra` (the plan, the minutes) goes into results.json as it is. Prompts that were skipped
    (the probe had spent the evaluation's share of the budget) get a line instead of a table."""
    finetuned = {
        row: {task: statistics.mean(by_seed.values()) for task, by_seed in runs.items()}
        for row, runs in finetune.items()
    }
    per_seed = seed_column(finetune, tasks)
    probed, majority = probe_scores(probes, tasks)
    prompted = prompt_scores(prompts, prompt_tasks)
    by_label = {row.label: scores for row, scores in finetuned.items()}
    tables = {
        "pretraining": pretraining_table(pretraining),
        "fine-tuning": score_table(by_label, tasks, {"seeds": per_seed} if per_seed else None),
        "probe": score_table({**labelled(probed), "majority class": majority}, tasks),
    }
    notes = {"probe": sizes_note(probes, "Training examples")}
    if prompts:
        tables["k-shot prompting"] = score_table(labelled(prompted), prompt_tasks)
        notes["k-shot prompting"] = sizes_note(prompts, "Dev examples")
    else:
        tables["k-shot prompting"] = "skipped: the probe had spent the evaluation's share."
    margins = margins_over_twins(finetuned, probed)
    report = {
        **extra,
        "tasks": tasks,
        "not_averaged": [t for t in tasks if t in NOT_AVERAGED],
        "pretraining": {family: asdict(summary) for family, summary in pretraining.items()},
        "scores": by_label,
        "finetune_by_seed": labelled(finetune),
        "probe": labelled(probed),
        "probe_majority": majority,
        "prompting": labelled(prompted),
        "evaluation_sizes": {
            "probe": {row.label: run.size for row, run in probes.items()},
            "prompting": {row.label: run.size for row, run in prompts.items()},
        },
        "margins_over_twin": margins,
        "tables": tables,
    }
    markdown = "\n\n".join(
        f"## {name}\n\n{table}" + (f"\n\n{notes[name]}" if name in notes else "")
        for name, table in tables.items()
    )
    (output_dir / "results.md").write_text(markdown + "\n", encoding="utf-8")
    (output_dir / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    plot_results(output_dir / "results.png", by_label, tasks)
    print(markdown)
    gains = ", ".join(f"{name} {value:+.1f}" for name, value in margins.items())
    print(f"\npretrained against untrained twin (average points): {gains}", flush=True)
    return report


def seed_column(
    finetune: Mapping[Row, Mapping[str, Mapping[int, float]]], tasks: list[str]
) -> dict[str, str]:
    """The fine-tuning table's "seeds" column: each seed's average, for rows run with several."""
    return {
        row.label: " / ".join(f"{100 * value:.1f}" for value in seed_averages(runs, tasks))
        for row, runs in finetune.items()
        if len(seed_averages(runs, tasks)) > 1
    }


def probe_scores(
    probes: Mapping[Row, Evaluation], tasks: list[str]
) -> tuple[dict[Row, dict[str, float]], dict[str, float]]:
    """Each probed model's score per task, and the majority class's (the probe's floor)."""
    probed = {
        row: {t: run.results["tasks"][t]["score"] for t in tasks} for row, run in probes.items()
    }
    # a regression task's constant prediction correlates with nothing: 0
    first = next(iter(probes.values())).results["tasks"]
    majority = {t: first[t]["majority_score"] or 0.0 for t in tasks}
    return probed, majority


def prompt_scores(
    prompts: Mapping[Row, Evaluation], prompt_tasks: list[str]
) -> dict[Row, dict[str, float]]:
    """Each prompted model's score per task, one row per number of demonstrations."""
    return {
        replace(row, shots=k): {
            t: run.results["tasks"][t]["shots"][str(k)]["score"] for t in prompt_tasks
        }
        for row, run in prompts.items()
        for k in PROMPT_SHOTS
    }


def labelled(by_row: Mapping[Row, Any]) -> dict[str, Any]:
    """The rows' labels as keys (for results.json and the tables)."""
    return {row.label: value for row, value in by_row.items()}
