"""quickstart's results: typed table rows, the Markdown tables, the plot, and results.md/.json."""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from egbert.families import MODEL_FAMILIES
from egbert.finetune import significance
from egbert.finetune.metrics import glue_average
from egbert.finetune.significance import Difference
from egbert.finetune.tables import glue_score_table
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


@dataclass(frozen=True)
class FinetuneRun:
    """One fine-tuning run of a model on a task with a seed: its dev score and every dev
    example's prediction (empty for a run written before egbert kept them)."""

    score: float
    dev_predictions: dict[str, Any]


def averaged_tasks(tasks: Sequence[str]) -> list[str]:
    """The tasks that averages hold: all but those NOT_AVERAGED."""
    return [task for task in tasks if task not in NOT_AVERAGED]


def task_average(scores: Mapping[str, float]) -> float | None:
    """The GLUE average of a row's scores over its averaged tasks (None: no such task)."""
    average = glue_average(scores, leave_out=NOT_AVERAGED)
    return None if average is None else average.score


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


def plot_results(
    path: Path,
    scores: Mapping[str, Mapping[str, float]],
    tasks: Sequence[str],
    comparisons: Mapping[str, Mapping[str, Difference]],
):
    """Grouped bars of the fine-tuning scores (one group per task, and the average) and, below,
    each pretrained model's margin over its twin with its 95% interval."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers
    import matplotlib.pyplot as plt

    groups = [*tasks, "average"]
    figure, (axes, margins) = plt.subplots(2, 1, figsize=(max(6, 1.4 * len(groups)), 7.5))
    scored = {
        label: [100 * by_task[t] for t in tasks] + [100 * (task_average(by_task) or 0.0)]
        for label, by_task in scores.items()
    }
    _bars(axes, scored, groups)
    axes.set_ylabel("dev score (GLUE metric x 100)")
    axes.set_title("fine-tuning", fontsize="medium")
    shown = {name: [found.get(g) for g in groups] for name, found in comparisons.items()}
    _bars(margins, {name: [d.points if d else 0.0 for d in row] for name, row in shown.items()},
          groups, shown)  # fmt: skip
    margins.set_ylabel("pretrained - twin (points, 95% interval)")
    margins.set_title("what pretraining bought", fontsize="medium")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _bars(axes, heights: Mapping[str, Sequence[float]], groups: Sequence[str], intervals=None):
    """One bar per label in each group, with the `intervals` (Differences) as error bars where
    given."""
    width = 0.8 / max(len(heights), 1)
    for index, (label, row) in enumerate(heights.items()):
        positions = [g + (index - (len(heights) - 1) / 2) * width for g in range(len(groups))]
        spans = None
        if intervals is not None:
            found = intervals[label]
            spans = [[d.points - d.low if d else 0 for d in found],
                     [d.high - d.points if d else 0 for d in found]]  # fmt: skip
        axes.bar(positions, row, width, label=label, yerr=spans, capsize=3)
    axes.set_xticks(range(len(groups)), groups)
    axes.axhline(0, color="black", linewidth=0.5)
    axes.legend(fontsize="small")


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


def finetune_predictions(runs: Mapping[str, Mapping[int, FinetuneRun]]) -> dict[str, Any]:
    """{task: its seeds' dev predictions pooled} of a fine-tuned row (tasks some of whose
    runs kept none are left out)."""
    return {
        task: significance.pooled(
            [significance.one_seed(run.dev_predictions) for run in seeds.values()]
        )
        for task, seeds in runs.items()
        if all(run.dev_predictions for run in seeds.values())
    }


def evaluation_predictions(evaluation: Evaluation, shots: int | None = None) -> dict[str, Any]:
    """{task: dev predictions} of a probe run, or of a prompt run's `shots` setting."""
    found = {}
    for task, result in evaluation.results["tasks"].items():
        entry = result if shots is None else result["shots"][str(shots)]
        if "dev_predictions" in entry:
            found[task] = significance.one_seed(entry["dev_predictions"])
    return found


def majority_predictions(evaluation: Evaluation, predictions: Mapping[str, Any]) -> dict:
    """The majority class answering the same dev examples (classification tasks only)."""
    labels = {task: r.get("majority_label") for task, r in evaluation.results["tasks"].items()}
    return {
        task: significance.constant_predictions(found, labels[task])
        for task, found in predictions.items()
        if labels.get(task) is not None
    }


