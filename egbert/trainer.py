"""The shared training loop: one Accelerate trainer for pretraining and fine-tuning every model.

The trainer knows nothing about BERT, GPT or ELMo: it calls `model(**batch)` and optimizes
`outputs.loss`. Around that it does what a run of hours needs: gradient accumulation, bf16,
clipping, AdamW without decay on biases and norms, learning-rate schedules over steps or over a
wall-time budget, periodic evaluation, atomic checkpoints with exact resume (weights, optimizer,
scheduler, RNG and the position in the data), a graceful stop on SIGINT/SIGTERM, and at the end
a `save_pretrained` model, a loss curve and a model card.

Learning rate. `lr` is the peak rate of `linear`, `cosine` and `constant`; the multiplier
(LambdaLR) rises linearly from 0 over the warmup and then falls to 0 at the last step (linear,
cosine) or stays at 1 (constant), with the same values as transformers'
`get_{linear,cosine,constant}_schedule_with_warmup`. For `inverse_sqrt` (the Noam rule of
"Attention Is All You Need") the rate at update n = step + 1 is
    lr * d_model**-0.5 * min(n**-0.5, n * warmup**-1.5),
d_model being `model.config.hidden_size`: `lr` is a scale, 1.0 gives the paper's rule (peak
d_model**-0.5 * warmup**-0.5 at n = warmup, e.g. 7.0e-4 for d_model 512 and warmup 4000).

Budget mode (`budget_minutes`): training stops once that much training wall time (evaluation and
checkpoint writing excluded) has passed, and the schedule runs over time instead of steps: its
progress is elapsed / budget, so linear and cosine reach 0 exactly at the deadline. A fractional
warmup is a share of the budget; an integer warmup ramps over that many steps and multiplies the
time-based decay. inverse_sqrt stays step-based and simply stops at the deadline.

Data. Training examples come from a map-style dataset shuffled by an epoch-seeded sampler (or a
streaming `IterableDataset`, taken in order). Collators must not draw from the global RNG (the
loader runs one batch ahead, so that stream would shift on resume); seed per example or per
epoch instead, as egbert's collators do. A collator's `set_epoch(epoch)` is called each epoch.

Distributed: the same code runs on N processes under `torchrun` or `accelerate launch`; the
batch size is per process and every process reports the loss averaged over all of them.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import hashlib
import itertools
import json
import math
import os
import pickle
import platform
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedDataParallelKwargs, DistributedType, set_seed
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler
from tqdm.auto import tqdm

from egbert.errors import CheckpointError, ConfigError, DataError, TrainingError

SCHEDULES = ("linear", "cosine", "inverse_sqrt", "constant")
STATE_FILE = "trainer_state.json"
METRICS_FILE = "metrics.jsonl"
# Errors of writing files: a full disk or quota, a read-only or forbidden output directory.
WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM)

# (batch, outputs) -> {metric name: (sum, count)}: summed over batches and processes, reported
# as sum / count. Lets a job add accuracies to the eval loss without the trainer knowing them.
BatchMetrics = Callable[[dict[str, Any], Any], dict[str, tuple[float, float]]]


@dataclass
class TrainingArguments:
    """Options of a training run; every field is also a command-line option (see egbert.config)."""

    output_dir: str = field(metadata={"help": "run directory: checkpoints, logs, final model"})
    lr: float = field(default=5e-4, metadata={"help": "peak learning rate (a scale for Noam)"})
    weight_decay: float = field(
        default=0.01, metadata={"help": "AdamW decay (not on biases/norms)"}
    )
    adam_beta1: float = field(default=0.9, metadata={"help": "AdamW beta1"})
    adam_beta2: float = field(default=0.999, metadata={"help": "AdamW beta2"})
    adam_epsilon: float = field(default=1e-8, metadata={"help": "AdamW epsilon"})
    batch_size: int = field(default=32, metadata={"help": "examples per batch and process"})
    grad_accum: int = field(default=1, metadata={"help": "batches per optimizer step"})
    batch_ramp_to: int | None = field(
        default=None,
        metadata={
            "help": "grow the batch linearly over the run from --batch-size to N examples per "
            "step (a multiple of it), by accumulating more batches per step; with "
            "--budget-minutes or --max-steps"
        },
    )
    max_steps: int | None = field(
        default=None, metadata={"help": "optimizer steps to train (overrides --epochs)"}
    )
    epochs: int | None = field(
        default=None,
        metadata={"help": "passes over the data (default 1; unlimited with --budget-minutes)"},
    )
    schedule: str = field(
        default="linear",
        metadata={"help": "learning-rate schedule", "choices": list(SCHEDULES)},
    )
    warmup_steps: float = field(
        default=0.0,
        metadata={"help": "warmup: a number of steps, or a fraction < 1 of the run (e.g. 0.06)"},
    )
    bf16: bool = field(default=False, metadata={"help": "bf16 mixed precision (CPU or GPU)"})
    max_grad_norm: float = field(
        default=1.0, metadata={"help": "clip the gradient norm to this (0: no clipping)"}
    )
    label_smoothing: float | None = field(
        default=None, metadata={"help": "label smoothing of the model's loss (training only)"}
    )
    eval_every: int = field(default=0, metadata={"help": "evaluate every N steps (0: at the end)"})
    save_every: int = field(
        default=0, metadata={"help": "checkpoint every N steps (0: only at the end)"}
    )
    keep_checkpoints: int = field(default=2, metadata={"help": "keep the last K checkpoints"})
    seed: int = field(default=42, metadata={"help": "random seed"})
    budget_minutes: float | None = field(
        default=None,
        metadata={"help": "stop after M minutes of training; the schedule runs over the budget"},
    )
    skip_nonfinite: int = field(
        default=0, metadata={"help": "skip up to N steps with a non-finite loss, then stop"}
    )
    log_every: int = field(default=10, metadata={"help": "log the training loss every N steps"})
    resume: bool = field(
        default=False, metadata={"help": "continue from the newest checkpoint in --output-dir"}
    )
    resume_anyway: bool = field(
        default=False, metadata={"help": "resume even if the run config changed"}
    )
    metric_for_best_model: str | None = field(
        default=None,
        metadata={"help": "keep the best model by this eval metric and save it at the end"},
    )
    greater_is_better: bool | None = field(
        default=None,
        metadata={"help": "direction of --metric-for-best-model (default: loss-like lower)"},
    )
    num_workers: int = field(default=0, metadata={"help": "data loader worker processes"})
    use_cpu: bool = field(default=False, metadata={"help": "train on CPU even if a GPU is there"})
    ddp_find_unused_parameters: bool = field(
        default=False, metadata={"help": "DDP: allow parameters that get no gradient"}
    )

    def __post_init__(self) -> None:
        positive = {"lr": self.lr, "batch_size": self.batch_size, "grad_accum": self.grad_accum}
        positive |= {"keep_checkpoints": self.keep_checkpoints, "log_every": self.log_every}
        for name, optional in (("max_steps", self.max_steps), ("epochs", self.epochs)):
            if optional is not None:
                positive[name] = optional
        if self.budget_minutes is not None:
            positive["budget_minutes"] = self.budget_minutes
        for name, value in positive.items():
            if not value > 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be > 0, got {value}")
        non_negative = {
            "weight_decay": self.weight_decay,
            "warmup_steps": self.warmup_steps,
            "max_grad_norm": self.max_grad_norm,
            "eval_every": self.eval_every,
            "save_every": self.save_every,
            "skip_nonfinite": self.skip_nonfinite,
            "num_workers": self.num_workers,
        }
        for name, value in non_negative.items():
            if value < 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 0, got {value}")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"unknown --schedule {self.schedule!r}; use one of {SCHEDULES}")
        if self.warmup_steps >= 1 and self.warmup_steps != int(self.warmup_steps):
            raise ConfigError(
                f"--warmup-steps {self.warmup_steps}: give whole steps or a fraction below 1"
            )
        if self.label_smoothing is not None and not 0 <= self.label_smoothing < 1:
            raise ConfigError(f"--label-smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.batch_ramp_to is not None:
            self._check_batch_ramp()
        if self.schedule == "inverse_sqrt" and not self.warmup_steps >= 1:
            raise ConfigError("--schedule inverse_sqrt needs --warmup-steps as a number of steps")

    def _check_batch_ramp(self) -> None:
        ramp = f"--batch-ramp-to {self.batch_ramp_to}"
        if self.batch_ramp_to <= self.batch_size or self.batch_ramp_to % self.batch_size:
            raise ConfigError(
                f"{ramp}: give a multiple of --batch-size {self.batch_size} larger than it"
            )
        if self.grad_accum != 1:
            raise ConfigError(f"{ramp} sets the accumulation itself: leave --grad-accum at 1")

    @property
    def warmup_is_ratio(self) -> bool:
        return 0 < self.warmup_steps < 1


@dataclass
class TrainerState:
    """Where a run stands; saved as JSON next to each checkpoint and restored on resume."""

    step: int = 0  # optimizer updates done
    epoch: int = 0
    batches_in_epoch: int = 0  # batches (per process) of the current epoch already consumed
    elapsed_seconds: float = 0.0  # training wall time, evaluation and saving excluded
    tokens_seen: int = 0
    skipped_nonfinite: int = 0
    best_metric: float | None = None
    best_step: int | None = None
    best_metrics: dict[str, float] | None = None
    run_config: dict[str, Any] = field(default_factory=dict)
    config_hash: str = ""


@dataclass
class TrainOutput:
    """What `Trainer.train` returns."""

    step: int
    epoch: int
    elapsed_seconds: float
    metrics: dict[str, float]  # the last evaluation (of the best model when one is kept)
    interrupted: bool  # stopped by a signal: a checkpoint is saved but no final model


# ---------------------------------------------------------------- schedules


def schedule_multiplier(schedule: str, position: float, total: float, warmup: float) -> float:
    """Multiplier of the peak lr for linear | cosine | constant at `position` of a run of `total`
    with `warmup`, all three in one unit (steps, or seconds in budget mode)."""
    if position < warmup:
        return position / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, max(0.0, (position - warmup) / max(total - warmup, 1e-12)))
    if schedule == "linear":
        return 1.0 - progress
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ConfigError(f"unknown schedule {schedule!r}; use one of {SCHEDULES}")


def noam_multiplier(step: int, warmup_steps: int, d_model: int) -> float:
    """The inverse-sqrt rule of Vaswani et al.; `step` updates are done, so n = step + 1."""
    n = step + 1
    return d_model**-0.5 * min(n**-0.5, n * warmup_steps**-1.5)


# ---------------------------------------------------------------- optimizer and data


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: decay on matrices only. Biases, LayerNorm and other norm weights (1-d, or
    named *norm*) get none: decaying them pulls scales towards 0 and buys no regularisation."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if param.ndim < 2 or "norm" in name.lower():
            no_decay.append(param)
        else:
            decay.append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def adamw(parameters: Any, device: torch.device | str, **options: Any) -> torch.optim.AdamW:
    """torch's AdamW, fused where torch has the kernel (as transformers.Trainer): its default on
    the CPU is a Python loop over the tensors, 49 ms a step for the mini bert's 7.5M parameters
    on one core against 5.6 ms fused."""
    fused = torch.device(device).type in ("cpu", "cuda")
    return torch.optim.AdamW(parameters, fused=fused, **options)


# glibc's mallopt() parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3


def keep_freed_memory_in_process(device: torch.device | str) -> None:
    """Make glibc's malloc keep freed memory for reuse instead of handing it back to the OS,
    for training on a CPU (`device`; on a GPU the tensors are not malloc's).

    A CPU training step allocates and frees the same large tensors every step (activations,
    the LM head's logits chunks and gradients). glibc serves blocks above its mmap threshold
    (adaptive, at most 32 MiB) with fresh mmap'd pages and trims the heap's free top above its
    trim threshold, so every step paid page faults to get zeroed memory back. With both raised
    to 1 GiB, egbert's mini bf16 step took 10-15% less time (bert 355 to 306-319 ms, gpt 665 to
    569-594 ms, 2-core EPYC) at the same peak memory. Models that allocate many large tensors of
    varying sizes can fragment the heap instead: the dense-logits bert peaked 44% higher. A
    process-wide setting, as glibc's MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ would
    make it; where the user set either of those, or off Linux with glibc, it does nothing."""
    if torch.device(device).type != "cpu":
        return
    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return
    if {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"} & os.environ.keys():
        return
    mallopt = ctypes.CDLL(None).mallopt
    mallopt(M_MMAP_THRESHOLD, 2**30)
    mallopt(M_TRIM_THRESHOLD, 2**30)


class EpochShuffleSampler(Sampler[int]):
    """A new permutation every epoch, a pure function of (seed, epoch): the order of any epoch
    can be replayed on resume without replaying the ones before it."""

    def __init__(self, length: int, seed: int) -> None:
        self.length = length
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        return iter(torch.randperm(self.length, generator=generator).tolist())

    def __len__(self) -> int:
        return self.length


def loss_parts(outputs: Any) -> dict[str, torch.Tensor]:
    """The loss and the parts a model reports beside it, its scalar `*_loss` fields (bert's
    mlm_loss and nsp_loss, elmo's forward_loss and backward_loss, ...), detached: the training
    log shows each."""
    parts = {"loss": outputs.loss.detach().float()}
    fields = outputs.items() if isinstance(outputs, Mapping) else ()  # a ModelOutput is one
    for name, value in fields:
        if name.endswith("_loss") and torch.is_tensor(value) and value.dim() == 0:
            parts[name] = value.detach().float()
    return parts


def count_tokens(batch: dict[str, Any]) -> int:
    """Real tokens in a batch: the attention mask's sum, else the size of input_ids."""
    if "attention_mask" in batch:
        return int(batch["attention_mask"].sum())
    if "input_ids" in batch:
        return batch["input_ids"].numel()
    return 0


def _batch_size(batch: dict[str, Any]) -> int:
    return next(value.size(0) for value in batch.values() if isinstance(value, torch.Tensor))


# ---------------------------------------------------------------- files


def _fsync_tree(directory: Path) -> None:
    """Flush every file of a freshly written checkpoint to disk before it is renamed into place."""
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            with path.open("rb") as handle:
                os.fsync(handle.fileno())
    _fsync_dir(directory)


def _fsync_dir(directory: Path) -> None:
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def _remove_dir(directory: Path) -> None:
    """Rename first so that a kill mid-delete never leaves a half-deleted `step-N` behind."""
    doomed = directory.with_name(f".tmp-delete-{directory.name}")
    os.replace(directory, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def _checkpoint_step(path: Path) -> int | None:
    prefix, _, number = path.name.partition("-")
    if prefix != "step" or not number.isdigit() or not (path / STATE_FILE).is_file():
        return None
    return int(number)


def _flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat |= _flatten(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def config_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """`field: old -> new` for every field that differs between two run configs."""
    saved, current = _flatten(saved), _flatten(current)
    return [
        f"{key}: {saved.get(key, '(unset)')} -> {current.get(key, '(unset)')}"
        for key in sorted(saved.keys() | current.keys())
        if saved.get(key) != current.get(key)
    ]


def _config_hash(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


# ---------------------------------------------------------------- the trainer


class Trainer:
    """Trains any model whose forward returns an object with `.loss`.

    train_dataset: map-style dataset (shuffled each epoch) or an IterableDataset (streaming).
    data_collator: list of examples -> dict of tensors, the keyword arguments of model(...).
    eval_dataset / eval_collator: evaluated every `eval_every` steps and at the end; reports
        the mean loss plus whatever `compute_metrics(batch, outputs)` returns as (sum, count)
        pairs, then `finalize_metrics(metrics)` may derive more (e.g. perplexity).
    eval_fn: alternatively, model -> metrics dict, called on every process instead of the loop.
    run_config: what defines the run beyond the trainer's options (model size, tokenizer, data,
        seq len); saved with each checkpoint and compared on resume.
    tokenizer: saved next to the final model.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        args: TrainingArguments,
        train_dataset: Dataset | IterableDataset,
        data_collator: Callable[[list[Any]], dict[str, Any]],
        eval_dataset: Dataset | IterableDataset | None = None,
        eval_collator: Callable[[list[Any]], dict[str, Any]] | None = None,
        compute_metrics: BatchMetrics | None = None,
        finalize_metrics: Callable[[dict[str, float]], dict[str, float]] | None = None,
        eval_fn: Callable[[torch.nn.Module], dict[str, float]] | None = None,
        run_config: dict[str, Any] | None = None,
        tokenizer: Any = None,
    ) -> None:
        self.args = args
        self.output_dir = Path(args.output_dir)
        self.checkpoint_dir = self.output_dir / "checkpoints"
        self.data_collator = data_collator
        self.compute_metrics = compute_metrics
        self.finalize_metrics = finalize_metrics
        self.eval_fn = eval_fn
        self.tokenizer = tokenizer
        self.accelerator = Accelerator(
            # On a machine without GPUs, cpu=True is what makes Accelerate run data-parallel
            # under torchrun (MULTI_CPU, gloo); without it every process trains alone.
            cpu=args.use_cpu or not _has_accelerator(),
            mixed_precision="bf16" if args.bf16 else "no",
            # We step the scheduler once per optimizer update ourselves; Accelerate would step
            # it num_processes times per update.
            step_scheduler_with_optimizer=False,
            kwargs_handlers=[
                DistributedDataParallelKwargs(
                    find_unused_parameters=args.ddp_find_unused_parameters
                )
            ],
        )
        keep_freed_memory_in_process(self.accelerator.device)
        if self.accelerator.distributed_type == DistributedType.DEEPSPEED and args.grad_accum > 1:
            raise ConfigError(
                "DeepSpeed accumulates gradients itself: use --grad-accum 1 and set "
                "gradient_accumulation_steps in the DeepSpeed config"
            )
        self.run_config = {
            **(run_config or {}),
            # The data each process sees depends on these, so a resume must keep them.
            "trainer": {
                "batch_size": args.batch_size,
                "grad_accum": args.grad_accum,
                "seed": args.seed,
                "num_processes": self.accelerator.num_processes,
            },
        }
        self.state = TrainerState(
            run_config=self.run_config, config_hash=_config_hash(self.run_config)
        )
        # Label smoothing is a training option: evaluation runs without it and the saved
        # config keeps the model's own value, so it does not leak into later fine-tuning.
        self._model_label_smoothing = getattr(
            getattr(model, "config", None), "label_smoothing", None
        )
        if args.label_smoothing is not None and hasattr(model, "config"):
            model.config.label_smoothing = args.label_smoothing
        self.d_model = getattr(getattr(model, "config", None), "hidden_size", None)
        if args.schedule == "inverse_sqrt" and not self.d_model:
            raise ConfigError("--schedule inverse_sqrt needs model.config.hidden_size")

        self.train_sampler = None
        train_loader = self._train_loader(train_dataset)
        eval_loader = None
        if eval_dataset is not None and eval_fn is None:
            eval_loader = DataLoader(
                eval_dataset,
                batch_size=args.batch_size,
                collate_fn=eval_collator or data_collator,
                num_workers=args.num_workers,
                generator=torch.Generator().manual_seed(args.seed),
            )
        optimizer = adamw(
            parameter_groups(model, args.weight_decay),
            self.accelerator.device,
            lr=args.lr,
            betas=(args.adam_beta1, args.adam_beta2),
            eps=args.adam_epsilon,
        )
        if args.batch_ramp_to is not None and args.budget_minutes is None and not args.max_steps:
            # epochs hold fewer batches per step at the start than at the end: no fixed length
            raise ConfigError(
                f"--batch-ramp-to {args.batch_ramp_to} needs a run length: --budget-minutes or "
                "--max-steps"
            )
        self.model, self.optimizer, self.train_loader = self.accelerator.prepare(
            model, optimizer, train_loader
        )
        self.eval_loader = None if eval_loader is None else self.accelerator.prepare(eval_loader)
        # The schedule's length needs the per-process number of batches, known after prepare.
        self.total_steps = self._total_steps()
        self.warmup = self._resolve_warmup()
        self.scheduler = self.accelerator.prepare(
            torch.optim.lr_scheduler.LambdaLR(optimizer, self._lr_multiplier)
        )
        self._signal_received: int | None = None
        self._stopping = False
        self._tensorboard = None
        self._last_eval: dict[str, float] = {}
        self._last_eval_step: int | None = None
        self._last_lr = args.lr

    # ------------------------------------------------------------ setup

    def _train_loader(self, dataset: Dataset | IterableDataset) -> DataLoader:
        options = {
            "batch_size": self.args.batch_size,
            "collate_fn": self.data_collator,
            "num_workers": self.args.num_workers,
            # The loader draws its workers' base seed from this generator, not the global RNG,
            # which must advance only with the model's own random ops (dropout) for exact resume.
            "generator": torch.Generator().manual_seed(self.args.seed),
        }
        if isinstance(dataset, IterableDataset):
            args = self.args
            if args.max_steps is None and (args.budget_minutes is None or args.epochs is not None):
                raise ConfigError(
                    "streaming training data has no length; give --max-steps, or "
                    "--budget-minutes without --epochs"
                )
            return DataLoader(dataset, **options)
        if len(dataset) == 0:
            raise DataError("the training data set is empty; check the training files")
        self.train_sampler = EpochShuffleSampler(len(dataset), self.args.seed)
        return DataLoader(dataset, sampler=self.train_sampler, **options)

    def _steps_per_epoch(self) -> int:
        return math.ceil(len(self.train_loader) / self.args.grad_accum)

    def _total_steps(self) -> int | None:
        if self.args.max_steps is not None:
            return self.args.max_steps
        if self.args.budget_minutes is not None and self.args.epochs is None:
            return None
        return (self.args.epochs or 1) * self._steps_per_epoch()

    def _resolve_warmup(self) -> float:
        """Warmup in the schedule's own unit: steps, or seconds for a fractional budget warmup."""
        warmup = self.args.warmup_steps
        if not self.args.warmup_is_ratio:
            return int(warmup)
        if self.args.budget_minutes is not None:
            return warmup * self.args.budget_minutes * 60
        return round(warmup * self.total_steps)

    def _lr_multiplier(self, step: int) -> float:
        args = self.args
        if args.schedule == "inverse_sqrt":
            return noam_multiplier(step, int(self.warmup), self.d_model)
        if args.budget_minutes is None:
            return schedule_multiplier(args.schedule, step, self.total_steps, self.warmup)
        budget = args.budget_minutes * 60
        elapsed = self.state.elapsed_seconds
        if args.warmup_is_ratio:
            return schedule_multiplier(args.schedule, elapsed, budget, self.warmup)
        ramp = min(1.0, step / self.warmup) if self.warmup else 1.0
        return ramp * schedule_multiplier(args.schedule, elapsed, budget, 0.0)

    # ------------------------------------------------------------ training

    def train(self) -> TrainOutput:
        """Train (resuming if asked), then save the final model, tokenizer, plot and card."""
        try:
            return self._train_and_save()
        except OSError as error:  # a log, plot or the final model could not be written
            if error.errno not in WRITE_ERRNOS:
                raise
            latest = self.latest_checkpoint()
            kept = f"the newest checkpoint {latest} is intact" if latest else "no checkpoint yet"
            raise CheckpointError(
                f"could not write {error.filename or self.output_dir}: {_reason(error)}; free "
                f"disk space (or fix the permissions) and run again with --resume ({kept})"
            ) from None

    def _warn_if_bf16_is_slow(self) -> None:
        device = self.accelerator.device.type
        if self.args.bf16 and not bf16_pays_off(device):
            bf16 = matmul_gflops(device, torch.bfloat16)
            fp32 = matmul_gflops(device, torch.float32)
            self.accelerator.print(
                f"egbert: warning: bf16 is slower than fp32 on this {device} (matmul {bf16:,.1f} "
                f"against {fp32:,.1f} GFLOP/s: no native bf16 instructions); drop --bf16 to "
                "train faster",
                flush=True,
            )

    def _train_and_save(self) -> TrainOutput:
        accelerator = self.accelerator
        self._start_or_resume()
        accelerator.print(
            f"egbert: training on {accelerator.num_processes} process(es) "
            f"({accelerator.distributed_type.value}, {accelerator.device}, "
            f"mixed precision {accelerator.mixed_precision}); "
            f"batch {self.args.batch_size} x {self._accumulation_text()} x "
            f"{accelerator.num_processes} processes",
            flush=True,
        )
        progress = tqdm(
            total=self.total_steps,
            initial=self.state.step,
            desc="training",
            disable=not accelerator.is_local_main_process,
            dynamic_ncols=True,
        )
        self._warn_if_bf16_is_slow()
        with self._stop_on_signals():
            self._train_loop(progress)
        progress.close()
        interrupted = self._stopping
        self.save_checkpoint()
        if interrupted:
            accelerator.print(
                f"egbert: stopped at step {self.state.step}; checkpoint saved in "
                f"{self.checkpoint_dir} (run again with --resume to continue)",
                flush=True,
            )
            return self._output(self._last_eval, interrupted=True)
        metrics = self._final_metrics()
        self._save_final_model()
        if accelerator.is_main_process:
            self._plot_loss_curve()
            self._write_model_card(metrics)
        accelerator.wait_for_everyone()
        return self._output(metrics, interrupted=False)

    def _output(self, metrics: dict[str, float], interrupted: bool) -> TrainOutput:
        state = self.state
        return TrainOutput(state.step, state.epoch, state.elapsed_seconds, metrics, interrupted)

    def _train_loop(self, progress: tqdm) -> None:
        self._window = self._new_window(start=self.state.elapsed_seconds)
        self._clock = time.perf_counter()
        while not self._finished() and self._epochs_left():
            if not self._train_epoch(progress):
                break

    def _epochs_left(self) -> bool:
        args = self.args
        return args.epochs is None or args.max_steps is not None or self.state.epoch < args.epochs

    def _finished(self) -> bool:
        state, args = self.state, self.args
        if self._stopping:
            return True
        if args.budget_minutes is not None and state.elapsed_seconds >= args.budget_minutes * 60:
            return True
        return self.total_steps is not None and state.step >= self.total_steps

    def _epoch_batches(self) -> Iterator[dict[str, Any]]:
        """The rest of the current epoch: its seeded order, minus the batches already used."""
        epoch, skip = self.state.epoch, self.state.batches_in_epoch
        for component in (self.train_sampler, self.data_collator):
            if hasattr(component, "set_epoch"):
                component.set_epoch(epoch)
        if hasattr(self.train_loader, "set_epoch"):
            self.train_loader.set_epoch(epoch)
        loader = self.train_loader
        if skip:
            loader = self.accelerator.skip_first_batches(self.train_loader, skip)
        return iter(loader)

    def _train_epoch(self, progress: tqdm) -> bool:
        """Train until the epoch ends (True) or the run has to stop (False)."""
        batches = self._epoch_batches()
        started_at = self.state.batches_in_epoch
        while True:
            group = list(itertools.islice(batches, self._batches_per_step()))
            if not group:
                break
            updated = self._optimizer_step(group)
            self.state.batches_in_epoch += len(group)
            if updated:
                progress.update(1)
                self._after_step(progress)
            if self._finished():
                return False
        if started_at == 0 and self.state.batches_in_epoch == 0:
            raise DataError("the training data gives no batches; check the training files")
        self.state.epoch += 1
        self.state.batches_in_epoch = 0
        return True

    def _accumulation_text(self) -> str:
        args = self.args
        if args.batch_ramp_to is None:
            return f"{args.grad_accum} accumulation"
        return f"1 to {args.batch_ramp_to // args.batch_size} accumulation (batch ramp)"

    def _batches_per_step(self) -> int:
        """--grad-accum, or with --batch-ramp-to the ramp's count at this point of the run:
        1 at the start, growing linearly with the share of the budget (or of --max-steps) done."""
        args = self.args
        if args.batch_ramp_to is None:
            return args.grad_accum
        if args.budget_minutes is not None:
            done = self.state.elapsed_seconds / (args.budget_minutes * 60)
        else:  # --max-steps, which the schedule also runs over
            done = self.state.step / self.total_steps
        final = args.batch_ramp_to // args.batch_size
        return 1 + math.floor((final - 1) * min(done, 1.0) + 0.5)

    def _optimizer_step(self, group: list[dict[str, Any]]) -> bool:
        """Forward and backward over `group` (accumulated), then one update unless the loss is
        not finite on some process (then False)."""
        self.model.train()
        batch_losses, tokens = [], 0
        for index, batch in enumerate(group):
            last = index == len(group) - 1
            with nullcontext() if last else self.accelerator.no_sync(self.model):
                outputs = self.model(**batch)
                if outputs.loss is None:
                    raise TrainingError("the model returned no loss; the batches need labels")
                self.accelerator.backward(outputs.loss / len(group))
            batch_losses.append(loss_parts(outputs))
            tokens += count_tokens(batch)
        now = time.perf_counter()
        self.state.elapsed_seconds += now - self._clock
        self._clock = now
        means = {
            name: torch.stack([losses[name] for losses in batch_losses]).mean()
            for name in batch_losses[0]
        }
        means, tokens, finite = self._sync_step(means, tokens)
        if not finite:
            self._skip_nonfinite_step(means["loss"])
            return False
        if self.args.max_grad_norm > 0:
            self.accelerator.clip_grad_norm_(self.model.parameters(), self.args.max_grad_norm)
        self._last_lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.state.step += 1
        self.state.tokens_seen += tokens
        self.scheduler.step()  # the multiplier reads state.step / elapsed_seconds, both updated
        sums = self._window["losses"]
        for name, value in means.items():
            sums[name] = sums.get(name, 0.0) + value
        self._window["steps"] += 1
        self._window["tokens"] += tokens
        return True

    def _sync_step(
        self, losses: dict[str, torch.Tensor], tokens: int
    ) -> tuple[dict[str, float], int, bool]:
        """One collective per step so that every process agrees on the mean losses, the token
        count, whether to skip (non-finite loss), whether to stop (a signal reached one of them)
        and the elapsed time (the budget schedule must give every replica the same lr)."""
        values = torch.stack(list(losses.values())).tolist()  # one device sync, not one a part
        local = torch.tensor(
            [
                float(tokens),
                float(not math.isfinite(values[0])),  # "loss" comes first (loss_parts)
                float(self._signal_received is not None),
                self.state.elapsed_seconds,
                *values,
            ],
            dtype=torch.float64,
            device=self.accelerator.device,
        )
        every = self.accelerator.gather(local.unsqueeze(0)).cpu()  # (processes, 4 + losses)
        self.state.elapsed_seconds = float(every[:, 3].max())
        # Only this agreed flag stops the run, so all processes leave the loop at the same step.
        self._stopping = self._stopping or bool(every[:, 2].max() > 0)
        means = dict(zip(losses, every[:, 4:].mean(dim=0).tolist(), strict=True))
        return means, int(every[:, 0].sum()), not every[:, 1].max() > 0

    def _skip_nonfinite_step(self, loss: float) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.state.skipped_nonfinite += 1
        state = self.state
        where = (
            f"at step {state.step + 1} (epoch {state.epoch}, batch "
            f"{state.batches_in_epoch + 1} of the epoch)"
        )
        if state.skipped_nonfinite > self.args.skip_nonfinite:
            raise TrainingError(
                f"the loss is {loss} {where}; lower --lr, check the data, or pass "
                f"--skip-nonfinite N to skip up to N such steps"
            )
        self.accelerator.print(
            f"egbert: skipped a step with loss {loss} {where} "
            f"({state.skipped_nonfinite} of {self.args.skip_nonfinite} allowed)",
            flush=True,
        )

    def _after_step(self, progress: tqdm) -> None:
        state, args = self.state, self.args
        if self._window["steps"] and (state.step % args.log_every == 0 or self._finished()):
            self._log_training(progress)
        # The clock runs on from the backward pass, so the update just made counts at the next
        # step; evaluation and saving do not count as training time.
        paused_at = time.perf_counter()
        if args.eval_every and state.step % args.eval_every == 0 and self._can_evaluate():
            self._evaluate_and_track()
        if args.save_every and state.step % args.save_every == 0 and not self._finished():
            self.save_checkpoint()
        self._clock += time.perf_counter() - paused_at

    @staticmethod
    def _new_window(start: float) -> dict[str, Any]:
        """What the next training log line averages: loss sums by name, steps, tokens."""
        return {"losses": {}, "steps": 0, "tokens": 0, "start": start}

    def _log_training(self, progress: tqdm) -> None:
        window, now = self._window, self.state.elapsed_seconds  # training time only
        losses = {name: total / window["steps"] for name, total in window["losses"].items()}
        record = {
            "step": self.state.step,
            "epoch": self.state.epoch,
            **losses,
            "lr": self._last_lr,
            "tokens_per_s": window["tokens"] / max(now - window["start"], 1e-9),
            "elapsed_s": round(self.state.elapsed_seconds, 3),
        }
        progress.set_postfix(
            loss=f"{record['loss']:.4f}",
            lr=f"{record['lr']:.2e}",
            tok_s=f"{record['tokens_per_s']:.0f}",
        )
        self._write_metrics(record, prefix="train")
        self._window = self._new_window(start=now)

    # ------------------------------------------------------------ evaluation

    def _can_evaluate(self) -> bool:
        return self.eval_loader is not None or self.eval_fn is not None

    def evaluate(self) -> dict[str, float]:
        """Mean eval loss and the job's metrics, over all processes; label smoothing off."""
        self.model.eval()
        try:
            with torch.no_grad(), self._label_smoothing(0.0):
                if self.eval_fn is not None:
                    metrics = dict(self.eval_fn(self.accelerator.unwrap_model(self.model)))
                else:
                    metrics = self._evaluation_loop()
        finally:
            self.model.train()
        return metrics

    @contextmanager
    def _label_smoothing(self, value: float | None) -> Iterator[None]:
        """The model's label smoothing set to `value` (None: unchanged) for a while."""
        config = getattr(self.accelerator.unwrap_model(self.model), "config", None)
        if value is None or not hasattr(config, "label_smoothing"):
            yield
            return
        saved, config.label_smoothing = config.label_smoothing, value
        try:
            yield
        finally:
            config.label_smoothing = saved

    def _evaluation_loop(self) -> dict[str, float]:
        sums: dict[str, list[float]] = {}
        for batch in self.eval_loader:
            outputs = self.model(**batch)
            size = _batch_size(batch)
            parts = {}
            if outputs.loss is not None:
                parts["loss"] = (outputs.loss.item() * size, size)
            if self.compute_metrics is not None:
                parts |= self.compute_metrics(batch, outputs)
            for name, (total, count) in parts.items():
                entry = sums.setdefault(name, [0.0, 0.0])
                entry[0] += float(total)
                entry[1] += float(count)
        names = sorted(sums)
        local = torch.tensor(
            [sums[name] for name in names], dtype=torch.float64, device=self.accelerator.device
        ).reshape(-1, 2)
        totals = self.accelerator.reduce(local, reduction="sum").cpu()
        metrics = {
            name: float(total / count) if count else float("nan")
            for name, (total, count) in zip(names, totals.tolist(), strict=True)
        }
        if self.finalize_metrics is not None:
            metrics = self.finalize_metrics(metrics)
        return metrics

    def _evaluate_and_track(self) -> dict[str, float]:
        metrics = self.evaluate()
        self._last_eval, self._last_eval_step = metrics, self.state.step
        self._write_metrics({"step": self.state.step, **metrics}, prefix="eval")
        summary = ", ".join(f"{name} {value:.4g}" for name, value in metrics.items())
        if self.accelerator.is_local_main_process:
            # tqdm.write keeps the progress bar intact below the message
            tqdm.write(f"eval at step {self.state.step}: {summary}")
        self._track_best(metrics)
        return metrics

    def _track_best(self, metrics: dict[str, float]) -> None:
        name = self.args.metric_for_best_model
        if name is None:
            return
        name = name.removeprefix("eval_")
        if name not in metrics:
            raise ConfigError(
                f"--metric-for-best-model {name!r} is not an eval metric; "
                f"choose from {', '.join(metrics)}"
            )
        greater = self.args.greater_is_better
        if greater is None:
            greater = not any(word in name for word in ("loss", "perplexity", "error"))
        value, best = metrics[name], self.state.best_metric
        if best is not None and (value <= best if greater else value >= best):
            return
        self.state.best_metric, self.state.best_step = value, self.state.step
        self.state.best_metrics = dict(metrics)
        self._save_model_atomically(self.output_dir / "best")

    def _final_metrics(self) -> dict[str, float]:
        if not self._can_evaluate():
            return {}
        if self._last_eval_step != self.state.step:
            self._evaluate_and_track()
        if self.args.metric_for_best_model and self.state.best_metrics is not None:
            self._load_best_model()
            return dict(self.state.best_metrics)
        return dict(self._last_eval)

    def _load_best_model(self) -> None:
        from safetensors.torch import load_model

        best = self.output_dir / "best" / "model.safetensors"
        load_model(
            self.accelerator.unwrap_model(self.model), best, device=str(self.accelerator.device)
        )
        self.accelerator.print(
            f"egbert: using the best model (step {self.state.best_step}, "
            f"{self.args.metric_for_best_model} {self.state.best_metric:.4g})",
            flush=True,
        )

    # ------------------------------------------------------------ checkpoints

    def save_checkpoint(self) -> Path:
        """Write checkpoints/step-N atomically: into a temp dir, fsync'ed, then renamed; keep
        the newest `keep_checkpoints`. A failed write leaves the previous checkpoints intact."""
        accelerator, state = self.accelerator, self.state
        final = self.checkpoint_dir / f"step-{state.step}"
        if final.is_dir():  # this very state is saved already (e.g. stopped right after resume)
            return final
        temp = self.checkpoint_dir / f".tmp-step-{state.step}"
        if accelerator.is_main_process:
            shutil.rmtree(temp, ignore_errors=True)
            self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        accelerator.wait_for_everyone()
        ok = self._on_all_processes(lambda: accelerator.save_state(str(temp)))
        if ok:  # every process has written its part: the main one publishes the whole
            publish = accelerator.is_main_process
            ok = self._on_all_processes(lambda: publish and self._publish_checkpoint(temp, final))
        if not ok:
            if accelerator.is_main_process:
                shutil.rmtree(temp, ignore_errors=True)
            previous = self.latest_checkpoint()
            kept = f"the previous checkpoint {previous} is intact" if previous else "none kept"
            raise CheckpointError(
                f"could not write checkpoint {final}: {self._save_error}; free disk space or "
                f"choose another --output-dir ({kept})"
            )
        if accelerator.is_main_process:
            self._rotate_checkpoints()
        accelerator.wait_for_everyone()
        return final

    def _on_all_processes(self, action: Callable[[], object]) -> bool:
        """Run `action`, then agree across processes whether it worked everywhere (also a
        barrier, so no process renames a checkpoint another one is still writing)."""
        self._save_error = "another process failed to write its part"
        failed = 0.0
        try:
            action()
        except OSError as error:
            self._save_error = _reason(error)
            failed = 1.0
        flag = torch.tensor([failed], device=self.accelerator.device)
        return not self.accelerator.reduce(flag, reduction="sum").item() > 0

    def _publish_checkpoint(self, temp: Path, final: Path) -> None:
        with (temp / STATE_FILE).open("w", encoding="utf-8") as handle:
            json.dump(asdict(self.state), handle, indent=2)
        _fsync_tree(temp)
        os.replace(temp, final)
        _fsync_dir(self.checkpoint_dir)

    def _rotate_checkpoints(self) -> None:
        checkpoints = self._checkpoints()
        for _, path in checkpoints[: -self.args.keep_checkpoints]:
            _remove_dir(path)

    def _checkpoints(self) -> list[tuple[int, Path]]:
        if not self.checkpoint_dir.is_dir():
            return []
        found = [(_checkpoint_step(path), path) for path in self.checkpoint_dir.iterdir()]
        return sorted((step, path) for step, path in found if step is not None)

    def latest_checkpoint(self) -> Path | None:
        """The newest complete checkpoint (a `step-N` only exists once fully written)."""
        checkpoints = self._checkpoints()
        return checkpoints[-1][1] if checkpoints else None

    def _start_or_resume(self) -> None:
        if self.accelerator.is_main_process:
            # temp dirs of a run killed while saving a checkpoint or the best model
            for folder in (self.checkpoint_dir, self.output_dir):
                for leftover in folder.glob(".tmp-*"):
                    shutil.rmtree(leftover, ignore_errors=True)
        self.accelerator.wait_for_everyone()
        latest = self.latest_checkpoint()
        if latest is not None and not self.args.resume:
            raise ConfigError(
                f"{self.output_dir} already holds checkpoints; pass --resume to continue that "
                "run or choose a new --output-dir"
            )
        if latest is None:
            if self.args.resume:
                self.accelerator.print(
                    f"egbert: no checkpoint in {self.checkpoint_dir}; starting from scratch",
                    flush=True,
                )
            set_seed(self.args.seed)
            self._truncate_metrics(after_step=0)
            return
        self._resume_from(latest)

    def _resume_from(self, checkpoint: Path) -> None:
        saved = json.loads((checkpoint / STATE_FILE).read_text(encoding="utf-8"))
        differences = config_differences(saved.get("run_config", {}), self.run_config)
        if differences and not self.args.resume_anyway:
            raise ConfigError(
                f"cannot resume from {checkpoint}: the run config changed ("
                + "; ".join(differences)
                + "); use the original options or pass --resume-anyway"
            )
        try:
            # weights_only: the optimizer, scheduler and RNG files are unpickled without
            # running any code a stranger could have put in them.
            self.accelerator.load_state(str(checkpoint), load_kwargs={"weights_only": True})
        except (pickle.UnpicklingError, RuntimeError, ValueError, KeyError) as error:
            message = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise CheckpointError(f"cannot load checkpoint {checkpoint}: {message}") from None
        known = {f.name for f in fields(TrainerState)}
        restored = TrainerState(**{k: v for k, v in saved.items() if k in known})
        restored.run_config, restored.config_hash = self.run_config, self.state.config_hash
        self.state = restored
        self._truncate_metrics(after_step=restored.step)
        self.accelerator.print(
            f"egbert: resumed from {checkpoint} (step {restored.step}, epoch {restored.epoch}, "
            f"batch {restored.batches_in_epoch} of the epoch)",
            flush=True,
        )

    # ------------------------------------------------------------ logs and outputs

    def _write_metrics(self, record: dict[str, Any], prefix: str) -> None:
        if not self.accelerator.is_main_process:
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        with (self.output_dir / METRICS_FILE).open("a", encoding="utf-8") as handle:
            handle.write(json.dumps({"split": prefix, **record}) + "\n")
        if self._tensorboard is None:
            from torch.utils.tensorboard import SummaryWriter

            self._tensorboard = SummaryWriter(str(self.output_dir / "tensorboard"))
        for name, value in record.items():
            if name != "step" and isinstance(value, int | float):
                self._tensorboard.add_scalar(f"{prefix}/{name}", value, record["step"])
        self._tensorboard.flush()

    def _truncate_metrics(self, after_step: int) -> None:
        """Drop log lines past the checkpoint we restart from: those steps are trained again."""
        path = self.output_dir / METRICS_FILE
        if not self.accelerator.is_main_process or not path.is_file():
            return
        lines = path.read_text(encoding="utf-8").splitlines()
        kept = [line for line in lines if _record_step(line) <= after_step]
        path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")

    def read_metrics(self) -> list[dict[str, Any]]:
        path = self.output_dir / METRICS_FILE
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]

    def _save_model_atomically(self, target: Path) -> None:
        temp = target.with_name(f".tmp-{target.name}")
        if self.accelerator.is_main_process:
            shutil.rmtree(temp, ignore_errors=True)
        self._save_model(temp, with_tokenizer=False)
        if self.accelerator.is_main_process:
            _fsync_tree(temp)
            if target.exists():
                _remove_dir(target)
            os.replace(temp, target)
        self.accelerator.wait_for_everyone()

    def _save_model(self, directory: Path, with_tokenizer: bool) -> None:
        accelerator = self.accelerator
        model = accelerator.unwrap_model(self.model)
        state_dict = accelerator.get_state_dict(self.model)
        if hasattr(model, "save_pretrained"):
            with self._label_smoothing(self._model_label_smoothing):
                model.save_pretrained(
                    directory,
                    is_main_process=accelerator.is_main_process,
                    save_function=accelerator.save,
                    state_dict=state_dict,
                )
        else:
            accelerator.save_model(self.model, directory)
        if with_tokenizer and self.tokenizer is not None and accelerator.is_main_process:
            self.tokenizer.save_pretrained(directory)
        accelerator.wait_for_everyone()

    def _save_final_model(self) -> None:
        """Written beside the output directory's files, then moved over them, so that a kill
        or a full disk never leaves a half-written model.safetensors there."""
        temp = self.output_dir / ".tmp-final-model"
        main = self.accelerator.is_main_process
        if main:
            shutil.rmtree(temp, ignore_errors=True)
        # Saving creates the folder in every process: none may do so before it is cleared.
        self.accelerator.wait_for_everyone()
        try:
            self._save_model(temp, with_tokenizer=True)
            if main:
                _fsync_tree(temp)
                for path in temp.iterdir():
                    os.replace(path, self.output_dir / path.name)
        finally:
            if main:
                shutil.rmtree(temp, ignore_errors=True)
        self.accelerator.wait_for_everyone()
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None

    def _plot_loss_curve(self) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        records = self.read_metrics()
        figure, axes = plt.subplots(figsize=(7, 4))
        for split in ("train", "eval"):
            points = [
                (r["step"], r["loss"]) for r in records if r["split"] == split and "loss" in r
            ]
            if points:
                axes.plot(
                    *zip(*points, strict=True),
                    marker="." if split == "eval" else None,
                    label=f"{split} loss",
                )
        axes.set_xlabel("step")
        axes.set_ylabel("loss")
        axes.legend()
        axes.grid(alpha=0.3)
        figure.tight_layout()
        figure.savefig(self.output_dir / "loss_curve.png", dpi=120)
        plt.close(figure)

    def _write_model_card(self, metrics: dict[str, float]) -> None:
        model = self.accelerator.unwrap_model(self.model)
        config = getattr(model, "config", None)
        model_type = getattr(config, "model_type", type(model).__name__)
        state = self.state
        run_config = {k: v for k, v in self.run_config.items() if k != "trainer"}
        results = "\n".join(f"| {name} | {value:.4f} |" for name, value in metrics.items())
        card = f"""---
library_name: transformers
tags: [egbert, {model_type}]
---
# {type(model).__name__} ({model_type}) trained with egbert

```python
import egbert  # registers egbert's model types with the transformers Auto classes
from transformers import AutoModel, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("{self.output_dir}")
model = AutoModel.from_pretrained("{self.output_dir}")  # the encoder/decoder without its head
```

The full model with its head is `{type(model).__name__}.from_pretrained(...)`.

## Results

| metric | value |
|---|---|
{results or "| (no evaluation data) | |"}

## Training

{state.step} optimizer steps, {state.epoch} full epochs, {state.tokens_seen:,} tokens,
{state.elapsed_seconds / 60:.1f} minutes of training on {self.accelerator.num_processes}
process(es) ({self.accelerator.device}); loss curve: `loss_curve.png`, log: `metrics.jsonl`.

```json
{json.dumps(asdict(self.args), indent=2)}
```

## Run configuration (data, tokenizer, model)

```json
{json.dumps(run_config, indent=2, default=str)}
```

## Model configuration

```json
{config.to_json_string() if hasattr(config, "to_json_string") else "{}"}
```
"""
        (self.output_dir / "README.md").write_text(card, encoding="utf-8")

    # ------------------------------------------------------------ signals

    @contextmanager
    def _stop_on_signals(self) -> Iterator[None]:
        """SIGINT / SIGTERM: finish the step, checkpoint, return; a second signal exits now."""

        def request_stop(signum: int, frame: object) -> None:
            if self._signal_received is not None:
                sys.stderr.write("egbert: second signal, exiting now\n")
                sys.stderr.flush()
                os._exit(128 + signum)
            self._signal_received = signum
            sys.stderr.write(
                f"\negbert: {signal.Signals(signum).name}: stopping after this step and saving "
                "a checkpoint (send it again to exit at once)\n"
            )
            sys.stderr.flush()

        previous = {}
        if threading.current_thread() is threading.main_thread():  # else leave them be
            for signum in (signal.SIGINT, signal.SIGTERM):
                previous[signum] = signal.signal(signum, request_stop)
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def _reason(error: OSError) -> str:
    return "disk full" if error.errno == errno.ENOSPC else error.strerror or str(error)


@functools.cache
def matmul_gflops(device: str, dtype: torch.dtype, size: int = 256, repeats: int = 3) -> float:
    """GFLOP/s of one size x size matmul at `dtype` on `device`: the best of `repeats` timed
    calls after a warm-up one (which pays for allocations and kernel selection)."""
    matrix = torch.randn(size, size, device=device).to(dtype)
    on_gpu = torch.device(device).type == "cuda"
    torch.mm(matrix, matrix)
    best = math.inf
    for _ in range(repeats):
        if on_gpu:  # a timer read must count the GPU's queued work
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        torch.mm(matrix, matrix)
        if on_gpu:
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / max(best, 1e-9) / 1e9


def bf16_pays_off(device: str) -> bool:
    """Whether bf16 autocast makes training faster on this device.

    CPUs without native bf16 instructions (AVX512-BF16 or AMX; e.g. AVX2-only AMD EPYC) emulate
    bf16 matmuls hundreds of times slower than fp32, so on a CPU this is measured, not assumed.
    """
    if device == "cuda":
        return torch.cuda.is_bf16_supported()
    if device != "cpu":
        return True  # other accelerators: trust the user's --bf16
    return matmul_gflops("cpu", torch.bfloat16) > matmul_gflops("cpu", torch.float32)


def _has_accelerator() -> bool:
    if hasattr(torch, "accelerator"):  # torch >= 2.6: CUDA, XPU, MPS, ...
        return torch.accelerator.is_available()
    return torch.cuda.is_available()


def _record_step(line: str) -> int:
    try:
        return int(json.loads(line).get("step", 0))
    except (ValueError, AttributeError):
        return 0
