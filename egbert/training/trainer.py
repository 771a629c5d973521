"""The shared training loop: one Accelerate trainer for pretraining and fine-tuning every model.

The trainer knows nothing about BERT, GPT or ELMo: it calls `model(**batch)` and optimizes
`outputs.loss`. Around that it does what a run of hours needs: gradient accumulation, bf16,
clipping, AdamW without decay on biases and norms, learning-rate schedules over steps or over a
wall-time budget (optimization.py), periodic evaluation, atomic checkpoints with exact resume
(weights, optimizer, scheduler, RNG and the position in the data; checkpoints.py), a graceful
stop on SIGINT/SIGTERM, and at the end the model in `OUTPUT_DIR/model/` (what a Hub repository
holds: weights, config, tokenizer, card) with checkpoints and logs beside it. Device facts live
in runtime.py; the run's logs, trackers, loss curve and card in egbert.report.

Data. Training examples come from a map-style dataset (shuffled per epoch, replayable on resume)
or a streaming `datasets.IterableDataset` (split between the processes, its position kept in
each checkpoint): batches.py, which also says what collators must not do. A collator's
`set_epoch(epoch)` is called each epoch. The step's numbers stay on the device until the
processes agree on them at log, evaluation and save steps: step_numbers.py.

Evaluation (each evaluation set's loss and metrics, `predict(dataset)` for the logits alone):
evaluator.py. The signal handlers and the matmul peak of MFU: runtime.py.

Precision: `fp16` or `bf16` true or false decides; left unset, the launch config's
`mixed_precision` (`accelerate launch --config_file ...`) does, and without one training runs in
fp32. In fp16 a step whose scaled gradients overflow is skipped (not counted as a step) and
logged; the loss scale goes to the log and into every checkpoint (runtime.py).

Memory: `gradient_checkpointing` recomputes the model's layers in the backward pass;
`auto_find_batch_size` halves the batch and doubles the accumulation where a step runs out of
memory (batches.BatchFitter), and the batch found is kept in the trainer state for resume.

Distributed: the same code runs on N processes under `torchrun` or `accelerate launch`; the
batch size is per process and every process reports the loss averaged over all of them.

Label smoothing reaches the loss as the forward's `label_smoothing` argument (egbert's models
take it): --label-smoothing in training, 0 in evaluation; the model's config is never changed.
The best and the final model are saved by model_saving.py.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import math
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

import torch
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, Dataset, IterableDataset
from tqdm.auto import tqdm
from transformers import EvalPrediction

from egbert import report
from egbert.config import TrainingArguments
from egbert.errors import ConfigError, DataError, TrainingError
from egbert.training import optimization
from egbert.training.batches import (
    BatchFitter,
    Batching,
    TrainingData,
    epoch_batches,
    epochs_done,
    fitted_message,
    padded_length,
    prepare_training,
    real_tokens,
    training_batches,
)
from egbert.training.checkpoints import (
    Checkpointer,
    ResumeOptions,
    TrainerState,
    config_hash,
    whole_run_config,
    write_failure,
)
from egbert.training.evaluator import EvalMetrics, Evaluator
from egbert.training.model_saving import (
    BestModel,
    SavedWithModel,
    run_model_card,
    save_final_model,
    save_model_folder,
    tokenizer_writer,
)
from egbert.training.optimization import OptimizerOptions, RunLength, Schedule
from egbert.training.runtime import (
    AcceleratorOptions,
    keep_freed_memory_in_process,
    loss_scale,
    make_accelerator,
    setup_lines,
    start_trackers,
    step_unless_overflowed,
    stop_on_signals,
)
from egbert.training.step_numbers import (
    EvaluationMarks,
    Place,
    ReplayedClock,
    StepLedger,
    StepNumbers,
    TrainingClock,
    agrees_each_step,
    default_flops_per_token,
    eval_record,
    loss_parts,
    nonfinite_error,
    precision_record,
    read_clock,
    skip_nonfinite_step,
    skip_overflow_step,
    training_clock,
    write_clock,
)

# torch._dynamo settings of --compile: bert's sparse MLM head selects the masked positions
# (a size known only from the data) and elmo runs nn.LSTM, both graph breaks without these.
COMPILE_SETTINGS = {"capture_dynamic_output_shape_ops": True, "allow_rnn": True}

Options = TypeVar("Options")


@dataclass
class TrainOutput:
    """What `Trainer.train` returns: what a caller needs without reading the run's files."""

    step: int
    epoch: int
    tokens: int  # real (unpadded) tokens trained on, over all processes
    elapsed_seconds: float  # training wall time, evaluation and saving excluded
    metrics: dict[str, float]  # the last evaluation (of the best model when one is kept)
    history: list[dict[str, Any]]  # every train and eval record of metrics.jsonl, in order
    best_step: int | None
    interrupted: bool  # stopped by a signal: a checkpoint is saved but no final model
    model_dir: Path | None  # the saved model (None when interrupted)
    compile_seconds: float = 0.0  # --compile: the first step's time, left out of the above
    # FLOP/s the log's MFU divides by (the matmul peak, all processes; None: no MFU logged)
    matmul_peak_flops: float | None = None


