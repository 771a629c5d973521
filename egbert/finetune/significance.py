"""Which differences are real: paired bootstrap intervals over the dev examples.

Two runs scored on the same dev examples are compared the way Koehn (2004) and Dror et al.
(2018, "The Hitchhiker's Guide to Testing Statistical Significance in NLP") describe: draw the
dev examples with replacement SAMPLES times, score both runs on each draw with the task's GLUE
metric, and take the middle 95% of the differences as the interval. Where a run was repeated
with several seeds, each draw scores every seed on the same examples and averages them (the
seeds pooled). A task average's interval comes from the same draws: each draw's per-task
differences averaged. A difference is real when its interval excludes 0.

The interval measures the dev set's noise only: two trainings with other seeds can differ by
more (quickstart's docs/results.md records two whole runs for that).

Every job that scores dev examples (finetune, probe, prompt-eval) writes them, each task's
`dev_predictions`: {split: {"references": [...], "predictions": [...]}}, into its results file;
`compare_runs` reads two such folders.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import rankdata

from egbert.errors import DataError
from egbert.finetune.tasks import get_task

SAMPLES = 1000
CONFIDENCE = 0.95
RESULTS_FILES = ("eval_results.json", "probe_results.json", "prompt_eval_results.json")

# {split: (references, [predictions of each seed])}
Predictions = Mapping[str, tuple[Sequence, Sequence[Sequence]]]


@dataclass
class CompareArguments:
    """The options of `egbert compare`, the arguments of `compare_runs`."""

    _argument_group_name = None  # among the parser's own options

    run_a: str = field(
        metadata={"positional": True, "metavar": "RUN_A", "help": "output folder of the first run"}
    )
    run_b: str = field(
        metadata={"positional": True, "metavar": "RUN_B", "help": "output folder of the second run"}
    )
    samples: int = field(default=SAMPLES, metadata={"help": "bootstrap draws"})
    seed: int = field(default=0, metadata={"help": "seed of the draws"})


@dataclass(frozen=True)
class Difference:
    """A minus B in points (GLUE metric x 100), with its interval."""

    points: float
    low: float
    high: float

    @property
    def real(self) -> bool:
        return self.low > 0 or self.high < 0

    @property
    def ahead(self) -> bool:
        """A is ahead beyond the noise."""
        return self.real and self.points > 0

    @property
    def behind(self) -> bool:
        return self.real and self.points < 0

    def __str__(self) -> str:
        return f"{self.points:+.1f} [{self.low:+.1f}, {self.high:+.1f}]"

    def as_dict(self) -> dict[str, Any]:
        return {"points": self.points, "low": self.low, "high": self.high, "real": self.real}


def dev_predictions(split: str, references: Sequence, predictions: Sequence) -> dict[str, Any]:
    """A split's entry of `dev_predictions`, as the jobs write it (plain JSON numbers)."""
    return {split: {"references": _as_list(references), "predictions": _as_list(predictions)}}


def _as_list(values: Sequence) -> list:
    return np.asarray(values).tolist()


# ---------------------------------------------------------------- the metrics, on many draws


