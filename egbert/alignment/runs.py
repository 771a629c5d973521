"""What egbert's TRL jobs (reward, rlhf) share of a run: the checkpoint --resume goes on from,
the callback that ends training, with a checkpoint, at the budget's end or on a signal, the
training itself under that callback, and a progress bar that shows the logged numbers."""

from __future__ import annotations

import time
from pathlib import Path

from transformers import ProgressCallback, Trainer, TrainerCallback
from transformers.trainer_utils import get_last_checkpoint

from egbert.errors import CheckpointError, ConfigError, Interrupted
from egbert.training.runtime import stop_on_signals

CHECKPOINTS = "checkpoints"


def last_checkpoint(output_dir: Path, resume: bool, results_file: str) -> str | None:
    """The checkpoint --resume goes on from; refuses a fresh run over an earlier one's (its
    checkpoints, or its `results_file`)."""
    checkpoints = output_dir / CHECKPOINTS
    found = get_last_checkpoint(str(checkpoints)) if checkpoints.is_dir() else None
    if resume and found is None:
        raise CheckpointError(f"--resume: no checkpoint in {checkpoints}; drop --resume")
    if not resume and (found is not None or (output_dir / results_file).exists()):
        raise ConfigError(
            f"--output-dir {output_dir} holds an earlier run; pass --resume to go on from its "
            "checkpoint, or choose another --output-dir"
        )
    return found


class StopTraining(TrainerCallback):
    """Ends training, with a checkpoint, at the first step past the budget or after a signal."""

    def __init__(self, budget_minutes: float | None) -> None:
        self.budget_seconds = None if budget_minutes is None else 60 * budget_minutes
        self.signum: int | None = None
        self.start = 0.0

    def request(self, signum: int) -> None:
        self.signum = signum

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        spent = time.perf_counter() - self.start
        if self.signum is not None or (self.budget_seconds and spent >= self.budget_seconds):
            control.should_training_stop = True
            control.should_save = True  # the step reached, for --resume
        return control


class ProgressWithMetrics(ProgressCallback):
    """transformers' progress bar with the latest of the logged `metrics` after it, in place of
    every log printed under it (TRL logs some twenty numbers at each step)."""

    def __init__(self, metrics: tuple[str, ...]) -> None:
        super().__init__()
        self.metrics = metrics

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.training_bar is not None and logs:
            shown = {name: logs[name] for name in self.metrics if name in logs}
            self.training_bar.set_postfix(shown, refresh=False)


def show_metrics_in_progress_bar(trainer: Trainer, metrics: tuple[str, ...]) -> None:
    """The trainer's progress bar (if it shows one) as ProgressWithMetrics."""
    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(ProgressWithMetrics(metrics))


def train_until_stopped(
    trainer: Trainer, checkpoint: str | None, stop: StopTraining, output_dir: Path
) -> float:
    """trainer.train() from `checkpoint`, a signal stopping it after its step with a checkpoint
    (then egbert.errors.Interrupted); the seconds it trained."""
    start = time.perf_counter()
    with stop_on_signals(stop.request):
        trainer.train(resume_from_checkpoint=checkpoint)
    if stop.signum is not None:
        raise Interrupted(
            f"stopped at step {trainer.state.global_step}; a checkpoint is in "
            f"{output_dir / CHECKPOINTS}: the same command with --resume goes on from it",
            stop.signum,
        )
    return time.perf_counter() - start
