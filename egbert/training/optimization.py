"""The optimizer and how a run's learning rate and batch size move: AdamW and its parameter
groups, Muon beside it, the schedules, the warmup, the budget mode and the batch ramp (pure
functions of where the run stands).

Optimizer (`optim`). `adamw`: torch's AdamW on every parameter (no decay on biases and norms).
`muon`: torch.optim.Muon (Jordan et al. 2024, "Muon: an optimizer for hidden layers") on the 2-d
weight matrices of the model's body (`model.base_model`: attention, feed-forward, the LSTMs'
matrices), whose momentum it orthogonalises by Newton-Schulz iterations, and AdamW on the rest:
embeddings (and the LM head tied to them), the heads outside the body, norms and biases, which
Muon's authors leave to AdamW. Muon's update is scaled to AdamW's RMS (Moonshot's
`match_rms_adamw`, Liu et al. 2025), so `muon_lr` unset takes `lr`. Both live in one optimizer
(MuonWithAdamW) so that the schedule, Accelerate, clipping and checkpoints see one.

Learning rate. `lr` is the peak rate of `linear`, `cosine`, `constant` and `wsd`; the multiplier
(LambdaLR) rises linearly from 0 over the warmup and then falls to 0 at the last step (linear,
cosine) or stays at 1 (constant), with the same values as transformers'
`get_{linear,cosine,constant}_schedule_with_warmup`. `wsd` (warmup-stable-decay, the trapezoid
of modded-nanogpt and MiniCPM) stays at 1 after the warmup until the last `wsd_decay` share of
the run, over which it falls linearly to 0. For `inverse_sqrt` (the Noam rule of
"Attention Is All You Need") the rate at update n = step + 1 is
    lr * d_model**-0.5 * min(n**-0.5, n * warmup**-1.5),
d_model being `model.config.hidden_size`: `lr` is a scale, 1.0 gives the paper's rule (peak
d_model**-0.5 * warmup**-0.5 at n = warmup, e.g. 7.0e-4 for d_model 512 and warmup 4000).

Budget mode (`budget_minutes`): training stops once that much training wall time (evaluation and
checkpoint writing excluded) has passed, and the schedule runs over time instead of steps: its
progress is elapsed / budget, so linear and cosine reach 0 exactly at the deadline. With
`epochs` or `max_steps` as well, the run stops at whichever end comes first, and the schedule
follows it: its progress is max(step / total steps, elapsed / budget). Both parts come from the
checkpoint on resume (the elapsed time is saved with it), so a resumed run continues the same
schedule, though the clock of its remaining steps is the new machine's. A fractional warmup is a
share of the budget; an integer warmup ramps over that many steps and multiplies the time-based
decay. inverse_sqrt stays step-based and simply stops at the deadline.

Batch ramp (`batch_ramp_to`): the batch grows linearly over the run from `batch_size` to
`batch_ramp_to` examples a step, by accumulating more batches per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType
from torch import nn

from egbert.config import SCHEDULES
from egbert.errors import ConfigError
from egbert.training.batches import Batching


@dataclass(frozen=True)
class OptimizerOptions:
    """The trainer's optimizer: the TrainingArguments fields of these names."""

    optim: str
    lr: float
    weight_decay: float
    adam_beta1: float
    adam_beta2: float
    adam_epsilon: float
    muon_lr: float | None
    muon_weight_decay: float
    muon_momentum: float


@dataclass(frozen=True)
class RunLength:
    """Where a run ends: after --epochs, --max-steps or --budget-minutes (the TrainingArguments
    fields of these names, each unset or not), whichever comes first."""

    epochs: int | None
    max_steps: int | None
    budget_minutes: float | None


@dataclass(frozen=True)
class Schedule:
    """A run's learning-rate schedule: its name (--schedule), its length and warmup in the
    schedule's unit (total_steps, warmup_length), whether --warmup-steps is a share of the run,
    the budget it runs over (None: it runs over steps) and the model's width (inverse_sqrt)."""

    name: str
    total: int | None
    warmup: float
    warmup_is_ratio: bool
    budget_minutes: float | None
    d_model: int | None
    wsd_decay: float = 1.0  # wsd only: the share of the run it decays over (--wsd-decay)