def _class_counts(values: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """(draws, classes): how often each class occurs in each draw."""
    return (values[..., None] == classes).sum(axis=1)


def _matthews(references: np.ndarray, predictions: np.ndarray) -> np.ndarray:
    """sklearn's multi-class Matthews correlation (0 where it is undefined), for each row."""
    classes = np.union1d(references, predictions)
    true, predicted = _class_counts(references, classes), _class_counts(predictions, classes)
    n = references.shape[1]
    correct = (references == predictions).sum(axis=1)
    covariance = correct * n - (true * predicted).sum(axis=1)
    spread = (n * n - (predicted**2).sum(axis=1)) * (n * n - (true**2).sum(axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(spread > 0, covariance / np.sqrt(spread.astype(float)), 0.0)


def _f1(references: np.ndarray, predictions: np.ndarray) -> np.ndarray:
    """F1 of class 1 (0 where nothing is predicted or true 1, as sklearn scores it)."""
    hits = ((predictions == 1) & (references == 1)).sum(axis=1)
    both = (predictions == 1).sum(axis=1) + (references == 1).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(both > 0, 2 * hits / both, 0.0)


def _pearson(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson's r of each row pair (0 where either row is constant, as the GLUE module has it)."""
    x = x - x.mean(axis=1, keepdims=True)
    y = y - y.mean(axis=1, keepdims=True)
    spread = np.sqrt((x * x).sum(axis=1) * (y * y).sum(axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(spread > 0, (x * y).sum(axis=1) / spread, 0.0)


def drawn_scores(metric: str, references: np.ndarray, predictions: np.ndarray) -> np.ndarray:
    """The task score (the mean of its GLUE metrics) of each row: (draws, examples) -> (draws,)."""
    if metric == "pearson_spearman":
        references, predictions = references.astype(float), predictions.astype(float)
        # a constant row's correlations are 0 (`_pearson`), as the GLUE module scores them
        ranks = _pearson(rankdata(predictions, axis=1), rankdata(references, axis=1))
        return (_pearson(predictions, references) + ranks) / 2
    accuracy = (references == predictions).mean(axis=1)
    if metric == "accuracy":
        return accuracy
    if metric == "accuracy_f1":
        return (accuracy + _f1(references, predictions)) / 2
    if metric == "matthews_correlation":
        return _matthews(references, predictions)
    raise ValueError(f"no bootstrap for the metric {metric!r}")


def _pooled_scores(metric: str, predictions: Predictions, draws: Mapping[str, np.ndarray]):
    """Each draw's score: per split the mean over the seeds, then the mean over the splits
    (MNLI's matched and mismatched), as the task score averages them."""
    per_split = []
    for split, (references, by_seed) in predictions.items():
        picked = draws[split]
        references = np.asarray(references)[picked]
        seeds = [drawn_scores(metric, references, np.asarray(seed)[picked]) for seed in by_seed]
        per_split.append(np.mean(seeds, axis=0))
    return np.mean(per_split, axis=0)


def _draws(predictions: Predictions, samples: int, rng: np.random.Generator):
    """(every example once, the bootstrap's draws) per split: index arrays of one row and of
    `samples` rows."""
    whole, drawn = {}, {}
    for split, (references, _) in predictions.items():
        count = len(references)
        whole[split] = np.arange(count)[None, :]
        drawn[split] = rng.integers(0, count, size=(samples, count))
    return whole, drawn


def _check_paired(task: str, a: Predictions, b: Predictions) -> None:
    for split in a.keys() | b.keys():
        if split not in a or split not in b:
            raise DataError(f"{task}: the runs were scored on different dev splits ({split})")
        if not np.array_equal(np.asarray(a[split][0]), np.asarray(b[split][0])):
            raise DataError(
                f"{task} {split}: the runs were scored on different dev examples; a paired "
                "comparison needs the same examples in the same order"
            )


def task_differences(
    task: str, a: Predictions, b: Predictions, samples: int, rng: np.random.Generator
) -> tuple[float, np.ndarray]:
    """(A's score - B's on every example, the same difference on each of `samples` draws)."""
    _check_paired(task, a, b)
    metric = get_task(task.split(",")[0]).metric  # "rte, 4-shot": rte's
    whole, drawn = _draws(a, samples, rng)
    observed = _pooled_scores(metric, a, whole) - _pooled_scores(metric, b, whole)
    return float(observed[0]), _pooled_scores(metric, a, drawn) - _pooled_scores(metric, b, drawn)


def interval(observed: float, drawn: np.ndarray, confidence: float = CONFIDENCE) -> Difference:
    """The percentile interval of the drawn differences, in points."""
    tail = 100 * (1 - confidence) / 2
    low, high = (float(bound) for bound in np.percentile(drawn, [tail, 100 - tail]))
    return Difference(round(100 * observed, 2), round(100 * low, 2), round(100 * high, 2))


def compare(
    a: Mapping[str, Predictions],
    b: Mapping[str, Predictions],
    averaged: Sequence[str] = (),
    samples: int = CompareArguments.samples,
    seed: int = CompareArguments.seed,
) -> dict[str, Difference]:
    """{task: A - B} for every task both hold, and {"average": ...} over the `averaged` tasks
    among them: the mean of the task differences, its interval from the same draws."""
    rng = np.random.default_rng(seed)
    tasks = [task for task in a if task in b]
    found = {task: task_differences(task, a[task], b[task], samples, rng) for task in tasks}
    differences = {task: interval(*found[task]) for task in tasks}
    in_average = [task for task in averaged if task in found]
    if in_average:
        observed = float(np.mean([found[task][0] for task in in_average]))
        drawn = np.mean([found[task][1] for task in in_average], axis=0)
        differences["average"] = interval(observed, drawn)
    return differences


def summary_line(name: str, other: str, differences: Mapping[str, Difference]) -> str:
    """ "bert beats its twin on 3 of 5 tasks; 2 within noise" (the average left out)."""
    tasks = {task: d for task, d in differences.items() if task != "average"}
    wins = sum(d.ahead for d in tasks.values())
    losses = sum(d.behind for d in tasks.values())
    line = f"{name} beats {other} on {wins} of {len(tasks)} tasks"
    if losses:
        line += f", loses on {losses}"
    return f"{line}; {len(tasks) - wins - losses} within noise"


def comparison_table(
    comparisons: Mapping[str, Mapping[str, Difference]], tasks: Sequence[str], other: str
) -> str:
    """Markdown: a row per comparison, the difference (points) and its 95% interval per task and
    on average, and how many tasks it wins, loses and leaves within noise against `other`."""
    averaged = any("average" in differences for differences in comparisons.values())
    columns = [*tasks, "average"] if averaged else list(tasks)
    head = f"| comparison | {' | '.join(columns)} | verdict |"
    lines = [head, "|---|" + "---:|" * len(columns) + "---|"]
    for name, differences in comparisons.items():
        cells = [str(differences[c]) if c in differences else "" for c in columns]
        verdict = summary_line("", other, differences).strip()
        lines.append(f"| {name} | {' | '.join(cells)} | {verdict} |")
    return "\n".join(lines)


# ---------------------------------------------------------------- run folders


def constant_predictions(predictions: Predictions, label: Any) -> dict[str, tuple]:
    """The same dev examples answered with one label each (the majority class), as one seed."""
    return {
        split: (references, [[label] * len(references)])
        for split, (references, _) in predictions.items()
    }


def one_seed(dev: Mapping[str, Mapping[str, Sequence]]) -> dict[str, tuple]:
    """A results file's `dev_predictions` -> Predictions of one seed."""
    return {split: (entry["references"], [entry["predictions"]]) for split, entry in dev.items()}


def pooled(runs: Sequence[Predictions]) -> dict[str, tuple]:
    """Several seeds' Predictions of one task (the same dev examples) -> one, seeds pooled."""
    first = runs[0]
    return {
        split: (references, [seed for run in runs for seed in run[split][1]])
        for split, (references, _) in first.items()
    }


def read_run(path: str | os.PathLike) -> dict[str, Predictions]:
    """{task (prompt-eval: "task, k-shot"): Predictions} of a finetune, probe or prompt-eval
    output folder."""
    folder = Path(path)
    files = [folder / name for name in RESULTS_FILES if (folder / name).is_file()]
    if not files:
        raise DataError(
            f"{folder}: no {', '.join(RESULTS_FILES)}; pass the --output-dir of an egbert "
            "finetune, probe or prompt-eval run"
        )
    report = json.loads(files[0].read_text(encoding="utf-8"))
    tasks = report.get("tasks", {report["task"]: report} if "task" in report else {})
    found = {}
    for task, result in tasks.items():
        if "dev_predictions" in result:
            found[task] = one_seed(result["dev_predictions"])
        for shots, entry in result.get("shots", {}).items():
            found[f"{task}, {shots}-shot"] = one_seed(entry["dev_predictions"])
    if not found:
        raise DataError(
            f"{files[0]}: no per-example dev predictions (written by egbert since its "
            "comparisons got intervals); run the job again to compare it"
        )
    return found


def compare_runs(
    a: str | os.PathLike,
    b: str | os.PathLike,
    samples: int = CompareArguments.samples,
    seed: int = CompareArguments.seed,
) -> dict[str, Difference]:
    """A - B on every task (and prompt setting) both run folders scored, with intervals."""
    first, second = read_run(a), read_run(b)
    if not first.keys() & second.keys():
        raise DataError(f"{a} and {b} scored no task in common")
    return compare(first, second, samples=samples, seed=seed)