def twin_comparisons(
    finetune: Mapping[Row, Mapping[str, Mapping[int, FinetuneRun]]],
    probes: Mapping[Row, Evaluation],
    prompts: Mapping[Row, Evaluation],
    tasks: Sequence[str],
) -> dict[str, dict[str, Difference]]:
    """Each pretrained model against its twin, per task and on average, with intervals: bert's
    fine-tuned rows (every head; seeds pooled), every family's probe, gpt's prompts."""
    averaged = averaged_tasks(tasks)
    pairs = {
        f"fine-tuning, {row.label}": (finetune_predictions(finetune[row]),
                                      finetune_predictions(finetune[row.twin()]))
        for row in finetune
        if row.pretrained and row.twin() in finetune
    }  # fmt: skip
    pairs |= {
        f"probe, {row.label}": (
            evaluation_predictions(run),
            evaluation_predictions(probes[row.twin()]),
        )
        for row, run in probes.items()
        if row.pretrained
    }
    pairs |= {
        f"prompting, {replace(row, shots=k).label}": (
            evaluation_predictions(run, k),
            evaluation_predictions(prompts[row.twin()], k),
        )
        for row, run in prompts.items()
        if row.pretrained
        for k in PROMPT_SHOTS
    }
    return {name: significance.compare(a, b, averaged) for name, (a, b) in pairs.items() if a and b}


def majority_comparisons(
    probes: Mapping[Row, Evaluation], prompts: Mapping[Row, Evaluation], tasks: Sequence[str]
) -> dict[str, dict[str, Difference]]:
    """Every probe and prompt row against the majority class, per task."""
    runs = [(row, run, None) for row, run in probes.items()]
    runs += [(replace(row, shots=k), run, k) for row, run in prompts.items() for k in PROMPT_SHOTS]
    found = {}
    for row, run, shots in runs:
        predictions = evaluation_predictions(run, shots)
        majority = majority_predictions(run, predictions)
        if majority:
            found[row.label] = significance.compare(predictions, majority)
    return found


def majority_column(against: Mapping[str, Mapping[str, Difference]]) -> dict[str, str]:
    """A probe or prompt table's "vs majority class" column: on how many tasks each row beats
    the majority class by more than the noise ("none: as the majority class" when on none)."""
    column = {}
    for label, differences in against.items():
        wins = sum(d.ahead for d in differences.values())
        column[label] = f"{wins} of {len(differences)}" if wins else "none: as the majority class"
    return column


def score_table(
    rows: Mapping[str, Mapping[str, float]],
    tasks: Sequence[str],
    extra: Mapping[str, Mapping[str, str]] | None = None,
) -> str:
    """A results table of quickstart's: the GLUE score table, NOT_AVERAGED left out of the
    average."""
    return glue_score_table(rows, tasks, NOT_AVERAGED, extra)


