"""GLUE scoring: each task's metrics through the local `evaluate` module, task scores, GLUE score.

How the GLUE leaderboard (gluebenchmark.com) computes its score, which `glue_score` follows:
- a task with two metrics scores the unweighted mean of the two: MRPC (F1 + accuracy) / 2,
  QQP (F1 + accuracy) / 2, STS-B (Pearson + Spearman) / 2 (Wang et al. 2019, section 4);
- MNLI counts once, as the mean of its matched and mismatched accuracies;
- the GLUE score is the unweighted mean of the nine task scores (CoLA, SST-2, MRPC, STS-B, QQP,
  MNLI, QNLI, RTE, WNLI); the diagnostic set AX is not part of it.
  Check: BERT-base's test row (52.1, 93.5, 88.9/84.8, 87.1/85.8, 71.2/89.2, 84.6/83.4, 90.5,
  66.4, 65.1) gives 78.3, its published GLUE score.
On dev sets with tasks missing (no QQP here, MNLI matched only) the same rule averages what is
there, which is then not comparable with the leaderboard: callers say which tasks went in.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import evaluate

from egbert.errors import ConfigError
from egbert.finetune.tasks import SCORED_TASKS, Task, get_task

GLUE_METRIC_MODULE = Path(__file__).parent / "metric_modules" / "glue.py"


@cache
def load_metric(kind: str) -> evaluate.EvaluationModule:
    """The local `glue` evaluate module for one metric kind (no hub access)."""
    return evaluate.load(str(GLUE_METRIC_MODULE), kind, keep_in_memory=True)


def compute_task_metrics(
    task: str | Task, predictions: Sequence, references: Sequence
) -> dict[str, float]:
    """The task's GLUE metrics, as fractions: e.g. {"accuracy": 0.8, "f1": 0.85} for mrpc."""
    task = get_task(task) if isinstance(task, str) else task
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    return load_metric(task.metric).compute(predictions=predictions, references=references)


def task_score(metrics_by_split: Mapping[str, Mapping[str, float]]) -> float:
    """A task's leaderboard score: the mean of its metrics, then of its dev sets (MNLI m/mm)."""
    if not metrics_by_split:
        raise ValueError("no metrics to score")
    split_means = [sum(m.values()) / len(m) for m in metrics_by_split.values()]
    return sum(split_means) / len(split_means)


def glue_score(task_scores: Mapping[str, float]) -> float:
    """The GLUE score: the unweighted mean of the task scores of the nine GLUE tasks given."""
    unknown = sorted(set(task_scores) - set(SCORED_TASKS))
    if unknown:
        raise ConfigError(f"not GLUE-scored tasks: {unknown}; the score uses {list(SCORED_TASKS)}")
    if not task_scores:
        raise ValueError("no task scores to average")
    return sum(task_scores.values()) / len(task_scores)


@dataclass(frozen=True)
class GlueAverage:
    """The GLUE score of a set of task scores and the tasks that went into it."""

    score: float
    tasks: tuple[str, ...]


def glue_average(
    task_scores: Mapping[str, float], leave_out: Collection[str] = ()
) -> GlueAverage | None:
    """The GLUE score over the GLUE tasks among `task_scores`, in their order; tasks that GLUE
    does not score (custom tasks) and those in `leave_out` are skipped. None when none is left."""
    scored = {
        name: score
        for name, score in task_scores.items()
        if name in SCORED_TASKS and name not in leave_out
    }
    if not scored:
        return None
    return GlueAverage(glue_score(scored), tuple(scored))


METRIC_SHORT_NAMES = {"accuracy": "acc", "matthews_correlation": "mcc", "spearmanr": "spearman"}


def format_metrics(metrics_by_split: Mapping[str, Mapping[str, float]]) -> str:
    """{"validation": {"accuracy": 0.8, "f1": 0.85}} -> "acc 80.00 / f1 85.00"; a dev set
    other than "validation" is tagged, e.g. MNLI's "matched acc 84.10; mismatched acc 83.40"."""
    parts = []
    for split, metrics in metrics_by_split.items():
        tag = split.removeprefix("validation").strip("_")
        text = " / ".join(
            f"{METRIC_SHORT_NAMES.get(name, name)} {100 * value:.2f}"
            for name, value in metrics.items()
        )
        parts.append(f"{tag} {text}" if tag else text)
    return "; ".join(parts)