def parameter_groups(
    model: torch.nn.Module, weight_decay: float, leave_out: frozenset[int] = frozenset()
) -> list[dict[str, Any]]:
    """AdamW groups: decay on matrices only. Biases, LayerNorm and other norm weights (1-d, or
    named *norm*) get none: decaying them pulls scales towards 0 and buys no regularisation.
    Parameters whose id is in `leave_out` (Muon's) are in neither."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad or id(param) in leave_out:
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


def muon_matrices(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters Muon trains: the trainable 2-d weights of the model's body
    (`base_model`, the model itself where it has none) that are not embedding tables. The heads,
    an LM head tied to the embeddings or not, lie outside the body."""
    body = getattr(model, "base_model", model)
    tables = {id(module.weight) for module in model.modules() if isinstance(module, nn.Embedding)}
    return [
        param
        for param in body.parameters()
        if param.requires_grad and param.ndim == 2 and id(param) not in tables
    ]


class MuonWithAdamW(torch.optim.Optimizer):
    """torch's Muon on some parameters and AdamW on the others, as one optimizer.

    Its param_groups are the two optimizers' own group dicts (Muon's first) and its state is
    theirs, so that LambdaLR, Accelerate's wrapper, gradient clipping, GradScaler and
    state_dict / load_state_dict (checkpoints) see one optimizer, and each group keeps its own
    lr, weight decay and hyperparameters."""

    def __init__(self, muon: torch.optim.Muon, adamw: torch.optim.AdamW):
        self.muon, self.adamw = muon, adamw
        super().__init__(muon.param_groups + adamw.param_groups, defaults={})
        self._share_groups_and_state()

    def _share_groups_and_state(self) -> None:
        count = len(self.muon.param_groups)
        self.muon.param_groups = self.param_groups[:count]
        self.adamw.param_groups = self.param_groups[count:]
        self.muon.state = self.adamw.state = self.state  # keyed by parameter: disjoint

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.muon.step()
        self.adamw.step()
        return loss

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's load, which replaces param_groups and state with new objects: shared again."""
        super().load_state_dict(state_dict)
        self._share_groups_and_state()


def check_muon_engine(optim: str, engine: DistributedType) -> None:
    """Refuse Muon under the engines that shard or own the optimizer: FSDP hands each process
    a shard of every matrix, and Muon orthogonalises a matrix whole; DeepSpeed builds its own."""
    if optim == "muon" and engine in (DistributedType.FSDP, DistributedType.DEEPSPEED):
        raise ConfigError(
            f"--optim muon does not run under {engine.value}: it orthogonalises each weight "
            "matrix whole; train with DDP (configs/accelerate/ddp.yaml) or --optim adamw"
        )


def training_optimizer(
    model: torch.nn.Module, accelerator: Accelerator, options: OptimizerOptions
) -> torch.optim.Optimizer:
    """The trainer's optimizer on the accelerator's device: AdamW with the options' lr, betas,
    eps and weight decay (not on biases and norms: parameter_groups), and with --optim muon
    Muon on `muon_matrices` (refused under FSDP and DeepSpeed: check_muon_engine)."""
    check_muon_engine(options.optim, accelerator.distributed_type)
    matrices = muon_matrices(model) if options.optim == "muon" else []
    if options.optim == "muon" and not matrices:
        raise ConfigError("--optim muon: the model has no 2-d weight matrices in its body")
    leave_out = frozenset(map(id, matrices))
    rest = adamw(
        parameter_groups(model, options.weight_decay, leave_out),
        accelerator.device,
        lr=options.lr,
        betas=(options.adam_beta1, options.adam_beta2),
        eps=options.adam_epsilon,
    )
    if options.optim == "adamw":
        return rest
    muon = torch.optim.Muon(
        matrices,
        lr=options.muon_lr or options.lr,
        weight_decay=options.muon_weight_decay,
        momentum=options.muon_momentum,
        adjust_lr_fn="match_rms_adamw",
    )
    return MuonWithAdamW(muon, rest)


