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

from collections.abc import Mapping, Sequence
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
