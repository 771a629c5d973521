"""What the probe and prompt evaluation share: task checks, sampling, GLUE scoring, their files.

Scores always come from `egbert.finetune.metrics` (GLUE's metric per task, a task's score the
mean of its metrics), so a probe or prompting number sits next to a fine-tuning one unchanged.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from egbert.errors import ConfigError, DataError
from egbert.finetune.metrics import compute_task_metrics, task_score
from egbert.finetune.tasks import Task
from egbert.training.runtime import inference_precision


def check_data_dir(data_dir: str | os.PathLike) -> Path:
    path = Path(data_dir)
    if not path.is_dir():
        raise DataError(f"--data-dir {path}: no such folder; pass the GLUE folder")
    return path


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


def majority_label(train_labels: Sequence[int]) -> int:
    """The most frequent training label (a tie goes to the smallest label id)."""
    counts = Counter(train_labels)
    return int(max(sorted(counts), key=counts.__getitem__))


def majority_score(task: Task, label: int, dev_labels: Sequence[int]) -> float:
    """The score of always answering `label`, the majority class: the floor a probe or a prompt
    has to beat to show it learned anything (MRPC's is far above 50)."""
    return task_score({"dev": scored(task, [label] * len(dev_labels), dev_labels)})


# The probe's and prompt-eval's options that read the same (their dataclasses: ProbeArguments,
# PromptEvalArguments); the fields are named as the run functions' arguments.
DEVICE_HELP = "cpu, cuda, ... (default: cuda when available)"
BF16_HELP = "bf16 autocast (default: where the device runs it faster than fp32)"
FP16_HELP = "fp16 autocast, for GPUs without bf16 (T4, V100); instead of --bf16"


def model_dir_field() -> Any:
    """--model DIR, the run functions' model_dir."""
    return field(
        metadata={
            "option": "--model",
            "metavar": "DIR",
            "help": "the model directory, with its tokenizer",
        }
    )


def tasks_field(task_help: str) -> Any:
    """--task TASK [TASK ...], given once or several times: the run functions' tasks."""
    return field(
        metadata={"option": "--task", "metavar": "TASK", "action": "extend", "help": task_help}
    )


def data_dir_field() -> Any:
    return field(metadata={"metavar": "DIR", "help": "the GLUE folder (DIR/SST-2/train.tsv, ...)"})


def output_dir_field(results_file: str) -> Any:
    return field(
        default=None, metadata={"help": f"write {results_file} here (default: print only)"}
    )


def print_results(command: str, table: str, output_dir: Path | None, results_file: str) -> None:
    """A command's table, and where its results file went."""
    print(table)
    if output_dir is not None:
        print(f"egbert {command}: wrote {output_dir / results_file}")


def evaluate_tasks(
    model_dir: str | os.PathLike,
    model: torch.nn.Module,
    bf16: bool | None,
    options: dict[str, Any],
    tasks: Sequence[Task],
    evaluate_task: Callable[[Task], dict[str, Any]],
    fp16: bool = False,
) -> dict[str, Any]:
    """{"model", "options", "tasks": {name: evaluate_task(task)}}: what both results files hold;
    every task runs under `inference_precision(model, bf16, fp16)`, and options["bf16"] and
    options["fp16"] say which."""
    with inference_precision(model, bf16, fp16) as bf16_used:
        results = {task.name: evaluate_task(task) for task in tasks}
    used = {"bf16": bf16_used, "fp16": fp16}
    return {"model": str(model_dir), "options": options | used, "tasks": results}


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