def schedule_multiplier(
    schedule: str, position: float, total: float, warmup: float, wsd_decay: float = 1.0
) -> float:
    """Multiplier of the peak lr for linear | cosine | constant | wsd at `position` of a run of
    `total` with `warmup`, all three in one unit (steps, or seconds in budget mode); wsd
    decays over the last `wsd_decay` share of `total` (the others ignore it)."""
    if position < warmup:
        return position / warmup
    if schedule == "constant":
        return 1.0
    if schedule == "wsd":
        return min(1.0, max(0.0, (total - position) / (wsd_decay * total)))
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


def total_steps(length: RunLength, steps_per_epoch: int) -> int | None:
    """The run's length in optimizer steps; None for a budget run without --epochs."""
    if length.max_steps is not None:
        return length.max_steps
    if length.budget_minutes is not None and length.epochs is None:
        return None
    return (length.epochs or 1) * steps_per_epoch


def warmup_length(
    warmup_steps: float, warmup_is_ratio: bool, budget_minutes: float | None, total: int | None
) -> float:
    """--warmup-steps in the schedule's own unit: steps, or seconds for a fractional budget
    warmup."""
    if not warmup_is_ratio:
        return int(warmup_steps)
    if budget_minutes is not None:
        return warmup_steps * budget_minutes * 60
    return round(warmup_steps * total)


def lr_multiplier(schedule: Schedule, step: int, elapsed_seconds: float) -> float:
    """The multiplier of the peak lr after `step` updates and `elapsed_seconds` of training."""
    name, total, warmup = schedule.name, schedule.total, schedule.warmup
    if name == "inverse_sqrt":
        return noam_multiplier(step, int(warmup), schedule.d_model)
    decay = schedule.wsd_decay
    if schedule.budget_minutes is None:
        return schedule_multiplier(name, step, total, warmup, decay)
    budget = schedule.budget_minutes * 60
    position = budget * run_progress(schedule.budget_minutes, step, elapsed_seconds, total)
    if schedule.warmup_is_ratio:
        return schedule_multiplier(name, position, budget, warmup, decay)
    ramp = min(1.0, step / warmup) if warmup else 1.0
    return ramp * schedule_multiplier(name, position, budget, 0.0, decay)


def run_progress(
    budget_minutes: float | None, step: int, elapsed_seconds: float, total: int | None
) -> float:
    """The share of the run done: of the budget, of the `total` steps, or with both the larger
    share (the run stops at whichever end comes first, and the schedule and ramp follow it)."""
    shares = []
    if budget_minutes is not None:
        shares.append(elapsed_seconds / (budget_minutes * 60))
    if total is not None:
        shares.append(step / total)
    return max(shares)


def batches_per_step(
    batching: Batching,
    budget_minutes: float | None,
    step: int,
    elapsed_seconds: float,
    total: int | None,
) -> int:
    """--grad-accum, or with --batch-ramp-to the ramp's count at this point of the run:
    1 at the start, growing linearly with the share of the run done (`run_progress`)."""
    if batching.batch_ramp_to is None:
        return batching.grad_accum
    done = run_progress(budget_minutes, step, elapsed_seconds, total)
    final = batching.batch_ramp_to // batching.batch_size
    return 1 + math.floor((final - 1) * min(done, 1.0) + 0.5)


def accumulation_text(batching: Batching) -> str:
    if batching.batch_ramp_to is None:
        return f"{batching.grad_accum} accumulation"
    return f"1 to {batching.batch_ramp_to // batching.batch_size} accumulation (batch ramp)"


def check_run_length(length: RunLength, batch_ramp_to: int | None, streaming: bool) -> None:
    """Refuse a run whose end the batches need but the options leave open: a batch ramp holds
    fewer batches per step at the start than at the end, and a stream has no length."""
    if batch_ramp_to is not None and length.budget_minutes is None and not length.max_steps:
        raise ConfigError(
            f"--batch-ramp-to {batch_ramp_to} needs a run length: --budget-minutes or --max-steps"
        )
    if (
        streaming
        and length.max_steps is None
        and (length.budget_minutes is None or length.epochs is not None)
    ):
        raise ConfigError(
            "streaming training data has no length; give --max-steps, or "
            "--budget-minutes without --epochs"
        )
