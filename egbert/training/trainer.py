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

Precision: `bf16` true or false decides; left unset, the launch config's `mixed_precision`
(`accelerate launch --config_file ...`) does, and without one training runs in fp32.

Distributed: the same code runs on N processes under `torchrun` or `accelerate launch`; the
batch size is per process and every process reports the loss averaged over all of them.
"""

from __future__ import annotations

import errno
import functools
import itertools
import math
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import datasets
import torch
from accelerate.utils import set_seed
from safetensors.torch import load_model
from torch.utils.data import Dataset, IterableDataset
from tqdm.auto import tqdm
from transformers import EvalPrediction

from egbert import report
from egbert.config import TrainingArguments
from egbert.errors import CheckpointError, ConfigError, DataError, TrainingError
from egbert.model_files import RUN_MODEL_DIR
from egbert.training import optimization
from egbert.training.batches import (
    StreamPosition,
    real_tokens,
    sequence_length,
    stream_loader,
    train_loader,
)
from egbert.training.checkpoints import (
    OPTIONS,
    Checkpointer,
    TrainerState,
    config_hash,
    own_storage,
    save_model_folder,
    write_error_reason,
)
from egbert.training.evaluator import BatchMetrics, Evaluator, label_smoothing
from egbert.training.runtime import (
    keep_freed_memory_in_process,
    make_accelerator,
    run_matmul_peak_flops,
    slow_bf16_warning,
    stop_on_signals,
    synchronize,
)
from egbert.training.step_numbers import (
    PendingSteps,
    Place,
    StepNumbers,
    default_flops_per_token,
    loss_parts,
    nonfinite_place,
)

# Errors of writing files: a full disk or quota, a read-only or forbidden output directory.
WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM)

# torch._dynamo settings of --compile: bert's sparse MLM head selects the masked positions
# (a size known only from the data) and elmo runs nn.LSTM, both graph breaks without these.
COMPILE_SETTINGS = {"capture_dynamic_output_shape_ops": True, "allow_rnn": True}


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


# ---------------------------------------------------------------- the trainer


class Trainer:
    """Trains any model whose forward returns an object with `.loss`.

    train_dataset: map-style dataset (shuffled each epoch) or an IterableDataset (streaming).
    data_collator: list of examples -> dict of tensors, the keyword arguments of model(...).
    eval_dataset: one evaluation set, or {name: set} (each one's metrics prefixed `name_`),
        evaluated every `eval_every` steps and at the end with `eval_collator` (default: the
        data collator); batch_metrics, compute_metrics, finalize_metrics: see the module doc.
    run_config: what defines the run: {"options": the job's options (its dataclass fields),
        ...: what else identifies the model, tokenizer and data}; the trainer adds its own
        options; saved with each checkpoint and compared on resume (a few options may change:
        egbert.training.checkpoints.MAY_CHANGE_ON_RESUME).
    tokenizer: saved with the final model, the best one and every checkpoint.
    card: what the model card's Hub metadata says.
    epoch_ends: also evaluate (when `eval_every` is 0) and checkpoint (when `save_every` is 0)
        where each epoch ends, however many steps it took (fine-tuning's epochs).
    flops_per_token: seq_len -> training FLOPs per real token, for the MFU of the log (default:
        `default_flops_per_token(model)`).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        args: TrainingArguments,
        train_dataset: Dataset | IterableDataset,
        data_collator: Callable[[list[Any]], dict[str, Any]],
        eval_dataset: Dataset | dict[str, Dataset] | None = None,
        eval_collator: Callable[[list[Any]], dict[str, Any]] | None = None,
        batch_metrics: BatchMetrics | None = None,
        compute_metrics: Callable[[EvalPrediction], dict[str, float]] | None = None,
        finalize_metrics: Callable[[dict[str, float]], dict[str, float]] | None = None,
        run_config: dict[str, Any] | None = None,
        tokenizer: Any = None,
        card: report.ModelCardInfo | None = None,
        epoch_ends: bool = False,
        flops_per_token: Callable[[int], float] | None = None,
    ) -> None:
        self.args = args
        self.output_dir = Path(args.output_dir)
        self.data_collator = data_collator
        self.tokenizer, self.card = tokenizer, card
        self.epoch_ends = epoch_ends
        self.accelerator = make_accelerator(args, self.output_dir)
        self.log = report.RunLog(self.accelerator, self.output_dir)
        self.checkpoints = Checkpointer(
            self.accelerator, self.output_dir / "checkpoints", args.keep_checkpoints
        )
        keep_freed_memory_in_process(self.accelerator.device)
        run_config = run_config or {}
        self.run_config = {
            **run_config,
            # every option, the job's and the trainer's (a resume may change only a few)
            OPTIONS: {**run_config.get(OPTIONS, {}), **asdict(args)},
            # the data each process sees depends on it
            "num_processes": self.accelerator.num_processes,
        }
        self.state = TrainerState(
            run_config=self.run_config, config_hash=config_hash(self.run_config)
        )
        # Label smoothing is a training option: evaluation runs without it and the saved
        # config keeps the model's own value, so it does not leak into later fine-tuning.
        config = getattr(model, "config", None)
        self._model_label_smoothing = getattr(config, "label_smoothing", None)
        if args.label_smoothing is not None and config is not None:
            config.label_smoothing = args.label_smoothing
        self.d_model = getattr(config, "hidden_size", None)
        if args.schedule == "inverse_sqrt" and not self.d_model:
            raise ConfigError("--schedule inverse_sqrt needs model.config.hidden_size")
        optimizer = optimization.adamw(
            optimization.parameter_groups(model, args.weight_decay),
            self.accelerator.device,
            lr=args.lr,
            betas=(args.adam_beta1, args.adam_beta2),
            eps=args.adam_epsilon,
        )
        count = flops_per_token or default_flops_per_token(model)
        self.flops_per_token = None if count is None else functools.cache(count)
        self.stream: StreamPosition | None = None
        if isinstance(train_dataset, datasets.IterableDataset):
            self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
            self.train_loader, self.stream = stream_loader(
                train_dataset, args, data_collator, self.accelerator, self.log.message
            )
        else:
            loader = train_loader(train_dataset, args, data_collator, self.accelerator.device)
            self.model, self.optimizer, self.train_loader = self.accelerator.prepare(
                model, optimizer, loader
            )
        if args.compile:
            # In place, after DDP/FSDP wrapped it (what torch.compile supports for both): no
            # OptimizedModule wrapper, so no `_orig_mod.` in any saved name, and unwrapping gives
            # the model itself. Accelerate's dynamo plugin wraps it, and its save_state saves
            # the wrapper's names.
            self.model.compile(mode=None if args.compile_mode == "default" else args.compile_mode)
        if eval_dataset is not None and not isinstance(eval_dataset, dict):
            eval_dataset = {"": eval_dataset}
        self.eval_sets = eval_dataset or {}
        self.evaluator = Evaluator(
            self.model,
            self.accelerator,
            args,
            eval_collator or data_collator,
            self.eval_sets,
            batch_metrics,
            compute_metrics,
            finalize_metrics,
        )
        self._unwrapped = self.evaluator.unwrapped
        # The schedule's length needs the per-process number of batches, known after prepare
        # (a stream has none: train_loader asked for --max-steps or a budget).
        steps_per_epoch = 0 if self.stream else math.ceil(len(self.train_loader) / args.grad_accum)
        self.total_steps = optimization.total_steps(args, steps_per_epoch)
        self.warmup = optimization.warmup_length(args, self.total_steps)
        self.scheduler = self.accelerator.prepare(
            torch.optim.lr_scheduler.LambdaLR(optimizer, self._lr_multiplier)
        )
        self._stopping, self._signal_received = False, None
        self._last_eval: dict[str, float] = {}
        self._last_eval_step: int | None = None
        self._last_lr = args.lr
        # Whether the processes agree every step (before the update) or at sync points only:
        # skipping non-finite steps must decide before the update, and a budget shared by
        # several processes must give them one elapsed time (one lr) every step.
        self._agree_each_step = args.skip_nonfinite > 0 or (
            args.budget_minutes is not None and self.accelerator.num_processes > 1
        )
        self.compile_seconds = 0.0
        self.matmul_peak_flops: float | None = None

    def _lr_multiplier(self, step: int) -> float:
        return optimization.lr_multiplier(
            self.args, step, self.state.elapsed_seconds, self.total_steps, self.warmup, self.d_model
        )

    # ------------------------------------------------------------ training

    def train(self) -> TrainOutput:
        """Train (resuming if asked), then save the final model with its tokenizer and card."""
        try:
            with (
                self._compile_settings(),
                stop_on_signals(lambda signum: setattr(self, "_signal_received", signum)),
            ):
                return self._train_and_save()
        except OSError as error:  # a log, plot or the final model could not be written
            if error.errno not in WRITE_ERRNOS:
                raise
            latest = self.checkpoints.latest()
            kept = f"the newest checkpoint {latest} is intact" if latest else "no checkpoint yet"
            raise CheckpointError(
                f"could not write {error.filename or self.output_dir}: "
                f"{write_error_reason(error)}; free disk space (or fix the permissions) and run "
                f"again with --resume ({kept})"
            ) from None
        finally:
            self.accelerator.end_training()  # closes the trackers

    def _train_and_save(self) -> TrainOutput:
        accelerator, args = self.accelerator, self.args
        self._start_or_resume()
        self.log.message(
            f"egbert: training on {accelerator.num_processes} process(es) "
            f"({accelerator.distributed_type.value}, {accelerator.device}, mixed precision "
            f"{accelerator.mixed_precision}); batch {args.batch_size} x "
            f"{optimization.accumulation_text(args)} x {accelerator.num_processes} processes"
        )
        warning = accelerator.mixed_precision == "bf16" and slow_bf16_warning(
            accelerator.device.type
        )
        if warning:
            self.log.message(warning)
        progress = tqdm(
            total=self.total_steps,
            initial=self.state.step,
            desc="training",
            disable=not accelerator.is_local_main_process,
            dynamic_ncols=True,
        )
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
        metrics = self._final_metrics()
        output = self._output(metrics, model_dir=self._save_final_model(metrics))
        self.log.results({k: v for k, v in asdict(output).items() if k != "history"})
        if accelerator.is_main_process:
            report.plot_loss_curve(output.history, self.output_dir / report.LOSS_CURVE)
        accelerator.wait_for_everyone()
        return output

    def _output(self, metrics: dict[str, float], model_dir: Path | None) -> TrainOutput:
        state = self.state
        return TrainOutput(
            step=state.step,
            epoch=state.epoch,
            tokens=state.tokens_seen,
            elapsed_seconds=state.elapsed_seconds,
            metrics=metrics,
            history=self.log.records(),
            best_step=state.best_step,
            interrupted=model_dir is None,
            model_dir=model_dir,
            compile_seconds=self.compile_seconds,
            matmul_peak_flops=self.matmul_peak_flops,
        )

    def _train_loop(self, progress: tqdm) -> None:
        self._window = report.LossWindow(self.state.elapsed_seconds)
        self._pending = PendingSteps()
        self._compile_step_pending = self.args.compile
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
        for component in (self.train_loader, self.data_collator):
            if hasattr(component, "set_epoch"):
                component.set_epoch(epoch)
        loader = self.train_loader
        if self.stream is not None:  # resumed from its saved state, nothing to skip
            self.stream.restart()
        elif skip:
            loader = self.accelerator.skip_first_batches(self.train_loader, skip)
        return iter(loader)

    def _train_epoch(self, progress: tqdm) -> bool:
        """Train until the epoch ends (True) or the run has to stop (False)."""
        batches = self._epoch_batches()
        started_at = self.state.batches_in_epoch
        while True:
            state = self.state
            count = optimization.batches_per_step(
                self.args, state.step, state.elapsed_seconds, self.total_steps
            )
            group = list(itertools.islice(batches, count))
            if not group:
                break
            if self.stream is not None:
                self.stream.consumed(len(group))
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
        self._at_epoch_end()
        return True

    def _at_epoch_end(self) -> None:
        if not self.epoch_ends:
            return
        paused_at = time.perf_counter()
        self._agree_on_pending_steps()  # nothing a non-finite loss reached is evaluated or saved
        if not self.args.eval_every and self.eval_sets:
            self._evaluate_and_track()
        if not self.args.save_every:
            self.save_checkpoint()
        self._clock += time.perf_counter() - paused_at

    def _optimizer_step(self, group: list[dict[str, Any]]) -> bool:
        """Forward and backward over `group` (accumulated), then one update unless, agreeing
        each step, the loss is not finite on some process (then False). Nothing here reads the
        device: the step's numbers stay on it until the processes agree (`_agree`)."""
        self.model.train()
        batch_losses, tokens, flops = [], 0, 0
        for index, batch in enumerate(group):
            last = index == len(group) - 1
            with nullcontext() if last else self.accelerator.no_sync(self.model):
                outputs = self.model(**batch)
                if outputs.loss is None:
                    raise TrainingError("the model returned no loss; the batches need labels")
                self.accelerator.backward(outputs.loss / len(group))
            batch_losses.append(loss_parts(outputs))
            count = real_tokens(batch)
            tokens = tokens + count
            if self.flops_per_token is not None:
                flops = flops + count * self.flops_per_token(sequence_length(batch))
        means = {
            name: torch.stack([losses[name] for losses in batch_losses]).mean()
            for name in batch_losses[0]
        }
        self._advance_clock()
        step = StepNumbers(tokens, flops, means, self.accelerator.device)
        if self._compile_step_pending:  # its time went to compile_seconds: not a timed step
            step.timed = torch.zeros_like(step.timed)
            self._compile_step_pending = False
        place = (self.state.step + 1, self.state.epoch, self.state.batches_in_epoch + 1)
        self._pending.add(step, place)
        if self._agree_each_step:
            first_nonfinite = self._agree()
            if first_nonfinite is not None:
                self._skip_nonfinite_step(first_nonfinite)
                return False
        if self.args.max_grad_norm > 0:
            self.accelerator.clip_grad_norm_(self.model.parameters(), self.args.max_grad_norm)
        self._last_lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.state.step += 1
        self.scheduler.step()  # the multiplier reads state.step / elapsed_seconds, both updated
        return True

    def _advance_clock(self) -> None:
        """Add the time since the last read to the training time; with --compile, the first
        step's (compiling, then running, once the device is done) to compile_seconds instead."""
        if self._compile_step_pending:
            synchronize(self.accelerator.device)
        now = time.perf_counter()
        if self._compile_step_pending:
            self.compile_seconds += now - self._clock
            self.log.message(
                f"egbert: compiled the model in {now - self._clock:.1f} s (the first step; left "
                "out of the training time, tokens/s and MFU)"
            )
        else:
            self.state.elapsed_seconds += now - self._clock
        self._clock = now

    def _agree_on_pending_steps(self) -> None:
        """The processes agree on the steps since the last agreement: their losses and tokens
        go to the log window; a non-finite loss among them stops the run (TrainingError) before
        anything is saved or evaluated."""
        if not self._pending.steps:
            return
        first_nonfinite = self._agree()
        if first_nonfinite is not None:
            self._raise_nonfinite(*first_nonfinite)

    def _agree(self) -> tuple[float, Place] | None:
        """The processes agree on the pending steps (`PendingSteps.agree`): the losses and token
        counts go to the log window, unless a loss was not finite: then (its window's loss, its
        place) of the first such step is returned and nothing is added."""
        signal_here = self._signal_received is not None
        agreed = self._pending.agree(self.accelerator, signal_here, self.state.elapsed_seconds)
        self._pending = PendingSteps()
        self.state.elapsed_seconds = agreed.elapsed_seconds
        self._stopping = self._stopping or agreed.stop
        if agreed.first_nonfinite is not None:
            return agreed.first_nonfinite
        self.state.tokens_seen += int(agreed.tokens)
        self._window.add(agreed.losses, agreed.steps, agreed.timed_tokens, agreed.flops)
        return None

    def _skip_nonfinite_step(self, found: tuple[float, Place]) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        state = self.state
        state.skipped_nonfinite += 1
        if state.skipped_nonfinite > self.args.skip_nonfinite:
            self._raise_nonfinite(*found)
        loss, place = found
        self.log.message(
            f"egbert: skipped a step with loss {loss} {nonfinite_place(place)} "
            f"({state.skipped_nonfinite} of {self.args.skip_nonfinite} allowed)"
        )

    def _raise_nonfinite(self, loss: float, place: Place) -> None:
        raise TrainingError(
            f"the loss is {loss} {nonfinite_place(place)}; lower --lr, check the data, or pass "
            f"--skip-nonfinite N to skip up to N such steps"
        )

    def _after_step(self, progress: tqdm) -> None:
        state, args = self.state, self.args
        logging = state.step % args.log_every == 0 or self._finished()
        if logging or self._evaluating_or_saving() or self._signal_seen_here():
            self._agree_on_pending_steps()
        # The clock runs on from the backward pass, so the update just made (and the wait for the
        # device in agreeing) counts at the next step; logging (and the matmul peak measured for
        # the first record), evaluation and saving do not count as training time.
        paused_at = time.perf_counter()
        if self._window.steps and (logging or self._finished()):
            self._log_training(progress)
        if args.eval_every and state.step % args.eval_every == 0 and self.eval_sets:
            self._evaluate_and_track()
        if args.save_every and state.step % args.save_every == 0 and not self._finished():
            self.save_checkpoint()
        self._clock += time.perf_counter() - paused_at

    def _evaluating_or_saving(self) -> bool:
        """This step evaluates or checkpoints: the processes agree first, so that neither sees
        weights a non-finite loss has reached."""
        step, args = self.state.step, self.args
        return any(every and step % every == 0 for every in (args.eval_every, args.save_every))

    def _signal_seen_here(self) -> bool:
        """A signal reached this process, which alone trains: stop after this step. Several
        processes learn of it at their next agreement (a collective needs them all)."""
        return self._signal_received is not None and self.accelerator.num_processes == 1

    def _log_training(self, progress: tqdm) -> None:
        state = self.state
        record = self._window.record(
            state.step, state.epoch, self._last_lr, state.elapsed_seconds, self._matmul_peak()
        )
        progress.set_postfix(
            loss=f"{record['loss']:.4f}",
            lr=f"{record['lr']:.2e}",
            tok_s=f"{record['tokens_per_s']:.0f}",
            **({"mfu": f"{record['mfu']:.3f}"} if "mfu" in record else {}),
        )
        self.log.record("train", record)
        self._window = report.LossWindow(state.elapsed_seconds)

    def _matmul_peak(self) -> float | None:
        """MFU's denominator (kept for the run's results); None without a FLOP count."""
        if self.flops_per_token is not None:
            self.matmul_peak_flops = run_matmul_peak_flops(self.accelerator)
        return self.matmul_peak_flops

    # ------------------------------------------------------------ evaluation and prediction

    def evaluate(self) -> dict[str, float]:
        """Each evaluation set's mean loss and metrics, over all processes; label smoothing off."""
        with self._compile_settings():
            return self.evaluator.evaluate()

    def predict(self, dataset: Dataset) -> EvalPrediction:
        """The model's logits for every example of `dataset` (in order, over all processes),
        with the labels where the dataset has them."""
        with self._compile_settings():
            return self.evaluator.predict(dataset)

    def _compile_settings(self) -> AbstractContextManager:
        """With --compile, COMPILE_SETTINGS while the model runs (dynamo traces at each shape's
        first call), then the process's own again: a later run starts from those."""
        return torch._dynamo.config.patch(COMPILE_SETTINGS) if self.args.compile else nullcontext()

    def _evaluate_and_track(self) -> dict[str, float]:
        metrics = self.evaluate()
        self._last_eval, self._last_eval_step = metrics, self.state.step
        self.log.record("eval", {"step": self.state.step, "epoch": self._epochs_done(), **metrics})
        summary = ", ".join(f"{name} {value:.4g}" for name, value in metrics.items())
        self.log.message(f"eval at step {self.state.step}: {summary}")
        self._track_best(metrics)
        return metrics

    def _epochs_done(self) -> float:
        """Epochs trained, the current one's share of batches included (the last step of a
        run ends its epoch before the epoch count moves on)."""
        state = self.state
        try:
            share = state.batches_in_epoch / len(self.train_loader)
        except TypeError:  # streaming: no length
            return state.epoch
        done = round(state.epoch + share, 4)
        return int(done) if done.is_integer() else done

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
        self._save_model(self.output_dir / "best", self._write_tokenizer)

    def _final_metrics(self) -> dict[str, float]:
        if not self.eval_sets:
            return {}
        if self._last_eval_step != self.state.step:
            self._evaluate_and_track()
        if not (self.args.metric_for_best_model and self.state.best_metrics is not None):
            return dict(self._last_eval)
        model = self.accelerator.unwrap_model(self.model)
        with own_storage(model):
            best = self.output_dir / "best" / "model.safetensors"
            device = self.accelerator.device  # safetensors takes "cpu", not the "cpu:0" of DDP
            load_model(model, best, device="cpu" if device.type == "cpu" else str(device))
        self.log.message(
            f"egbert: using the best model (step {self.state.best_step}, "
            f"{self.args.metric_for_best_model} {self.state.best_metric:.4g})"
        )
        return dict(self.state.best_metrics)

    # ------------------------------------------------------------ checkpoints and resume

    def save_checkpoint(self) -> Path:
        """checkpoints/step-N, atomically (egbert.training.checkpoints.Checkpointer)."""
        return self.checkpoints.save(
            self.state.step, asdict(self.state), self._save_stream_position, self._write_tokenizer
        )

    def _save_stream_position(self, checkpoint: Path) -> None:
        """Each process's position in its part of the stream (nothing for map-style data,
        whose position is the sampler's and the batch count)."""
        if self.stream is not None:
            self.stream.save(checkpoint, self.accelerator.process_index)

    def _load_stream_position(self, checkpoint: Path) -> None:
        if self.stream is not None and not self.stream.load(
            checkpoint, self.accelerator.process_index
        ):
            self.log.message(
                f"egbert: {checkpoint} holds no stream position; reading from the start"
            )

    def _start_or_resume(self) -> None:
        args = self.args
        self.checkpoints.clean_leftovers(self.output_dir)
        latest, note = self.checkpoints.start_point(args)  # refuses to start over checkpoints
        self.accelerator.init_trackers("egbert", config=report.tracker_config(self.run_config))
        if latest is None:
            if note:
                self.log.message(note)
            set_seed(args.seed)
            self.log.truncate(after_step=0)
            return
        model = self.accelerator.unwrap_model(self.model)
        saved = self.checkpoints.resume(latest, model, self.run_config, self.args.resume_anyway)
        self._load_stream_position(latest)
        known = {f.name for f in fields(TrainerState)}
        restored = TrainerState(**{k: v for k, v in saved.items() if k in known})
        restored.run_config, restored.config_hash = self.run_config, self.state.config_hash
        self.state = restored
        self.log.truncate(after_step=restored.step)
        later = self.checkpoints.remove_after(restored.step)  # a branch this run trains again
        self.log.message(
            f"egbert: resumed from {latest} (step {restored.step}, epoch {restored.epoch}, "
            f"batch {restored.batches_in_epoch} of the epoch)"
            + (f"; removed the later {', '.join(later)}" if later else "")
        )

    # ------------------------------------------------------------ the saved model

    def _save_model(self, target: Path, write_extras: Callable[[Path], None] | None = None) -> None:
        with label_smoothing(self._unwrapped, self._model_label_smoothing):
            save_model_folder(self.accelerator, self.model, target, write_extras)

    def _write_tokenizer(self, folder: Path) -> None:
        """The tokenizer beside every saved model, checkpoints included: any of them loads
        with AutoTokenizer as well as the final model."""
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(folder)

    def _save_final_model(self, metrics: dict[str, float]) -> Path:
        """`OUTPUT_DIR/model`: what a Hub repository holds (weights, config, generation config,
        tokenizer, model card); checkpoints and logs stay beside it."""
        options = {k: v for k, v in self.run_config.items() if k != "num_processes"}
        card = report.model_card(
            self.card or report.ModelCardInfo(),
            self._unwrapped,
            name=self.output_dir.name,
            metrics=metrics,
            training=report.training_summary(self.state, self.accelerator),
            options=options,
        )

        def write_tokenizer_and_card(folder: Path) -> None:
            self._write_tokenizer(folder)
            card.save(folder / "README.md")

        target = self.output_dir / RUN_MODEL_DIR
        self._save_model(target, write_tokenizer_and_card)
        return target
