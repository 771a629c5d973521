"""The trainer's evaluation: each evaluation set's mean loss and metrics over all processes, and
the model's predictions, with label smoothing off.

Evaluation reports each set's mean loss, plus `batch_metrics(batch, outputs)` summed over
batches (for metrics too large to gather, such as MLM accuracy) and
`compute_metrics(EvalPrediction)` over the gathered logits and labels (as transformers' Trainer);
then `finalize_metrics(metrics)` may derive more.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, Dataset
from transformers import EvalPrediction

from egbert.training.batches import Batching, TrainingData, batch_size, eval_loader

# (batch, outputs) -> {metric name: (sum, count)}: summed over batches and processes, reported
# as sum / count. Lets a job add accuracies to the eval loss without the trainer knowing them.
BatchMetrics = Callable[[dict[str, Any], Any], dict[str, tuple[float, float]]]


@dataclass
class EvalMetrics:
    """What evaluation reports beside each set's mean loss (each may be None): `batch_metrics`
    summed over batches, `compute_metrics` over the gathered logits and labels, then
    `finalize_metrics` of them all (see the module doc)."""

    batch_metrics: BatchMetrics | None = None
    compute_metrics: Callable[[EvalPrediction], dict[str, float]] | None = None
    finalize_metrics: Callable[[dict[str, float]], dict[str, float]] | None = None


class Evaluator:
    """Evaluates a prepared model on the evaluation sets of `data` (one set, or {name: set}
    with each one's metrics prefixed `name_`), in batches of its eval collator (None: its
    collator), and predicts on any set, on every process. `forward_arguments` go to each
    forward beside the batch (label smoothing off)."""

    def __init__(
        self,
        model: torch.nn.Module,
        accelerator: Accelerator,
        batching: Batching,
        data: TrainingData,
        metrics: EvalMetrics,
        forward_arguments: dict[str, Any] | None = None,
    ) -> None:
        self.model, self.accelerator = model, accelerator
        self.batching, self.collator = batching, data.eval_collator or data.collator
        self.batch_metrics, self.compute_metrics = metrics.batch_metrics, metrics.compute_metrics
        self.finalize_metrics = metrics.finalize_metrics
        self.forward_arguments = forward_arguments or {}
        eval_sets = data.eval
        if eval_sets is not None and not isinstance(eval_sets, dict):
            eval_sets = {"": eval_sets}
        self.eval_sets = eval_sets or {}
        self.loaders = {name: self.loader(dataset) for name, dataset in self.eval_sets.items()}

    def loader(self, dataset: Dataset) -> DataLoader:
        return eval_loader(dataset, self.batching, self.collator, self.accelerator)

    def evaluate(self) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for name, loader in self.loaders.items():
            logits, labels, sums = self.run_model(loader, keep_logits=bool(self.compute_metrics))
            found = {key: total / count if count else math.nan for key, (total, count) in sums}
            if self.compute_metrics is not None:
                found |= self.compute_metrics(EvalPrediction(predictions=logits, label_ids=labels))
            metrics |= {f"{name}_{key}" if name else key: value for key, value in found.items()}
        if self.finalize_metrics is not None:
            metrics = self.finalize_metrics(metrics)
        return metrics

    def predict(self, dataset: Dataset) -> EvalPrediction:
        logits, labels, _ = self.run_model(self.loader(dataset), keep_logits=True)
        return EvalPrediction(predictions=logits, label_ids=labels)

    def run_model(self, loader: DataLoader, keep_logits: bool) -> tuple[Any, Any, list]:
        """(logits, labels, [(metric, (sum, count))]) of one pass over `loader`: the logits and
        labels gathered from every process when `keep_logits`, the loss and batch metrics
        summed over batches and processes."""
        sums: dict[str, list[float]] = {}
        logits, labels = [], []
        self.model.eval()
        with torch.no_grad():
            for batch in loader:
                outputs = self.model(**batch, **self.forward_arguments)
                parts = {}
                if outputs.loss is not None:
                    size = batch_size(batch)
                    parts["loss"] = (outputs.loss.item() * size, size)
                if self.batch_metrics is not None:
                    parts |= self.batch_metrics(batch, outputs)
                for name, (total, count) in parts.items():
                    entry = sums.setdefault(name, [0.0, 0.0])
                    entry[0] += float(total)
                    entry[1] += float(count)
                if keep_logits:
                    logits.append(self.accelerator.gather_for_metrics(outputs.logits).float())
                    if "labels" in batch:
                        labels.append(self.accelerator.gather_for_metrics(batch["labels"]))
        self.model.train()
        names = sorted(sums)
        local = torch.tensor(
            [sums[name] for name in names], dtype=torch.float64, device=self.accelerator.device
        ).reshape(-1, 2)
        totals = self.accelerator.reduce(local, reduction="sum").cpu().tolist()
        return (
            torch.cat(logits).cpu().numpy() if logits else None,
            torch.cat(labels).cpu().numpy() if labels else None,
            list(zip(names, totals, strict=True)),
        )
