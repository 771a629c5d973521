"""What the probe and prompt evaluation share: task checks, sampling, GLUE scoring, their files.

Scores always come from `egbert.finetune.metrics` (GLUE's metric per task, a task's score the
mean of its metrics), so a probe or prompting number sits next to a fine-tuning one unchanged.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from egbert.errors import ConfigError, DataError
from egbert.finetune.metrics import compute_task_metrics, glue_score, task_score
from egbert.finetune.tasks import SCORED_TASKS, Task, split_file


def check_data_dir(data_dir: str | os.PathLike) -> Path:
    path = Path(data_dir)
    if not path.is_dir():
        raise DataError(f"--data-dir {path}: no such folder; pass the GLUE folder")
    return path


def check_split_present(task: Task, split: str, data_dir: Path) -> None:
    """DataError naming the file expected, before any model is loaded."""
    if split_file(task, split, data_dir) is None:
        names = " or ".join(str(data_dir / task.dir_name / name) for name in task.files[split])
        raise DataError(f"{task.name} {split} file not found: {names}; check --data-dir")


def present_eval_splits(task: Task, data_dir: Path) -> list[str]:
    """The task's dev splits found under data_dir (MNLI: matched and, if there, mismatched)."""
    check_split_present(task, task.eval_splits[0], data_dir)
    return [split for split in task.eval_splits if split_file(task, split, data_dir)]


def check_positive(name: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise ConfigError(f"{name} must be at least 1, got {value}")


def sample_indices(count: int, limit: int | None, rng: np.random.Generator) -> np.ndarray:
    """`limit` indices drawn without replacement from range(count), in file order (all if None).

    A random draw, not the first rows: GLUE's files are not shuffled (SST-2's train file, for
    one, holds phrases of the same sentence next to each other)."""
    if limit is None or limit >= count:
        return np.arange(count)
    return np.sort(rng.choice(count, size=limit, replace=False))


def scored(task: Task, predictions: Sequence, references: Sequence) -> dict[str, float]:
    return compute_task_metrics(task, list(predictions), list(references))


def majority_score(task: Task, train_labels: Sequence[int], dev_labels: Sequence[int]) -> float:
    """The score of always answering the most frequent training label: the floor a probe or a
    prompt has to beat to show it learned anything (MRPC's is far above 50). A tie goes to the
    smallest label id."""
    counts = Counter(train_labels)
    majority = max(sorted(counts), key=counts.__getitem__)
    return task_score({"dev": scored(task, [majority] * len(dev_labels), dev_labels)})


def glue_average(task_scores: Mapping[str, float]) -> dict | None:
    """The mean score over the GLUE tasks that ran, with their names (None for fewer than two)."""
    glue_tasks = {name: score for name, score in task_scores.items() if name in SCORED_TASKS}
    if len(glue_tasks) < 2:
        return None
    return {"score": glue_score(glue_tasks), "tasks": sorted(glue_tasks)}


METRIC_NAMES = {
    "accuracy": "acc",
    "f1": "F1",
    "matthews_correlation": "MCC",
    "pearson": "Pearson",
    "spearmanr": "Spearman",
}


def format_metrics(metrics_by_split: Mapping[str, Mapping[str, float]]) -> str:
    """{"validation": {"accuracy": 0.8, "f1": 0.85}} -> "acc 80.00 / F1 85.00"."""
    parts = []
    for split, metrics in metrics_by_split.items():
        tag = split.removeprefix("validation").strip("_")
        text = " / ".join(f"{METRIC_NAMES.get(k, k)} {100 * v:.2f}" for k, v in metrics.items())
        parts.append(f"{tag} {text}" if tag else text)
    return "; ".join(parts)


def write_results(results: dict, output_dir: str | os.PathLike, name: str) -> Path:
    """Write `results` as output_dir/name, through a temp file renamed into place, so an
    interrupted run never leaves half a file where an earlier complete one was."""
    folder = Path(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / name
    temp = folder / f".{name}.{os.getpid()}.tmp"
    try:
        temp.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
        os.replace(temp, target)
    finally:
        temp.unlink(missing_ok=True)
    return target
