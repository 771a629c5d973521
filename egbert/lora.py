"""LoRA (Hu et al. 2021) through PEFT, for the jobs that train a model's weights: each target
linear layer W keeps its weights frozen and learns W + (alpha / rank) * B A, with A (rank x in)
and B (out x rank, zero at the start, so the adapted model starts as the base).

PEFT adapts a model it does not know by its modules' names: egbert's bert and gpt name their
attention's fused projection `qkv` and its output `out`, the feed-forward's `up` and `down`
(layers.py), stock GPT-2 `c_attn`, `c_proj` and `c_fc`. elmo's LSTM is refused: PEFT adapts
linear, embedding and convolution layers, not nn.LSTM.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peft import LoraConfig, PeftModel, get_peft_model

from egbert.errors import ConfigError

# The modules of egbert's sequence classifiers that fine-tuning creates: trained whole beside the
# adapters and saved with them (the scalar mix only where --features scalar-mix builds one).
CLASSIFIER_HEAD_MODULES = ("classifier", "scalar_mix")

# Where a run saves its adapters alone, beside model/ (the model with them merged in).
ADAPTER_DIR = "adapter"
# The linear layers --lora adapts by default, by model type.
TARGET_MODULES = {
    "egbert-bert": ("qkv", "out", "up", "down"),
    "egbert-gpt": ("qkv", "out", "up", "down"),
    "gpt2": ("c_attn", "c_proj", "c_fc"),
}
UNADAPTABLE = {"egbert-elmo": "its LSTM layers are nn.LSTM, which PEFT does not adapt"}


@dataclass
class LoraArguments:
    """--lora and its settings: train low-rank adapters instead of the model's weights."""

    _argument_group_name = "LoRA (PEFT)"

    lora: bool = field(
        default=False,
        metadata={
            "help": "train LoRA adapters on the attention and feed-forward linears instead of "
            "every weight (PEFT); the base weights stay frozen"
        },
    )
    lora_rank: int = field(default=8, metadata={"help": "with --lora: the adapters' rank"})
    lora_alpha: float = field(
        default=16.0, metadata={"help": "with --lora: the update's scale is alpha / rank"}
    )
    lora_dropout: float = field(
        default=0.0, metadata={"help": "with --lora: dropout on the adapters' input"}
    )
    lora_target_modules: list[str] | None = field(
        default=None,
        metadata={
            "help": "with --lora: the names of the linear layers adapted (default: egbert's "
            "qkv out up down; GPT-2's c_attn c_proj c_fc)"
        },
    )

    def __post_init__(self) -> None:
        if self.lora_rank < 1:
            raise ConfigError(f"--lora-rank must be >= 1, got {self.lora_rank}")
        if not 0 <= self.lora_dropout < 1:
            raise ConfigError(f"--lora-dropout must be in [0, 1), got {self.lora_dropout}")


def check_adaptable(model_type: str | None) -> None:
    """A ConfigError for a model type LoRA cannot adapt (elmo)."""
    if model_type in UNADAPTABLE:
        raise ConfigError(
            f"--lora: a {model_type} model cannot take LoRA: {UNADAPTABLE[model_type]}"
        )


def lora_config(
    args: LoraArguments,
    config: Any,
    task_type: str | None,
    modules_to_save: list[str] | None = None,
) -> LoraConfig | None:
    """PEFT's LoraConfig for a model of `config` (None without --lora); `modules_to_save`:
    modules trained whole beside the adapters (a new classification head)."""
    if not args.lora:
        return None
    model_type = getattr(config, "model_type", None)
    check_adaptable(model_type)
    targets = args.lora_target_modules or TARGET_MODULES.get(model_type)
    if not targets:
        raise ConfigError(
            f"--lora: no default layers to adapt for a {model_type!r} model; name them with "
            "--lora-target-modules"
        )
    return LoraConfig(
        r=args.lora_rank,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        target_modules=list(targets),
        modules_to_save=modules_to_save,
        task_type=task_type,
    )


def with_adapters(
    model: Any, args: LoraArguments, base_dir: Any, modules_to_save: list[str] | None = None
) -> Any:
    """`model` with LoRA adapters (PEFT's PeftModel, its base frozen) under --lora, else `model`
    itself. The adapter's config names `base_dir`, the folder its base loads from. PEFT's
    task-specific wrappers pass arguments egbert's forwards do not take (inputs_embeds to a
    bert): the plain PeftModel passes the batch through as it comes."""
    config = lora_config(args, model.config, None, modules_to_save)
    if config is None:
        return model
    adapted = get_peft_model(model, config)
    adapted.peft_config["default"].base_model_name_or_path = str(base_dir)
    return adapted


def trainable_parameters(model: Any) -> int:
    """The number of weights training changes (with adapters: theirs and the head's)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def save_adapters_and_merge(
    model: Any, output_dir: Path, save_folder: Callable[[Path], None]
) -> Any | None:
    """For a run's model/: a model with adapters (a PeftModel) has them saved alone in
    OUTPUT_DIR/adapter by `save_folder` and comes back merged into a copy of its base, which
    loads without PEFT (the trained model keeps its adapters); None for a model without."""
    if not isinstance(model, PeftModel):
        return None
    save_folder(Path(output_dir) / ADAPTER_DIR)
    return copy.deepcopy(model).merge_and_unload()