def write_report(
    output_dir: Path,
    tasks: list[str],
    prompt_tasks: list[str],
    pretraining: Mapping[str, PretrainingSummary],
    finetune: Mapping[Row, Mapping[str, Mapping[int, FinetuneRun]]],
    probes: Mapping[Row, Evaluation],
    prompts: Mapping[Row, Evaluation],
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    """Every table to results.md/.json (and the fine-tuning scores and margins to results.png),
    printed; `extra` (the plan, the minutes) goes into results.json as it is. Prompts that were
    skipped (the probe had spent the evaluation's share of the budget) get a line instead of a
    table. Every margin over a twin, and every probe and prompt row against the majority class,
    comes with its paired bootstrap interval (egbert.finetune.significance)."""
    scores = {row: seed_scores(runs) for row, runs in finetune.items()}
    finetuned = {row: seed_means(runs) for row, runs in scores.items()}
    per_seed = seed_column(scores, tasks)
    probed, majority = probe_scores(probes, tasks)
    prompted = prompt_scores(prompts, prompt_tasks)
    against_twin = twin_comparisons(finetune, probes, prompts, tasks)
    against_majority = majority_comparisons(probes, prompts, tasks)
    by_label = labelled(finetuned)
    beats_majority = {"vs majority class": majority_column(against_majority)}
    tables = {
        "pretraining": pretraining_table(pretraining),
        "fine-tuning": score_table(by_label, tasks, {"seeds": per_seed} if per_seed else None),
        "probe": score_table(
            {**labelled(probed), "majority class": majority}, tasks, beats_majority
        ),
    }
    notes = {"probe": sizes_note(probes, "Training examples")}
    if prompts:
        tables["k-shot prompting"] = score_table(labelled(prompted), prompt_tasks, beats_majority)
        notes["k-shot prompting"] = sizes_note(prompts, "Dev examples")
    else:
        tables["k-shot prompting"] = "skipped: the probe had spent the evaluation's share."
    comparison_tables(tables, notes, against_twin, against_majority, tasks)
    margins = margins_over_twins(finetuned, probed)
    report = {
        **extra,
        "tasks": tasks,
        "not_averaged": [t for t in tasks if t in NOT_AVERAGED],
        "pretraining": {family: asdict(summary) for family, summary in pretraining.items()},
        "scores": by_label,
        "finetune_by_seed": labelled(scores),
        "probe": labelled(probed),
        "probe_majority": majority,
        "prompting": labelled(prompted),
        "evaluation_sizes": {
            "probe": {row.label: run.size for row, run in probes.items()},
            "prompting": {row.label: run.size for row, run in prompts.items()},
        },
        "margins_over_twin": margins,
        "intervals": intervals(against_twin, against_majority),
        "summary": [
            significance.summary_line(name, "its twin", differences)
            for name, differences in against_twin.items()
        ],
        "tables": tables,
    }
    write_files(output_dir, report, notes, against_twin)
    return report


def write_files(
    output_dir: Path,
    report: Mapping[str, Any],
    notes: Mapping[str, str],
    against_twin: Mapping[str, Mapping[str, Difference]],
) -> None:
    """results.md (printed too, with the summary lines), results.json and results.png."""
    markdown = "\n\n".join(
        f"## {name}\n\n{table}" + (f"\n\n{notes[name]}" if name in notes else "")
        for name, table in report["tables"].items()
    )
    (output_dir / "results.md").write_text(markdown + "\n", encoding="utf-8")
    (output_dir / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    plot_results(output_dir / "results.png", report["scores"], report["tasks"], against_twin)
    print(markdown)
    print("\n" + "\n".join(report["summary"]), flush=True)


def seed_scores(runs: Mapping[str, Mapping[int, FinetuneRun]]) -> dict[str, dict[int, float]]:
    """A fine-tuned row's {task: {seed: score}}."""
    return {
        task: {seed: run.score for seed, run in by_seed.items()} for task, by_seed in runs.items()
    }


def seed_means(runs: Mapping[str, Mapping[int, float]]) -> dict[str, float]:
    return {task: statistics.mean(by_seed.values()) for task, by_seed in runs.items()}


def comparison_tables(
    tables: dict[str, str],
    notes: dict[str, str],
    against_twin: Mapping[str, Mapping[str, Difference]],
    against_majority: Mapping[str, Mapping[str, Difference]],
    tasks: Sequence[str],
) -> None:
    """Add the tables of the margins over the twins and over the majority class."""
    twin = "pretrained against its twin"
    tables[twin] = significance.comparison_table(against_twin, tasks, "the twin")
    notes[twin] = NOISE_NOTE
    tables["against the majority class"] = significance.comparison_table(
        against_majority, tasks, "the majority class"
    )


def intervals(
    against_twin: Mapping[str, Mapping[str, Difference]],
    against_majority: Mapping[str, Mapping[str, Difference]],
) -> dict[str, Any]:
    """results.json's intervals: each comparison's per-task and average differences."""
    return {
        "twin": as_dicts(against_twin),
        "majority_class": as_dicts(against_majority),
        "samples": significance.SAMPLES,
        "confidence": significance.CONFIDENCE,
    }


NOISE_NOTE = (
    "Points of the GLUE metric, pretrained minus twin, with the 95% interval of a paired "
    f"bootstrap over the dev examples ({significance.SAMPLES} draws; fine-tuning seeds pooled). "
    "A difference is real where its interval excludes 0. The interval holds the dev sets' "
    "noise, not training's: docs/results.md compares two whole runs for that."
)


def as_dicts(comparisons: Mapping[str, Mapping[str, Difference]]) -> dict[str, Any]:
    return {
        name: {task: difference.as_dict() for task, difference in differences.items()}
        for name, differences in comparisons.items()
    }


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