def accumulate_gradients(
    model: torch.nn.Module,
    accelerator: Any,
    group: list[dict[str, Any]],
    loss_arguments: dict[str, float],
    flops_per_token: Callable[[int], float] | None,
) -> StepNumbers:
    """Forward and backward over the batches of one optimizer step, their gradients summed
    (the processes synchronize them at the last batch only); the step's numbers, left on the
    device: nothing here waits for it."""
    batch_losses, tokens, flops = [], 0, 0
    for index, batch in enumerate(group):
        last = index == len(group) - 1
        with nullcontext() if last else accelerator.no_sync(model):
            outputs = model(**batch, **loss_arguments)
            if outputs.loss is None:
                raise TrainingError("the model returned no loss; the batches need labels")
            accelerator.backward(outputs.loss / len(group))
        batch_losses.append(loss_parts(outputs))
        count = real_tokens(batch)
        tokens = tokens + count
        if flops_per_token is not None:
            flops = flops + count * flops_per_token(padded_length(batch))
    means = {
        name: torch.stack([losses[name] for losses in batch_losses]).mean()
        for name in batch_losses[0]
    }
    return StepNumbers(tokens, flops, means, accelerator.device)


def train_output(
    state: TrainerState,
    metrics: dict[str, float],
    model_dir: Path | None,
    history: list[dict[str, Any]],
    clock: TrainingClock | ReplayedClock,
    ledger: StepLedger,
) -> TrainOutput:
    """What `train` returns of a run at `state`: `model_dir` None when interrupted."""
    return TrainOutput(
        step=state.step,
        epoch=state.epoch,
        tokens=state.tokens_seen,
        elapsed_seconds=state.elapsed_seconds,
        metrics=metrics,
        history=history,
        best_step=state.best_step,
        interrupted=model_dir is None,
        model_dir=model_dir,
        compile_seconds=clock.compile_seconds,
        matmul_peak_flops=ledger.matmul_peak_flops,
    )


def compile_settings(compiling: bool) -> AbstractContextManager:
    """With --compile, COMPILE_SETTINGS while the model runs (dynamo traces at each shape's
    first call), then the process's own again: a later run starts from those."""
    return torch._dynamo.config.patch(COMPILE_SETTINGS) if compiling else nullcontext()


def compile_in_place(model: torch.nn.Module, compile_mode: str) -> None:
    """--compile of a prepared model, in place, after DDP/FSDP wrapped it (what torch.compile
    supports for both): no OptimizedModule wrapper, so no `_orig_mod.` in any saved name, and
    unwrapping gives the model itself. (Accelerate's dynamo plugin wraps it, and its save_state
    saves the wrapper's names.)"""
    model.compile(mode=None if compile_mode == "default" else compile_mode)


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """--gradient-checkpointing: transformers' activation checkpointing (non-reentrant, which
    torch.compile, DDP and FSDP support) of the model's layers, or a ConfigError for a model
    without it."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ConfigError(
            f"--gradient-checkpointing: {type(model).__name__} does not support it; leave the "
            "option out for this model"
        )
    model.activation_checkpointing_enable()


def epochs_left(length: RunLength, epoch: int) -> bool:
    """Whether the run trains another epoch after `epoch` ones: --epochs' end, unless
    --max-steps (or a budget alone) ends it."""
    return length.epochs is None or length.max_steps is not None or epoch < length.epochs


def options_for(kind: type[Options], args: TrainingArguments) -> Options:
    """The options a helper reads, as the dataclass `kind`: the fields of `args` it names."""
    return kind(**{field.name: getattr(args, field.name) for field in fields(kind)})


def progress_bar(accelerator: Any, total: int | None, initial: int) -> tqdm:
    """The run's tqdm bar of optimizer steps, on the main process of each machine."""
    disable = not accelerator.is_local_main_process
    return tqdm(total=total, initial=initial, desc="training", disable=disable, dynamic_ncols=True)


