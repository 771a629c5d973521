"""A training run's checkpoints and saved models, written atomically and read back exactly.

Checkpoints are written to a temporary folder, flushed to disk and renamed into place, so that a
kill or a full disk never leaves a half-written one. Weights are written and read in a
layout-independent way: cuDNN keeps an LSTM's weights as views into one flat buffer, which
safetensors would otherwise take for tied copies of one tensor and drop (`untangled_state_dict`,
`own_storage`). Loading a saved model directory (safetensors, pickles only when asked for) is
egbert.model_files'.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import shutil
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from egbert.errors import CheckpointError, ConfigError, first_line
from egbert.model_files import SHARED_TENSORS_NOTE, quiet_warnings
from egbert.training.batches import StreamPosition

# ---------------------------------------------------------------- layout-independent weights


def _layout(tensor: torch.Tensor) -> tuple:
    return (tensor.device, tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()))


def _views_to_untangle(tensors: Mapping[str, torch.Tensor]) -> dict[str, tuple]:
    """{name: layout} of the tensors that share a storage with a tensor of another layout
    (cuDNN's flat LSTM weights); tensors sharing only with exact aliases (tied weights) are
    left out, so they stay tied."""
    by_storage: dict[tuple, list[str]] = {}
    for name, tensor in tensors.items():
        if isinstance(tensor, torch.Tensor) and tensor.device.type != "meta":
            try:
                key = (tensor.device, tensor.untyped_storage().data_ptr())
            except RuntimeError:  # FSDP2's DTensor shards have no storage to share
                continue
            by_storage.setdefault(key, []).append(name)
    tangled = {}
    for names in by_storage.values():
        layouts = {name: _layout(tensors[name]) for name in names}
        if len(set(layouts.values())) > 1:
            tangled |= layouts
    return tangled


def untangled_state_dict(state_dict: Mapping[str, Any]) -> OrderedDict[str, Any]:
    """The state dict with each tensor in a storage of its own, except tied weights, which stay
    one tensor under several names (as `save_pretrained` expects).

    safetensors writes one tensor per storage: for tensors that are views into one buffer,
    as cuDNN keeps an LSTM's weights on a GPU, Accelerate's `save_state` dropped all but one
    (16 of elmo's LSTM tensors were missing from its checkpoints) and `save_pretrained` refuses
    them. Copies of those views are written instead; aliases of one view share its copy."""
    tangled = _views_to_untangle(state_dict)
    copies: dict[tuple, torch.Tensor] = {}
    untangled = OrderedDict(state_dict)  # Accelerate removes tied duplicates from these only
    for name, layout in tangled.items():
        if layout not in copies:
            copies[layout] = state_dict[name].detach().clone()
        untangled[name] = copies[layout]
    return untangled


@contextmanager
def own_storage(model: torch.nn.Module) -> Iterator[None]:
    """Within the block, each of `model`'s parameters that is a view into a buffer shared with
    others (cuDNN's flat LSTM weights) has a storage of its own, so that safetensors'
    `load_model` (Accelerate's `load_state`) can load into it; afterwards the LSTMs go back to
    cuDNN's flat layout. Elsewhere it changes nothing."""
    parameters = dict(model.named_parameters(remove_duplicate=False))
    tangled = _views_to_untangle(parameters)
    copies: dict[tuple, torch.Tensor] = {}
    for name, layout in tangled.items():
        if layout not in copies:
            copies[layout] = parameters[name].detach().clone()
        parameters[name].data = copies[layout]
    try:
        yield
    finally:
        if tangled:
            for module in model.modules():
                if isinstance(module, torch.nn.RNNBase):
                    module.flatten_parameters()


# ---------------------------------------------------------------- atomic folders


def fsync_tree(directory: Path) -> None:
    """Flush every file of a freshly written folder to disk before it is renamed into place."""
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            with path.open("rb") as handle:
                os.fsync(handle.fileno())
    fsync_dir(directory)


def fsync_dir(directory: Path) -> None:
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def remove_dir(directory: Path) -> None:
    """Rename first so that a kill mid-delete never leaves a half-deleted folder behind."""
    doomed = directory.with_name(f".tmp-delete-{directory.name}")
    os.replace(directory, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def publish_dir(temp: Path, final: Path) -> None:
    """Move a fully written `temp` folder to `final` (replacing a previous one) after flushing
    it, so that `final` is always either the old folder or the whole new one."""
    fsync_tree(temp)
    if final.exists():
        remove_dir(final)
    os.replace(temp, final)
    fsync_dir(final.parent)


# ---------------------------------------------------------------- training checkpoints

STATE_FILE = "trainer_state.json"


@dataclass
class TrainerState:
    """Where a run stands; saved as JSON next to each checkpoint and restored on resume."""

    step: int = 0  # optimizer updates done
    epoch: int = 0
    batches_in_epoch: int = 0  # batches (per process) of the current epoch already consumed
    elapsed_seconds: float = 0.0  # training wall time, evaluation and saving excluded
    # elapsed_seconds after each step, skipped ones too: the clock --replay-clock replays
    clock_readings: list[float] = field(default_factory=list)
    tokens_seen: int = 0
    skipped_nonfinite: int = 0
    skipped_overflow: int = 0  # fp16 updates skipped because their gradients overflowed
    batch_size_found: int | None = None  # the batch --auto-find-batch-size went on with
    best_metric: float | None = None
    best_step: int | None = None
    best_metrics: dict[str, float] | None = None
    run_config: dict[str, Any] = field(default_factory=dict)
    config_hash: str = ""


def checkpoints_in(folder: Path) -> list[tuple[int, Path]]:
    """The complete checkpoints `step-N` of a folder, oldest first (a `step-N` exists only once
    fully written: it is renamed into place)."""
    if not folder.is_dir():
        return []
    found = []
    for path in folder.iterdir():
        prefix, _, number = path.name.partition("-")
        if prefix == "step" and number.isdigit() and (path / STATE_FILE).is_file():
            found.append((int(number), path))
    return sorted(found)


# Errors of writing files: a full disk or quota, a read-only or forbidden output directory.
WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM)


def write_error_reason(error: OSError) -> str:
    return "disk full" if error.errno == errno.ENOSPC else error.strerror or str(error)


def write_failure(error: OSError, output_dir: Path, latest: Path | None) -> CheckpointError | None:
    """A failed write of a run's files (a log, a plot, the final model) as the one-line error
    that says what to do and whether the `latest` checkpoint survives; None for other errors."""
    if error.errno not in WRITE_ERRNOS:
        return None
    kept = f"the newest checkpoint {latest} is intact" if latest else "no checkpoint yet"
    return CheckpointError(
        f"could not write {error.filename or output_dir}: {write_error_reason(error)}; free "
        f"disk space (or fix the permissions) and run again with --resume ({kept})"
    )


@dataclass(frozen=True)
class ResumeOptions:
    """Where a run starts (Checkpointer.start): the TrainingArguments fields of these names."""

    resume: bool
    resume_from_checkpoint: str | None
    overwrite_output_dir: bool


class Checkpointer:
    """A run's `checkpoints/step-N` folders through Accelerate's `save_state`/`load_state`:
    written into a temp folder, flushed and renamed once every process has written its part,
    the newest `keep` kept (Accelerate's own `total_limit` deletes the oldest before the new
    one is written, so a full disk could leave none); loaded with `weights_only`."""

    def __init__(self, accelerator: Any, folder: Path, keep: int) -> None:
        self.accelerator = accelerator
        self.folder = folder
        self.keep = keep
        # cuDNN's flat LSTM weights would lose all but one tensor in a checkpoint
        accelerator.register_save_state_pre_hook(self._untangle)

    @staticmethod
    def _untangle(models: list, weights: list, folder: str) -> None:
        weights[:] = [untangled_state_dict(state_dict) for state_dict in weights]

    def latest(self) -> Path | None:
        """The newest complete checkpoint."""
        found = checkpoints_in(self.folder)
        return found[-1][1] if found else None

    def start(self, options: ResumeOptions, say: Callable[[str], None]) -> Path | None:
        """The checkpoint a run with these `options` resumes from (None: it starts anew), after
        removing what a run killed mid-save left (`start_point` says which)."""
        self.clean_leftovers(self.folder.parent)
        latest, note = self.start_point(options)
        if note:
            say(note)
        return latest

    def start_point(self, options: ResumeOptions) -> tuple[Path | None, str | None]:
        """Where a run with these `options` starts: the checkpoint to resume from (None: anew)
        and what to say of it. Checkpoints there from an earlier run are refused, unless the run
        resumes or `overwrite_output_dir` (then they are removed)."""
        output_dir = self.folder.parent
        earlier = self.remove_after(-1) if options.overwrite_output_dir else []
        latest = checkpoint_to_resume(output_dir, options.resume, options.resume_from_checkpoint)
        if self.latest() is not None and latest is None:
            raise ConfigError(
                f"{output_dir} already holds checkpoints; pass --resume to continue that run, "
                "--overwrite-output-dir to start over, or choose a new --output-dir"
            )
        if earlier:
            return None, (
                f"egbert: --overwrite-output-dir: removed the earlier run's checkpoints "
                f"{', '.join(earlier)} from {self.folder}"
            )
        if latest is None and options.resume:
            return None, f"egbert: no checkpoint in {self.folder}; starting"
        return latest, None

    def remove_after(self, step: int) -> list[str]:
        """Remove the checkpoints of steps after `step` (all: -1); returns their names."""
        removed = [path for number, path in checkpoints_in(self.folder) if number > step]
        if self.accelerator.is_main_process:
            for path in removed:
                remove_dir(path)
        self.accelerator.wait_for_everyone()
        return [path.name for path in removed]

    def save(
        self,
        step: int,
        state: dict[str, Any],
        write_own_files: Callable[[Path], None] | None = None,
        write_extras: Callable[[Path], None] | None = None,
    ) -> Path:
        """Write `step-{step}` with the trainer's `state` as JSON, what each process's
        `write_own_files(folder)` adds and what the main process's `write_extras(folder)` adds
        (e.g. the tokenizer); a failed write leaves the previous checkpoints intact and raises a
        one-line CheckpointError."""
        accelerator = self.accelerator
        final = self.folder / f"step-{step}"
        if final.is_dir():  # this very state is saved already (e.g. stopped right after resume)
            return final
        temp = self.folder / f".tmp-step-{step}"
        if accelerator.is_main_process:
            shutil.rmtree(temp, ignore_errors=True)
            self.folder.mkdir(parents=True, exist_ok=True)
        accelerator.wait_for_everyone()

        def write() -> None:
            with quiet_warnings(SHARED_TENSORS_NOTE):
                accelerator.save_state(str(temp))
            if write_own_files is not None:
                write_own_files(temp)

        ok = self._on_all_processes(write)
        if ok:  # every process has written its part: the main one publishes the whole
            main = accelerator.is_main_process
            ok = self._on_all_processes(
                lambda: main and self._publish(temp, final, state, write_extras)
            )
        if not ok:
            if accelerator.is_main_process:
                shutil.rmtree(temp, ignore_errors=True)
            previous = self.latest()
            kept = f"the previous checkpoint {previous} is intact" if previous else "none kept"
            raise CheckpointError(
                f"could not write checkpoint {final}: {self._error}; free disk space or "
                f"choose another --output-dir ({kept})"
            )
        if accelerator.is_main_process:
            for _, path in checkpoints_in(self.folder)[: -self.keep]:
                remove_dir(path)
        accelerator.wait_for_everyone()
        return final

    def _on_all_processes(self, action: Any) -> bool:
        """Run `action`, then agree across processes whether it worked everywhere (also a
        barrier, so no process renames a checkpoint another one is still writing)."""
        self._error = "another process failed to write its part"
        failed = 0.0
        try:
            action()
        except OSError as error:
            self._error = write_error_reason(error)
            failed = 1.0
        flag = torch.tensor([failed], device=self.accelerator.device)
        return not self.accelerator.reduce(flag, reduction="sum").item() > 0

    def _publish(self, temp: Path, final: Path, state: dict[str, Any], write_extras: Any) -> None:
        if write_extras is not None:
            write_extras(temp)
        with (temp / STATE_FILE).open("w", encoding="utf-8") as handle:
            json.dump(state, handle, indent=2)
        fsync_tree(temp)
        os.replace(temp, final)
        fsync_dir(self.folder)

    def clean_leftovers(self, output_dir: Path) -> None:
        """Remove the temp folders of a run killed while it saved a checkpoint or a model."""
        if self.accelerator.is_main_process:
            for folder in (self.folder, output_dir):
                for leftover in folder.glob(".tmp-*"):
                    shutil.rmtree(leftover, ignore_errors=True)
        self.accelerator.wait_for_everyone()

    def resume(
        self,
        checkpoint: Path,
        model: torch.nn.Module,
        current: TrainerState,
        resume_anyway: bool,
        stream: StreamPosition | None,
        say: Callable[[str], None],
    ) -> TrainerState:
        """Go on from `checkpoint` as it left off, if the run config it was saved with is the
        `current` state's (or `resume_anyway`: --resume-anyway): weights, optimizer, scheduler
        and RNG restored, the stream's position too, and the later checkpoints of the run
        removed (a branch this run trains again); returns the trainer state saved with it."""
        saved = refuse_changed_run(checkpoint, current.run_config, resume_anyway)
        self._load_state(checkpoint, model)
        process = self.accelerator.process_index
        if stream is not None and not stream.load(checkpoint, process):
            say(f"egbert: {checkpoint} holds no stream position; reading from the start")
        known = {f.name for f in fields(TrainerState)}
        state = TrainerState(**{k: v for k, v in saved.items() if k in known})
        state.run_config, state.config_hash = current.run_config, current.config_hash
        later = self.remove_after(state.step)
        say(
            f"egbert: resumed from {checkpoint} (step {state.step}, epoch {state.epoch}, "
            f"batch {state.batches_in_epoch} of the epoch)"
            + (f"; removed the later {', '.join(later)}" if later else "")
        )
        return state

    def _load_state(self, checkpoint: Path, model: torch.nn.Module) -> None:
        """Accelerate's load_state; the optimizer, scheduler and RNG files are unpickled with
        weights_only, so no code a stranger put in them runs."""
        try:
            with own_storage(model):
                self.accelerator.load_state(str(checkpoint), load_kwargs={"weights_only": True})
        except (pickle.UnpicklingError, RuntimeError, ValueError, KeyError) as error:
            message = first_line(error)
            raise CheckpointError(f"cannot load checkpoint {checkpoint}: {message}") from None


def checkpoint_to_resume(output_dir: Path, resume: bool, named: str | None = None) -> Path | None:
    """The checkpoint a run goes on from: `named` (--resume-from-checkpoint), else with `resume`
    the newest in OUTPUT_DIR/checkpoints; None to start anew."""
    if named is None:
        found = checkpoints_in(output_dir / "checkpoints")
        return found[-1][1] if resume and found else None
    if not (Path(named) / STATE_FILE).is_file():
        raise ConfigError(
            f"--resume-from-checkpoint {named}: not a checkpoint (no {STATE_FILE}); pass a "
            "run's checkpoints/step-N folder"
        )
    return Path(named)


def refuse_changed_run(
    checkpoint: Path, run_config: dict[str, Any], anyway: bool, parts: bool = False
) -> dict[str, Any]:
    """The trainer state saved in `checkpoint`, if the run config it was saved with is
    `run_config` (or `anyway`); with `parts`, only the sections `run_config` has are compared (a
    job's check before it builds its data; the trainer checks the whole again)."""
    state = json.loads((checkpoint / STATE_FILE).read_text(encoding="utf-8"))
    saved = state.get("run_config", {})
    if parts:
        saved = {key: value for key, value in saved.items() if key in run_config}
    differences = config_differences(saved, run_config)
    if differences and not anyway:
        raise ConfigError(
            f"cannot resume from {checkpoint}: the run changed ("
            + "; ".join(differences)
            + "); use the original options (a resume may change only the logging, "
            "evaluation and saving intervals, --report-to and the like, or run longer) or "
            "pass --resume-anyway"
        )
    return state


def _flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat |= _flatten(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


# The options a resumed run may change: they decide what is logged, evaluated when, saved,
# tracked or written beside the model, not what is trained. Every other option of the run
# config's "options" (all of the job's dataclass fields) must stay as the checkpoint has it.
MAY_CHANGE_ON_RESUME = frozenset(
    {
        "output_dir",
        "resume",
        "resume_anyway",
        "log_every",
        "eval_every",
        "eval_every_minutes",
        "save_every",
        "keep_checkpoints",
        "report_to",
        "num_workers",
        "skip_nonfinite",
        "num_proc",  # tokenization processes: the same examples
        "card_datasets",
        "license",
        "base_model_id",
        "predict",
        "test_file",
        "resume_from_checkpoint",
        "overwrite_output_dir",
    }
)
# A run may go on longer than the checkpoint's run was to (not shorter: it may be past that
# end); the schedule then runs over the new length.
LONGER_ON_RESUME = ("max_steps", "epochs", "budget_minutes")
OPTIONS = "options"


def _option_may_change(name: str, old: Any, new: Any) -> bool:
    if name in MAY_CHANGE_ON_RESUME:
        return True
    return name in LONGER_ON_RESUME and old is not None and new is not None and new >= old


def config_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """What forbids resuming a run saved with run config `saved` under `current`: each changed
    option outside MAY_CHANGE_ON_RESUME as `--name old -> new`, each other changed field (the
    model, tokenizer and data identities) as `field: old -> new`."""
    saved, current = _flatten(saved), _flatten(current)
    refused = []
    for key in sorted(saved.keys() | current.keys()):
        old, new = saved.get(key, "(unset)"), current.get(key, "(unset)")
        if old == new:
            continue
        section, _, name = key.partition(".")
        if section != OPTIONS:
            refused.append(f"{key}: {old} -> {new}")
        elif not _option_may_change(name, old, new):
            refused.append(f"--{name.replace('_', '-')} {old} -> {new}")
    return refused


def whole_run_config(
    run_config: dict[str, Any], trainer_options: dict[str, Any], num_processes: int
) -> dict[str, Any]:
    """What defines a run, saved with each checkpoint and compared on resume: the job's
    `run_config`, with every option, the job's and the trainer's (`trainer_options`: each field
    of its TrainingArguments; a resume may change only a few), and the number of processes (the
    data each one sees depends on it)."""
    options = {**run_config.get(OPTIONS, {}), **trainer_options}
    return {**run_config, OPTIONS: options, "num_processes": num_processes}


def config_hash(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()
