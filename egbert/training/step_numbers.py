"""What the trainer counts per optimizer step (losses, real tokens, FLOPs), kept on the device
until the processes agree on them, and the training time they are divided by (the clock, or a
finished run's clock replayed).

Reading a number off the device stalls the step, so each step's numbers are summed on the device
and read at a log, evaluation or save step only, in one collective over every process
(`PendingSteps.agree`): the mean losses, the token and FLOP counts, the first step whose loss was
not finite, whether a signal asked to stop, and the elapsed time.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator

from egbert.errors import ConfigError, TrainingError
from egbert.report import LossWindow
from egbert.training.runtime import run_matmul_peak_flops, synchronize

# The elapsed training seconds after each step of a finished run (--replay-clock replays them)
CLOCK_FILE = "clock.json"
# Where a step ran: (step, epoch, batch of the epoch), for the message that names a bad one.
Place = tuple[int, int, int]


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


def default_flops_per_token(model: torch.nn.Module) -> Callable[[int], float] | None:
    """The model's own `flops_per_token(seq_len)` (egbert's pretraining models), else 6 FLOPs
    per weight outside the embeddings (transformers' `floating_point_ops` estimate), else None:
    no MFU in the log."""
    own = getattr(model, "flops_per_token", None)
    if own is not None:
        return own
    if hasattr(model, "num_parameters"):
        dense = 6.0 * model.num_parameters(exclude_embeddings=True)
        return lambda seq_len: dense
    return None


def nonfinite_place(place: Place) -> str:
    step, epoch, batch = place
    return f"at step {step} (epoch {epoch}, batch {batch} of the epoch)"


def nonfinite_error(loss: float, place: Place) -> TrainingError:
    return TrainingError(
        f"the loss is {loss} {nonfinite_place(place)}; lower --lr, check the data, or pass "
        f"--skip-nonfinite N to skip up to N such steps"
    )


def skip_nonfinite_step(state: Any, found: tuple[float, Place], allowed: int) -> str:
    """--skip-nonfinite: count the step of a non-finite loss `found` in the TrainerState
    `state`; what to say of it, or the run's TrainingError once more than `allowed` are."""
    state.skipped_nonfinite += 1
    if state.skipped_nonfinite > allowed:
        raise nonfinite_error(*found)
    return skipped_message(found, state.skipped_nonfinite, allowed)


def skipped_message(found: tuple[float, Place], skipped: int, allowed: int) -> str:
    loss, place = found
    return (
        f"egbert: skipped a step with loss {loss} {nonfinite_place(place)} "
        f"({skipped} of {allowed} allowed)"
    )


def skip_overflow_step(state: Any, scale: float) -> str:
    """fp16: count a step whose gradients overflowed in the TrainerState `state` (the scaler
    skipped its update and lowered the loss scale to `scale`); what to say of it."""
    state.skipped_overflow += 1
    return (
        f"egbert: fp16 gradients overflowed at step {state.step + 1}; update skipped, loss scale "
        f"lowered to {scale:g} ({state.skipped_overflow} skipped so far)"
    )


def precision_record(state: Any, scale: float | None) -> dict[str, float]:
    """fp16's part of a training record: the loss scale and the updates skipped so far."""
    if scale is None:
        return {}
    return {"loss_scale": scale, "skipped_overflow": state.skipped_overflow}


def agrees_each_step(skip_nonfinite: int, timed: bool, num_processes: int) -> bool:
    """Whether the processes agree every step (before the update) or at sync points only:
    skipping non-finite steps (--skip-nonfinite) must decide before the update, and a run
    `timed` by its elapsed time (a budget, evaluations at minute marks) shared by several
    processes must give them one elapsed time (one lr, one evaluation step) every step."""
    return skip_nonfinite > 0 or (timed and num_processes > 1)


class EvaluationMarks:
    """When evaluation is due: every --eval-every steps, and each time another
    --eval-every-minutes of training time have passed, counted from the training time a run
    starts or resumes at. `due` says so once per mark (a step past several evaluates once). The
    processes agree before evaluating, so that neither sees weights a non-finite loss reached."""

    def __init__(self, args: Any, elapsed_seconds: float) -> None:
        self.eval_every, self.every_seconds = args.eval_every, args.eval_every_minutes * 60
        self.done = self.passed(elapsed_seconds)

    def passed(self, elapsed_seconds: float) -> int:
        return int(elapsed_seconds // self.every_seconds) if self.every_seconds else 0

    def due(self, step: int, elapsed_seconds: float) -> bool:
        at_step = bool(self.eval_every) and step % self.eval_every == 0
        passed = self.passed(elapsed_seconds)
        at_mark, self.done = passed > self.done, max(passed, self.done)
        return at_step or at_mark


def eval_record(state: Any, epoch: float, metrics: dict[str, float]) -> dict[str, Any]:
    """An evaluation's record: where in the run (the TrainerState `state`) it came, with the
    training time, and its metrics."""
    elapsed = round(state.elapsed_seconds, 3)
    return {"step": state.step, "epoch": epoch, "elapsed_s": elapsed, **metrics}


class TrainingClock:
    """The training time: wall time less what `paused()` spans (logging, evaluation, saving).
    With --compile the first step's time (compiling, then running, once the device is done)
    goes to `compile_seconds` instead."""

    def __init__(self, compiling: bool) -> None:
        self.compiling = compiling  # the next step is --compile's first
        self.compile_seconds = 0.0
        self.last = time.perf_counter()

    def advance(self, elapsed: float, device: torch.device, say: Callable[[str], None]) -> float:
        """The training seconds elapsed after this step: `elapsed` (before it) and the time since
        the last call (none for the compile step, whose time it says)."""
        if self.compiling:
            synchronize(device)
        now = time.perf_counter()
        seconds, self.last = now - self.last, now
        if not self.compiling:
            return elapsed + seconds
        self.compiling = False
        self.compile_seconds += seconds
        say(
            f"egbert: compiled the model in {seconds:.1f} s (the first step; left out of the "
            "training time, tokens/s and MFU)"
        )
        return elapsed

    @contextmanager
    def paused(self) -> Iterator[None]:
        started = time.perf_counter()
        yield
        self.last += time.perf_counter() - started


class ReplayedClock:
    """A finished run's clock (--replay-clock): each step's elapsed seconds as that run's
    CLOCK_FILE recorded them, so that a budget run's schedule and its last step are that run's
    whatever this machine's speed. Bit for bit: the readings are set, not added up again."""

    compiling = False
    compile_seconds = 0.0

    def __init__(self, readings: list[float], done: int, source: str) -> None:
        self.readings, self.next, self.source = readings, done, source

    def advance(self, elapsed: float, device: torch.device, say: Callable[[str], None]) -> float:
        if self.next >= len(self.readings):
            raise TrainingError(
                f"--replay-clock {self.source}: that run ended after {len(self.readings)} steps "
                "and this one goes on; replay it with that run's options, data and seed"
            )
        self.next += 1
        return self.readings[self.next - 1]

    def paused(self) -> AbstractContextManager:
        return nullcontext()


def training_clock(
    compiling: bool, replay_clock: str | None, replayed: list[float] | None, state: Any
) -> TrainingClock | ReplayedClock:
    """The wall clock (`compiling`: --compile's first step not timed), or with --replay-clock
    (the folder `replay_clock`, its run's readings `replayed`) that run's clock from the
    TrainerState `state`'s step on."""
    if replayed is None:
        return TrainingClock(compiling=compiling)
    return ReplayedClock(replayed, len(state.clock_readings), replay_clock)


def write_clock(output_dir: Path, state: Any) -> None:
    """CLOCK_FILE: the TrainerState `state`'s clock readings, the elapsed training seconds after
    each step (skipped ones too), what --replay-clock reads; only where they are all known (a
    run resumed from a checkpoint written before egbert kept them has the later ones only)."""
    if len(state.clock_readings) == state.step + state.skipped_nonfinite:
        text = json.dumps({"elapsed_seconds": state.clock_readings}) + "\n"
        (output_dir / CLOCK_FILE).write_text(text, encoding="utf-8")


def read_clock(run_dir: str) -> list[float]:
    """The elapsed seconds after each step of the finished run in `run_dir` (its CLOCK_FILE)."""
    path = Path(run_dir) / CLOCK_FILE
    if not path.is_file():
        raise ConfigError(
            f"--replay-clock {run_dir}: no {CLOCK_FILE} there; pass the folder of a finished "
            "training run (egbert writes its clock at the end of each run)"
        )
    return json.loads(path.read_text(encoding="utf-8"))["elapsed_seconds"]


class StepNumbers:
    """One optimizer step's numbers, on the device: (tokens, timed tokens, FLOPs) and the mean
    of each loss part over its batches."""

    def __init__(
        self,
        tokens: torch.Tensor | int,
        flops: torch.Tensor | float,
        losses: dict[str, torch.Tensor],
        device: torch.device,
    ) -> None:
        def on_device(value: torch.Tensor | float) -> torch.Tensor:
            if torch.is_tensor(value):
                return value.to(torch.float64)
            # a host number added to a device zero: a kernel argument, where torch.tensor(value,
            # device=...) would copy it over and wait for the copy
            return torch.zeros((), dtype=torch.float64, device=device) + value

        self.tokens = on_device(tokens)
        self.timed = torch.stack([self.tokens, on_device(flops)])  # tokens, FLOPs of tokens/s
        self.losses = {name: value.to(torch.float64) for name, value in losses.items()}


@dataclass
class Agreement:
    """What every process agreed on over the steps since the last agreement."""

    steps: int
    tokens: float
    timed_tokens: float  # tokens of the steps whose time counts for tokens/s (not the compile's)
    flops: float
    losses: dict[str, float]  # summed over the steps, averaged over the processes
    elapsed_seconds: float  # the largest of the processes' clocks
    stop: bool  # a signal reached some process
    first_nonfinite: tuple[float, Place] | None  # (its loss, its place), when a loss was not


class PendingSteps:
    """The steps since the processes last agreed, summed on the device: tokens, timed tokens,
    FLOPs and losses, and the first step whose loss was not finite (inf: none), with each
    step's place (step, epoch, batch) for the message that names it."""

    def __init__(self) -> None:
        self.steps = 0
        self.totals: torch.Tensor | None = None  # (tokens, timed tokens, FLOPs)
        self.losses: dict[str, torch.Tensor] = {}
        self.first_nonfinite: torch.Tensor | None = None
        self.places: list[Place] = []

    def add(self, step: StepNumbers, place: Place) -> None:
        totals = torch.cat([step.tokens.reshape(1), step.timed])
        nonfinite = torch.where(
            torch.isfinite(step.losses["loss"]), math.inf, float(len(self.places))
        )
        if self.steps == 0:
            self.totals, self.losses, self.first_nonfinite = totals, dict(step.losses), nonfinite
        else:
            self.totals = self.totals + totals
            self.losses = {name: self.losses[name] + step.losses[name] for name in self.losses}
            self.first_nonfinite = torch.minimum(self.first_nonfinite, nonfinite)
        self.places.append(place)
        self.steps += 1

    def agree(self, accelerator: Accelerator, stop: bool, elapsed_seconds: float) -> Agreement:
        """One collective over these steps on every process: the budget schedule needs one
        elapsed time (one lr) on all of them, and only an agreed stop flag lets them all leave
        the loop at the same step."""
        names = list(self.losses)
        local = torch.cat(
            [
                self.totals,
                self.first_nonfinite.reshape(1),
                torch.tensor(
                    [float(stop), elapsed_seconds], dtype=torch.float64, device=accelerator.device
                ),
                torch.stack([self.losses[name] for name in names]),
            ]
        )
        every = accelerator.gather(local.unsqueeze(0)).cpu()  # (processes, 6 + losses)
        tokens, timed_tokens, flops = every[:, :3].sum(dim=0).tolist()
        first_nonfinite, signal, elapsed = every[:, 3].min(), every[:, 4].max(), every[:, 5].max()
        losses = dict(zip(names, every[:, 6:].mean(dim=0).tolist(), strict=True))
        found = None
        if math.isfinite(first_nonfinite):
            found = (losses["loss"], self.places[int(first_nonfinite)])
        return Agreement(
            steps=self.steps,
            tokens=tokens,
            timed_tokens=timed_tokens,
            flops=flops,
            losses=losses,
            elapsed_seconds=float(elapsed),
            stop=bool(signal > 0),
            first_nonfinite=found,
        )


class StepLedger:
    """The steps' numbers on their way from the device to the log: each step's wait on the
    device (`add`) until the processes agree on them (`agree`); agreed, they go to the window
    that the next training record averages (`record`)."""

    def __init__(self, accelerator: Accelerator, elapsed_seconds: float, flops: bool) -> None:
        self.accelerator, self.counts_flops = accelerator, flops
        self.pending = PendingSteps()
        self.window = LossWindow(elapsed_seconds)
        self.matmul_peak_flops: float | None = None  # MFU's denominator, once FLOPs are logged

    def add(self, step: StepNumbers, place: Place) -> None:
        self.pending.add(step, place)

    def agree(self, state: Any, stop: bool) -> Agreement:
        """The processes agree on the pending steps (`PendingSteps.agree`): the elapsed time
        goes to the TrainerState `state`, and unless a loss was not finite (`first_nonfinite`
        says where; nothing is added then) the tokens go to `state`, the losses to the window."""
        agreed = self.pending.agree(self.accelerator, stop, state.elapsed_seconds)
        self.pending = PendingSteps()
        state.elapsed_seconds = agreed.elapsed_seconds
        if agreed.first_nonfinite is None:
            state.tokens_seen += int(agreed.tokens)
            self.window.add(agreed.losses, agreed.steps, agreed.timed_tokens, agreed.flops)
        return agreed

    def record(self, state: Any, lr: float) -> dict[str, Any]:
        """The window's training log record at the TrainerState `state`; a new window starts."""
        if self.counts_flops:
            self.matmul_peak_flops = run_matmul_peak_flops(self.accelerator)
        record = self.window.record(
            state.step, state.epoch, lr, state.elapsed_seconds, self.matmul_peak_flops
        )
        self.window = LossWindow(state.elapsed_seconds)
        return record