def label_smoothing_arguments(
    model: torch.nn.Module, label_smoothing: float | None
) -> tuple[dict[str, float], dict[str, float]]:
    """The keyword arguments the training and the evaluation forwards add to each batch: a
    forward that takes `label_smoothing` (egbert's models; None there is the config's value)
    gets --label-smoothing when training, if set, and 0 when evaluating. Any other model gets
    none, and --label-smoothing for it is a ConfigError: it would be ignored. Decided once, at
    setup: the training step does not inspect signatures."""
    if "label_smoothing" not in inspect.signature(model.forward).parameters:
        if label_smoothing is not None:
            raise ConfigError(
                f"--label-smoothing: {type(model).__name__}'s forward takes no label_smoothing "
                "argument, so its loss cannot be smoothed; leave the option out for this model"
            )
        return {}, {}
    training = {} if label_smoothing is None else {"label_smoothing": label_smoothing}
    return training, {"label_smoothing": 0.0}


# ---------------------------------------------------------------- the trainer


class Trainer:
    """Trains any model whose forward returns an object with `.loss`.

    data: the training set and its collator, the evaluation sets and theirs (TrainingData);
        the evaluation sets are evaluated every `eval_every` steps and at the end.
    args: the trainer's options (TrainingArguments); its stages hand each helper the fields it
        reads.
    metrics: what evaluation reports beside each set's loss (EvalMetrics; see evaluator.py).
    saved_with_model: the run's config, the tokenizer and the card's metadata (SavedWithModel):
        what defines the run, saved with each checkpoint and compared on resume (a few options
        may change: egbert.training.checkpoints.MAY_CHANGE_ON_RESUME), and what goes beside
        the final model, the best one and every checkpoint.
    epoch_ends: also evaluate (when `eval_every` is 0) and checkpoint (when `save_every` is 0)
        where each epoch ends, however many steps it took (fine-tuning's epochs).
    flops_per_token: seq_len -> training FLOPs per real token, for the MFU of the log (default:
        `default_flops_per_token(model)`).

    `replayed_clock` holds --replay-clock's readings (the elapsed seconds after each step of that
    run), None when the wall clock times the steps.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        data: TrainingData,
        args: TrainingArguments,
        metrics: EvalMetrics | None = None,
        saved_with_model: SavedWithModel | None = None,
        epoch_ends: bool = False,
        flops_per_token: Callable[[int], float] | None = None,
    ) -> None:
        saved_with_model = saved_with_model or SavedWithModel()
        self.args, self.output_dir = args, Path(args.output_dir)
        self.data_collator, self.card = data.collator, saved_with_model.card
        # the tokenizer goes beside every saved model, checkpoints included: each one loads
        self._write_tokenizer = tokenizer_writer(saved_with_model.tokenizer)
        self.epoch_ends = epoch_ends
        self._setup_run(saved_with_model.run_config)
        self._setup_model(model, flops_per_token)
        optimizer = self._setup_optimizer(model)
        loader = self._setup_data(data.train)
        self._prepare_and_compile(model, optimizer, loader)
        self._setup_evaluation(data, metrics or EvalMetrics())
        self._setup_schedule(optimizer)

    # ------------------------------------------------------------ setup, in order

    def _setup_run(self, run_config: dict[str, Any]) -> None:
        """The processes (Accelerate) and whether they agree each step, the run's log and
        checkpoints, and its state."""
        args = self.args
        self.accelerator = make_accelerator(options_for(AcceleratorOptions, args), self.output_dir)
        self.log = report.RunLog(self.accelerator, self.output_dir)
        self.checkpoints = Checkpointer(
            self.accelerator, self.output_dir / "checkpoints", args.keep_checkpoints
        )
        keep_freed_memory_in_process(self.accelerator.device)
        processes = self.accelerator.num_processes
        config = self.run_config = whole_run_config(run_config, asdict(args), processes)
        self.state = TrainerState(run_config=config, config_hash=config_hash(config))
        self._stopping, self._signal_received = False, None
        self._last_eval, self._last_eval_step = {}, None  # its metrics, its step
        self._last_lr = args.lr
        self.replayed_clock = None if args.replay_clock is None else read_clock(args.replay_clock)
        timed = args.budget_minutes is not None or args.eval_every_minutes > 0
        self._agree_each_step = agrees_each_step(args.skip_nonfinite, timed, processes)

    def _setup_model(
        self, model: torch.nn.Module, flops_per_token: Callable[[int], float] | None
    ) -> None:
        """What the trainer reads of the model, once: the label smoothing its forward takes,
        its width (inverse_sqrt's d_model) and its FLOPs per token (the log's MFU); and
        --gradient-checkpointing."""
        smoothing = self.args.label_smoothing
        self.loss_arguments, self._eval_arguments = label_smoothing_arguments(model, smoothing)
        if self.args.gradient_checkpointing:
            enable_gradient_checkpointing(model)
        self.d_model = getattr(getattr(model, "config", None), "hidden_size", None)
        if self.args.schedule == "inverse_sqrt" and not self.d_model:
            raise ConfigError("--schedule inverse_sqrt needs model.config.hidden_size")
        count = flops_per_token or default_flops_per_token(model)
        self.flops_per_token = None if count is None else functools.cache(count)

    def _setup_optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        """AdamW (or Muon beside it), before Accelerate's prepare wraps the two."""
        options = options_for(OptimizerOptions, self.args)
        return optimization.training_optimizer(model, self.accelerator, options)

    def _setup_data(self, train_dataset: Dataset | IterableDataset) -> DataLoader:
        """The training batches, for Accelerate's prepare (a stream is split between the
        processes here, its position kept, and not prepared again), and what
        --auto-find-batch-size refits them with."""
        args, accelerator = self.args, self.accelerator
        self.length, self.batching = options_for(RunLength, args), options_for(Batching, args)
        streaming = isinstance(train_dataset, IterableDataset)
        optimization.check_run_length(self.length, args.batch_ramp_to, streaming)
        loader, self.stream = training_batches(
            accelerator, train_dataset, self.batching, self.data_collator, self.log.message
        )
        self.batch_fitter = BatchFitter(
            accelerator, train_dataset, self.data_collator, args.auto_find_batch_size
        )
        return loader

    def _prepare_and_compile(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: DataLoader
    ) -> None:
        """Accelerate's prepare of the model, the optimizer and the training batches, in one
        call (DeepSpeed reads the batch size off the loader): the model on the device and
        wrapped for the processes (DDP, FSDP); then --compile of the wrapped model."""
        self.model, self.optimizer, self.train_loader = prepare_training(
            self.accelerator, model, optimizer, loader, self.stream
        )
        self._unwrapped = self.accelerator.unwrap_model(self.model)
        if self.args.compile:
            compile_in_place(self.model, self.args.compile_mode)

    def _setup_evaluation(self, data: TrainingData, metrics: EvalMetrics) -> None:
        """The evaluation sets' batches and metrics, and the best model by
        --metric-for-best-model."""
        self.evaluator = Evaluator(
            self.model, self.accelerator, self.batching, data, metrics, self._eval_arguments
        )
        self.eval_sets = self.evaluator.eval_sets
        save = functools.partial(save_model_folder, self.accelerator, self.model)
        metric, greater = self.args.metric_for_best_model, self.args.greater_is_better
        folder = self.output_dir / "best"
        self.best = BestModel(metric, greater, folder, save, self._write_tokenizer)

    def _setup_schedule(self, optimizer: torch.optim.Optimizer) -> None:
        """The learning-rate schedule, whose length needs the per-process number of batches,
        known after prepare (a stream has none: train_loader asked for --max-steps or a
        budget)."""
        args, batches = self.args, len(self.train_loader) if self.stream is None else 0
        total = optimization.total_steps(self.length, math.ceil(batches / self.batching.grad_accum))
        ratio, budget, decay = args.warmup_is_ratio, args.budget_minutes, args.wsd_decay
        warmup = optimization.warmup_length(args.warmup_steps, ratio, budget, total)
        self.schedule = Schedule(args.schedule, total, warmup, ratio, budget, self.d_model, decay)
        self.total_steps = total
        self.scheduler = self.accelerator.prepare(
            torch.optim.lr_scheduler.LambdaLR(optimizer, self._lr_multiplier)
        )

    def _lr_multiplier(self, step: int) -> float:
        return optimization.lr_multiplier(self.schedule, step, self.state.elapsed_seconds)

    # ------------------------------------------------------------ training

    def train(self) -> TrainOutput:
        """Train (resuming if asked), then save the final model with its tokenizer and card."""
        try:
            with (
                compile_settings(self.args.compile),
                stop_on_signals(lambda signum: setattr(self, "_signal_received", signum)),
            ):
                return self._train_and_save()
        except OSError as error:  # a log, plot or the final model could not be written
            failure = write_failure(error, self.output_dir, self.checkpoints.latest())
            if failure is None:
                raise
            raise failure from None
        finally:
            self.accelerator.end_training()  # closes the trackers

    def _train_and_save(self) -> TrainOutput:
        self._start_or_resume()
        for line in setup_lines(self.accelerator, self.batching):
            self.log.message(line)
        progress = progress_bar(self.accelerator, self.total_steps, self.state.step)
        self._train_loop(progress)
        progress.close()
        self._agree_on_pending_steps()
        self.save_checkpoint()
        if self._stopping:
            self.log.message(
                f"egbert: stopped at step {self.state.step}; checkpoint saved in "
                f"{self.checkpoints.folder} (run again with --resume to continue)"
            )
            return self._output(self._last_eval, model_dir=None)
        return self._cleanup()

    def _cleanup(self) -> TrainOutput:
        """After the last step: the final metrics (of the best model, when one is kept), the
        final model, the results and the loss curve."""
        metrics = self._final_metrics()
        output = self._output(metrics, model_dir=self._save_final_model(metrics))
        self.log.results({k: v for k, v in asdict(output).items() if k != "history"})
        if self.accelerator.is_main_process:
            write_clock(self.output_dir, self.state)
            report.plot_loss_curve(output.history, self.output_dir / report.LOSS_CURVE)
        self.accelerator.wait_for_everyone()
        return output

    def _output(self, metrics: dict[str, float], model_dir: Path | None) -> TrainOutput:
        history = self.log.records()
        return train_output(self.state, metrics, model_dir, history, self.clock, self.ledger)

    def _train_loop(self, progress: tqdm) -> None:
        flops = self.flops_per_token is not None
        self.ledger = StepLedger(self.accelerator, self.state.elapsed_seconds, flops)
        compiling, replay_clock = self.args.compile, self.args.replay_clock
        self.clock = training_clock(compiling, replay_clock, self.replayed_clock, self.state)
        self.eval_marks = EvaluationMarks(self.args, self.state.elapsed_seconds)
        while not self._finished() and epochs_left(self.length, self.state.epoch):
            if not self._train_epoch(progress):
                break

    def _finished(self) -> bool:
        state, budget = self.state, self.length.budget_minutes
        if self._stopping:
            return True
        if budget is not None and state.elapsed_seconds >= budget * 60:
            return True
        return self.total_steps is not None and state.step >= self.total_steps

    def _train_epoch(self, progress: tqdm) -> bool:
        """Train until the epoch ends (True) or the run has to stop (False)."""
        loader, state = self.train_loader, self.state
        started_at = state.batches_in_epoch
        batches = epoch_batches(loader, self.data_collator, state.epoch, started_at, self.stream)
        while True:
            state = self.state
            budget, elapsed = self.length.budget_minutes, state.elapsed_seconds
            count = optimization.batches_per_step(
                self.batching, budget, state.step, elapsed, self.total_steps
            )
            group = list(itertools.islice(batches, count))
            if not group:
                break
            if self.stream is not None:
                self.stream.consumed(len(group))
            try:
                updated = self._optimizer_step(group)
            except RuntimeError as error:  # --auto-find-batch-size: out of memory
                size = self.batch_fitter.halved(error, self.batching.batch_size)
                self._use_batch_size(size, after=error)
                skip = self.state.batches_in_epoch
                batches = epoch_batches(
                    self.train_loader, self.data_collator, state.epoch, skip, None
                )
                continue
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
        self._at_epoch_end()
        return True

    def _at_epoch_end(self) -> None:
        if not self.epoch_ends:
            return
        with self.clock.paused():
            self._agree_on_pending_steps()  # nothing a non-finite loss reached is evaluated/saved
            if not self.args.eval_every and self.eval_sets:
                self._evaluate_and_track()
            if not self.args.save_every:
                self.save_checkpoint()

    def _use_batch_size(self, size: int, after: RuntimeError | None = None) -> None:
        """Train on in batches of `size` (BatchFitter): `after` an out-of-memory from the first
        example of the step that ran out, else as the resumed run found them."""
        if after is not None:
            self.optimizer.zero_grad(set_to_none=True)
            self.state.batches_in_epoch *= self.batching.batch_size // size
        self.batching, self.train_loader = self.batch_fitter.fit(self.batching, size)
        self.state.batch_size_found = size
        self.log.message(fitted_message(self.batching, self.state.step, found_before=after is None))

    def _optimizer_step(self, group: list[dict[str, Any]]) -> bool:
        """Forward and backward over `group` (accumulated), then one update unless, agreeing
        each step, the loss is not finite on some process (then False). Nothing here reads the
        device: the step's numbers stay on it until the processes agree (`_agree`)."""
        self.model.train()
        step = accumulate_gradients(
            self.model, self.accelerator, group, self.loss_arguments, self.flops_per_token
        )
        if self.clock.compiling:  # its time goes to compile_seconds: not a timed step
            step.timed = torch.zeros_like(step.timed)
        device, state = self.accelerator.device, self.state
        state.elapsed_seconds = self.clock.advance(state.elapsed_seconds, device, self.log.message)
        self.ledger.add(step, (state.step + 1, state.epoch, state.batches_in_epoch + 1))
        first_nonfinite = self._agree() if self._agree_each_step else None
        state.clock_readings.append(state.elapsed_seconds)  # agreed: the one every process has
        if first_nonfinite is not None:
            self.optimizer.zero_grad(set_to_none=True)
            self.log.message(skip_nonfinite_step(state, first_nonfinite, self.args.skip_nonfinite))
            return False
        if self.args.max_grad_norm > 0:
            self.accelerator.clip_grad_norm_(self.model.parameters(), self.args.max_grad_norm)
        self._last_lr = self.optimizer.param_groups[0]["lr"]
        applied = step_unless_overflowed(self.optimizer, self.accelerator)
        self.optimizer.zero_grad(set_to_none=True)
        if not applied:
            self.log.message(skip_overflow_step(state, loss_scale(self.accelerator)))
            return False
        state.step += 1
        self.scheduler.step()  # the multiplier reads state.step / elapsed_seconds, both updated
        return True

    def _agree_on_pending_steps(self) -> None:
        """The processes agree on the steps since the last agreement: their losses and tokens
        go to the log window; a non-finite loss among them stops the run (TrainingError) before
        anything is saved or evaluated."""
        if not self.ledger.pending.steps:
            return
        first_nonfinite = self._agree()
        if first_nonfinite is not None:
            raise nonfinite_error(*first_nonfinite)

    def _agree(self) -> tuple[float, Place] | None:
        """The processes agree on the pending steps (StepLedger.agree); (its loss, its place)
        of the first step whose loss was not finite, if one was not."""
        agreed = self.ledger.agree(self.state, stop=self._signal_received is not None)
        self._stopping = self._stopping or agreed.stop
        return agreed.first_nonfinite

    def _after_step(self, progress: tqdm) -> None:
        state, args = self.state, self.args
        logging = state.step % args.log_every == 0 or self._finished()
        signal_here = self._signal_received is not None and self.accelerator.num_processes == 1
        evaluating = bool(self.eval_sets) and self.eval_marks.due(state.step, state.elapsed_seconds)
        saving = bool(args.save_every) and state.step % args.save_every == 0
        if logging or evaluating or saving or signal_here:
            self._agree_on_pending_steps()
        # The clock runs on from the backward pass, so the update just made (and the wait for the
        # device in agreeing) counts at the next step; logging (and the matmul peak measured for
        # the first record), evaluation and saving do not count as training time.
        with self.clock.paused():
            if self.ledger.window.steps and (logging or self._finished()):
                self._log_training(progress)
            if evaluating:
                self._evaluate_and_track()
            if saving and not self._finished():
                self.save_checkpoint()

    def _log_training(self, progress: tqdm) -> None:
        record = self.ledger.record(self.state, self._last_lr)
        record |= precision_record(self.state, loss_scale(self.accelerator))
        progress.set_postfix(report.progress_postfix(record))
        self.log.record("train", record)

    # ------------------------------------------------------------ evaluation and prediction

    def evaluate(self) -> dict[str, float]:
        """Each evaluation set's mean loss and metrics, over all processes; label smoothing off."""
        with compile_settings(self.args.compile):
            return self.evaluator.evaluate()

    def predict(self, dataset: Dataset) -> EvalPrediction:
        """The model's logits for every example of `dataset` (in order, over all processes),
        with the labels where the dataset has them."""
        with compile_settings(self.args.compile):
            return self.evaluator.predict(dataset)

    def _evaluate_and_track(self) -> dict[str, float]:
        metrics = self.evaluate()
        self._last_eval, self._last_eval_step = metrics, self.state.step
        epoch = epochs_done(self.state.epoch, self.state.batches_in_epoch, self.train_loader)
        self.log.record("eval", eval_record(self.state, epoch, metrics))
        summary = ", ".join(f"{name} {value:.4g}" for name, value in metrics.items())
        self.log.message(f"eval at step {self.state.step}: {summary}")
        self.best.track(metrics, self.state)
        return metrics

    def _final_metrics(self) -> dict[str, float]:
        if not self.eval_sets:
            return {}
        if self._last_eval_step != self.state.step:
            self._evaluate_and_track()
        if not self.best.kept(self.state):
            return dict(self._last_eval)
        self.best.load_into(self._unwrapped, self.accelerator.device)
        self.log.message(self.best.using_message(self.state))
        return dict(self.state.best_metrics)

    # ------------------------------------------------------------ checkpoints and resume

    def save_checkpoint(self) -> Path:
        """checkpoints/step-N, atomically (checkpoints.Checkpointer), with each process's
        position in its part of the stream (map-style data's is the sampler's and the batch
        count, in the trainer state)."""
        stream, process = self.stream, self.accelerator.process_index
        save_position = None if stream is None else lambda folder: stream.save(folder, process)
        return self.checkpoints.save(
            self.state.step, asdict(self.state), save_position, self._write_tokenizer
        )

    def _start_or_resume(self) -> None:
        """Start anew, seeded, or go on from the checkpoint --resume finds, as it left off."""
        args = self.args
        resuming = options_for(ResumeOptions, args)
        checkpoint = self.checkpoints.start(resuming, self.log.message)  # refuses to overwrite one
        start_trackers(self.accelerator, args.report_to, report.tracker_config(self.run_config))
        if checkpoint is None:
            set_seed(args.seed)
        else:
            anyway, say = args.resume_anyway, self.log.message
            self.state = self.checkpoints.resume(
                checkpoint, self._unwrapped, self.state, anyway, self.stream, say
            )
            found = self.state.batch_size_found
            if found is not None and found != self.batching.batch_size:
                self._use_batch_size(found)
        self.log.truncate(after_step=self.state.step)

    # ------------------------------------------------------------ the saved model

    def _save_final_model(self, metrics: dict[str, float]) -> Path:
        name, accelerator = self.output_dir.name, self.accelerator
        card = run_model_card(self.card, self._unwrapped, name, metrics, self.state, accelerator)
        return save_final_model(
            accelerator, self.model, self.output_dir, card, self._write_tokenizer
        )
