"""The models a run saves beside its checkpoints: the best one by an evaluation metric
(`OUTPUT_DIR/best`) and the final one (`OUTPUT_DIR/model`, what a Hub repository holds: weights,
config, tokenizer, card), each written into a temporary folder and moved into place.

A model with LoRA adapters (a PEFT PeftModel, egbert.lora) is saved as PEFT saves it, its
adapters alone, in `best/` and `OUTPUT_DIR/adapter`; `OUTPUT_DIR/model` holds a copy with the
adapters merged into its weights, which loads without PEFT.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import ModelCard
from peft import PeftModel, set_peft_model_state_dict
from peft.utils import SAFETENSORS_WEIGHTS_NAME as ADAPTER_WEIGHTS_NAME
from safetensors.torch import load_file, load_model

from egbert import report
from egbert.errors import ConfigError
from egbert.lora import save_adapters_and_merge
from egbert.model_files import RUN_MODEL_DIR, SHARED_TENSORS_NOTE, quiet_warnings
from egbert.training.checkpoints import TrainerState, own_storage, publish_dir, untangled_state_dict

# Metric names that are better lower, when --greater-is-better is left unset.
LOWER_IS_BETTER = ("loss", "perplexity", "error")


@dataclass
class SavedWithModel:
    """What a Trainer writes beside the model it trains.

    run_config: what defines the run: {"options": the job's options (its dataclass fields),
        ...: what else identifies the model, tokenizer and data}; the trainer adds its own
        options; saved with each checkpoint, compared on resume, and in the model card.
    tokenizer: saved with the final model, the best one and every checkpoint (None: none).
    card: what the model card's Hub metadata says (None: the defaults).
    """

    run_config: dict[str, Any] = field(default_factory=dict)
    tokenizer: Any = None
    card: report.ModelCardInfo | None = None


def save_model_folder(
    accelerator: Any,
    model: torch.nn.Module,
    target: Path,
    write_extras: Any = None,
) -> None:
    """`save_pretrained` of a prepared (possibly wrapped or sharded) model into a folder beside
    `target`, then moved over it on the main process: a kill or a full disk never leaves a
    half-written model there. `write_extras(folder)` adds files (tokenizer, card) before."""
    temp = target.with_name(f".tmp-{target.name}")
    main = accelerator.is_main_process
    if main:
        shutil.rmtree(temp, ignore_errors=True)
    # Saving creates the folder in every process: none may do so before it is cleared.
    accelerator.wait_for_everyone()
    state_dict = untangled_state_dict(accelerator.get_state_dict(model))
    unwrapped = accelerator.unwrap_model(model)
    try:
        with quiet_warnings(SHARED_TENSORS_NOTE):
            if hasattr(unwrapped, "save_pretrained"):
                unwrapped.save_pretrained(
                    temp,
                    is_main_process=main,
                    save_function=accelerator.save,
                    state_dict=state_dict,
                )
            else:  # a plain nn.Module: its weights alone
                accelerator.save_model(model, temp)
        if main:
            if write_extras is not None:
                write_extras(temp)
            publish_dir(temp, target)
    finally:
        if main:
            shutil.rmtree(temp, ignore_errors=True)  # what a failed save left
    accelerator.wait_for_everyone()


class BestModel:
    """`OUTPUT_DIR/best`: the model of the best evaluation so far by --metric-for-best-model
    (none without it), its metric and step kept in the TrainerState (so a resumed run goes on
    comparing), and loaded back for the final model."""

    def __init__(
        self,
        metric_for_best_model: str | None,
        greater_is_better: bool | None,
        folder: Path,
        save: Callable[[Path, Callable[[Path], None]], None],
        write_extras: Callable[[Path], None],
    ) -> None:
        """save(folder, write_extras): save_model_folder of the trained model."""
        name = metric_for_best_model
        self.metric = None if name is None else name.removeprefix("eval_")
        self.greater_is_better = greater_is_better
        self.folder, self.save, self.write_extras = folder, save, write_extras

    def track(self, metrics: dict[str, float], state: TrainerState) -> None:
        """Save the model when `metrics` are the best yet (ConfigError: no such metric)."""
        name = self.metric
        if name is None:
            return
        if name not in metrics:
            raise ConfigError(
                f"--metric-for-best-model {name!r} is not an eval metric; "
                f"choose from {', '.join(metrics)}"
            )
        greater = self.greater_is_better
        if greater is None:
            greater = not any(word in name for word in LOWER_IS_BETTER)
        value, best = metrics[name], state.best_metric
        if best is not None and (value <= best if greater else value >= best):
            return
        state.best_metric, state.best_step, state.best_metrics = value, state.step, dict(metrics)
        self.save(self.folder, self.write_extras)

    def using_message(self, state: TrainerState) -> str:
        return (
            f"egbert: using the best model (step {state.best_step}, "
            f"{self.metric} {state.best_metric:.4g})"
        )

    def kept(self, state: TrainerState) -> bool:
        return self.metric is not None and state.best_metrics is not None

    def load_into(self, model: torch.nn.Module, device: torch.device) -> None:
        """The best model's weights (or adapters) into `model` (unwrapped), on `device`."""
        # safetensors takes "cpu", not the "cpu:0" of DDP
        where = "cpu" if device.type == "cpu" else str(device)
        if isinstance(model, PeftModel):
            adapters = load_file(self.folder / ADAPTER_WEIGHTS_NAME, device=where)
            set_peft_model_state_dict(model, adapters)
            return
        with own_storage(model):
            load_model(model, self.folder / "model.safetensors", device=where)


def tokenizer_writer(tokenizer: Any) -> Callable[[Path], None]:
    """What writes `tokenizer` (None: nothing) into a folder beside a saved model, so that the
    folder loads with AutoTokenizer too."""

    def write(folder: Path) -> None:
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)

    return write


def save_final_model(
    accelerator: Any,
    model: torch.nn.Module,
    output_dir: Path,
    card: ModelCard,
    write_tokenizer: Callable[[Path], None],
) -> Path:
    """`OUTPUT_DIR/model`: the weights, config and generation config, the tokenizer and the
    model `card`; checkpoints and logs stay beside it. A model with adapters: those in
    `OUTPUT_DIR/adapter` (with the tokenizer), and `model/` with them merged in."""

    def write_tokenizer_and_card(folder: Path) -> None:
        write_tokenizer(folder)
        card.save(folder / "README.md")

    target = output_dir / RUN_MODEL_DIR
    merged = save_adapters_and_merge(
        accelerator.unwrap_model(model),
        output_dir,
        lambda folder: save_model_folder(accelerator, model, folder, write_tokenizer),
    )
    save_model_folder(
        accelerator, model if merged is None else merged, target, write_tokenizer_and_card
    )
    return target


def run_model_card(
    info: report.ModelCardInfo | None,
    model: torch.nn.Module,
    name: str,
    metrics: dict[str, float],
    state: TrainerState,
    accelerator: Any,
) -> ModelCard:
    """The final model's card: what the job says of it (`info`), its metrics, how long it
    trained and every option of the run (the number of processes aside)."""
    options = {k: v for k, v in state.run_config.items() if k != "num_processes"}
    return report.model_card(
        info or report.ModelCardInfo(),
        model,
        name=name,
        metrics=metrics,
        training=report.training_summary(state, accelerator),
        options=options,
    )
