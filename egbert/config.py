"""Run configurations: the shared trainer's options (`TrainingArguments`, a dataclass whose
fields are command-line options; each job's own are in its folder: egbert.pretrain.options,
egbert.finetune.options, ...), and the files that give them values.

Every field is an option (`--seq-len 128`; egbert.arguments builds the parser), and any of them
can come from a YAML or JSON file instead (`--config run.yaml`, a flat mapping of field names);
options given on the command line override the file. A field's default here is the one every
family uses unless its recipe says otherwise: `load_recipe` reads egbert/configs/recipes/ (the
defaults of each family and stage, in one place). Model sizes live in presets: `load_preset`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from egbert.arguments import read_config_file
from egbert.errors import CheckpointError, ConfigError
from egbert.families import FAMILY_OF_MODEL_TYPE, MODEL_FAMILIES
from egbert.model_files import read_model_config

# Options of transformers' example scripts (run_mlm.py, run_clm.py, run_glue.py) that egbert's
# pretrain and finetune lack, with what to use instead (the ones they have are aliases of their
# own options: `--learning-rate` of --lr, ...). docs/commands.md has the whole table.
SCRIPT_HINTS = {
    "--do-train": "egbert always trains; drop it",
    "--do-eval": "the validation data given is evaluated; drop it",
    "--do-predict": "finetune predicts the test files unless --no-predict",
    "--torch-dtype": "egbert's mixed precision is --bf16 or --fp16",
    "--model-type": "pretrain: --model bert|gpt|elmo",
    "--config-name": "pretrain: --preset (a name or a YAML file of config kwargs)",
    "--tokenizer-name": "pretrain: --tokenizer; finetune reads the model folder's",
    "--dataset-name": "pretrain: --dataset; finetune: --task or --train-file",
    "--dataset-config-name": "pretrain: --dataset-config",
    "--train-file": "pretrain: --train-files",
    "--validation-file": "pretrain: --validation-files",
    "--line-by-line": "pretrain: --doc-boundary line",
    "--keep-linebreaks": "pretrain: --doc-boundary",
    "--pad-to-max-length": "egbert pads each batch to its longest example; drop it",
    "--overwrite-cache": "egbert's cache follows the files' sizes and dates; drop it",
    "--cache-dir": "set HF_DATASETS_CACHE",
    "--per-device-eval-batch-size": "evaluation batches are --batch-size",
    "--eval-strategy": "--eval-every N (steps; 0: at the end)",
    "--evaluation-strategy": "--eval-every N (steps; 0: at the end)",
    "--save-strategy": "--save-every N (steps; 0: at the end)",
    "--logging-strategy": "--log-every N (steps)",
    "--logging-dir": "the trackers' logs go to OUTPUT_DIR/logs",
    "--load-best-model-at-end": "--metric-for-best-model",
    "--dataloader-num-workers": "--num-workers",
    "--torch-compile": "--compile",
    "--torch-compile-mode": "--compile-mode",
    "--label-smoothing-factor": "--label-smoothing",
    "--push-to-hub": "`egbert push` after the run",
    "--hub-model-id": "`egbert push --repo-id`",
    "--trust-remote-code": "egbert never runs a model folder's code; drop it",
    "--use-fast-tokenizer": "egbert's tokenizers are fast ones; drop it",
    "--no-cuda": "--use-cpu",
    "--low-cpu-mem-usage": "drop it",
}
SCHEDULES = ("linear", "cosine", "inverse_sqrt", "constant", "wsd")
# `--optim`: AdamW on every parameter, or Muon on the hidden matrices with AdamW on the rest
OPTIMIZERS = ("adamw", "muon")
# torch.compile's modes (torch.compile's docs); "default" is what --compile uses unless told
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# `--report-to`: Accelerate's trackers by name, or none
TRACKERS = ("tensorboard", "wandb", "mlflow", "trackio", "none")


@dataclass
class TrainingArguments:
    """Options of a training run; every field is also a command-line option (see egbert.config)."""

    _argument_group_name = "training"
    # transformers' names of these options (as run_mlm.py and run_clm.py take them): aliases
    _aliases = {
        "lr": ["--learning-rate"],
        "batch_size": ["--per-device-train-batch-size"],
        "grad_accum": ["--gradient-accumulation-steps"],
        "epochs": ["--num-train-epochs"],
        "schedule": ["--lr-scheduler-type"],
        "eval_every": ["--eval-steps"],
        "save_every": ["--save-steps"],
        "keep_checkpoints": ["--save-total-limit"],
        "log_every": ["--logging-steps"],
    }

    output_dir: str = field(metadata={"help": "run directory: checkpoints, logs, final model"})
    optim: str = field(
        default="adamw",
        metadata={
            "help": "the optimizer: adamw, or muon (torch.optim.Muon on the 2-d weight matrices "
            "of the model's body, AdamW with --lr and --weight-decay on embeddings, heads, norms "
            "and biases; not with FSDP or DeepSpeed)",
            "choices": list(OPTIMIZERS),
        },
    )
    lr: float = field(default=5e-4, metadata={"help": "peak learning rate (a scale for Noam)"})
    weight_decay: float = field(
        default=0.01, metadata={"help": "AdamW decay (not on biases/norms)"}
    )
    muon_lr: float | None = field(
        default=None,
        metadata={
            "help": "--optim muon: peak learning rate of the Muon matrices (unset: --lr; Muon's "
            "updates are scaled to AdamW's RMS, as Moonshot's match_rms_adamw, so one lr serves "
            "both)"
        },
    )
    muon_weight_decay: float = field(
        default=0.0, metadata={"help": "--optim muon: decoupled weight decay of the Muon matrices"}
    )
    muon_momentum: float = field(
        default=0.95, metadata={"help": "--optim muon: Muon's (Nesterov) momentum"}
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
        metadata={
            "help": "passes over the data, whole ones (unset: one, or with --budget-minutes as "
            "many as the budget allows; with both, the run ends at whichever end comes first)",
            "parse": float,  # so that a fraction gets the field's own refusal
        },
    )
    schedule: str = field(
        default="linear",
        metadata={"help": "learning-rate schedule", "choices": list(SCHEDULES)},
    )
    wsd_decay: float = field(
        default=0.2,
        metadata={
            "help": "--schedule wsd (warmup-stable-decay): the share of the run, at its end, "
            "over which the lr falls linearly from its peak to 0"
        },
    )
    warmup_steps: float = field(
        default=0.0,
        metadata={
            "help": "warmup: a number of steps, or a fraction < 1 of the run (e.g. 0.06)",
            "aliases": ["--warmup-ratio"],
        },
    )
    bf16: bool | None = field(
        default=None,
        metadata={
            "help": "bf16 mixed precision (CPU or GPU); --bf16 false turns it off; unset, the "
            "launch config's mixed_precision decides (accelerate launch --config_file), else fp32"
        },
    )
    fp16: bool = field(
        default=False,
        metadata={
            "help": "fp16 mixed precision with dynamic loss scaling, for GPUs without bf16 (T4, "
            "V100, P100); steps whose gradients overflow are skipped. On a GPU Accelerate's, on "
            "the CPU egbert's own (torch.autocast and torch.amp.GradScaler)"
        },
    )
    gradient_checkpointing: bool = field(
        default=False,
        metadata={
            "help": "recompute each layer's activations in the backward pass instead of keeping "
            "them: less memory for about a third more compute (bert, gpt and elmo)"
        },
    )
    auto_find_batch_size: bool = field(
        default=False,
        metadata={
            "help": "on out-of-memory halve --batch-size and double --grad-accum (the batch "
            "per step and the schedule stay) and go on; one process, map-style data"
        },
    )
    group_by_length: bool = field(
        default=False,
        metadata={
            "help": "batch examples of similar length together, so that batches pad less "
            "(transformers' length-grouped order, drawn per epoch from --seed); map-style data "
            "with input_ids; fine-tuning's recipe sets it"
        },
    )
    max_grad_norm: float = field(
        default=1.0, metadata={"help": "clip the gradient norm to this (0: no clipping)"}
    )
    label_smoothing: float | None = field(
        default=None, metadata={"help": "label smoothing of the model's loss (training only)"}
    )
    eval_every: int = field(default=0, metadata={"help": "evaluate every N steps (0: at the end)"})
    eval_every_minutes: float = field(
        default=0.0,
        metadata={
            "help": "also evaluate each time another M minutes of training time have passed "
            "(evaluation and saving not counted): the validation loss at fixed minute marks, "
            "to compare runs by the time they take to reach a loss (0: off)"
        },
    )
    save_every: int = field(
        default=0, metadata={"help": "checkpoint every N steps (0: only at the end)"}
    )
    keep_checkpoints: int = field(default=2, metadata={"help": "keep the last K checkpoints"})
    seed: int = field(default=42, metadata={"help": "random seed"})
    budget_minutes: float | None = field(
        default=None,
        metadata={
            "help": "stop after M minutes of training; the schedule runs over the budget, or with "
            "--epochs/--max-steps over whichever ends first (progress: the larger of elapsed / "
            "budget and step / total steps)"
        },
    )
    replay_clock: str | None = field(
        default=None,
        metadata={
            "help": "a finished run's folder: take each step's training time from its clock.json "
            "instead of the clock, so that with that run's options a --budget-minutes run gets "
            "its schedule and ends at its step (egbert quickstart --replay uses it)"
        },
    )
    skip_nonfinite: int = field(
        default=0, metadata={"help": "skip up to N steps with a non-finite loss, then stop"}
    )
    log_every: int = field(default=10, metadata={"help": "log the training loss every N steps"})
    report_to: list[str] = field(
        default_factory=lambda: ["tensorboard"],
        metadata={
            "help": "where the metrics also go, besides metrics.jsonl: Accelerate's trackers "
            f"({', '.join(TRACKERS[:-1])}; installed separately but tensorboard) or none"
        },
    )
    resume: bool = field(
        default=False, metadata={"help": "continue from the newest checkpoint in --output-dir"}
    )
    resume_anyway: bool = field(
        default=False, metadata={"help": "resume even if the run config changed"}
    )
    resume_from_checkpoint: str | None = field(
        default=None,
        metadata={
            "help": "continue from this checkpoint (a checkpoints/step-N folder) instead of the "
            "newest; the checkpoints after it are removed"
        },
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "start over in an --output-dir that holds checkpoints: they are removed "
            "(without it such a directory is refused unless --resume)"
        },
    )
    metric_for_best_model: str | None = field(
        default=None,
        metadata={"help": "keep the best model by this eval metric and save it at the end"},
    )
    greater_is_better: bool | None = field(
        default=None,
        metadata={"help": "direction of --metric-for-best-model (unset: lower for loss-like ones)"},
    )
    num_workers: int | None = field(
        default=None,
        metadata={
            "help": "data loader worker processes that collate the batches (default: 2 on a GPU, "
            "where collating beside the step pays; 0 on the CPU, where workers take cores from "
            "the step: docs/performance.md)"
        },
    )
    compile: bool = field(
        default=False,
        metadata={
            "help": "torch.compile the model; its compile time is logged apart and left out of "
            "tokens/s and MFU (on the CPU it has not paid: the bench's compiled mini bert ran "
            "23% slower than eager, docs/performance.md)"
        },
    )
    compile_mode: str = field(
        default="default",
        metadata={"help": "torch.compile's mode with --compile", "choices": list(COMPILE_MODES)},
    )
    use_cpu: bool = field(default=False, metadata={"help": "train on CPU even if a GPU is there"})
    ddp_find_unused_parameters: bool = field(
        default=False, metadata={"help": "DDP: allow parameters that get no gradient"}
    )

    def __post_init__(self) -> None:
        if isinstance(self.report_to, str):  # one tracker, from Python or a config file
            self.report_to = [self.report_to]
        positive = {"lr": self.lr, "batch_size": self.batch_size, "grad_accum": self.grad_accum}
        positive |= {"keep_checkpoints": self.keep_checkpoints, "log_every": self.log_every}
        for name, optional in (("max_steps", self.max_steps), ("epochs", self.epochs)):
            if optional is not None:
                positive[name] = optional
        if self.epochs is not None and self.epochs != int(self.epochs):
            raise ConfigError(f"--epochs {self.epochs}: give whole epochs, or --max-steps")
        self.epochs = None if self.epochs is None else int(self.epochs)
        if self.overwrite_output_dir and (self.resume or self.resume_from_checkpoint):
            raise ConfigError("--overwrite-output-dir starts over, --resume goes on: choose one")
        if self.budget_minutes is not None:
            positive["budget_minutes"] = self.budget_minutes
        for name, value in positive.items():
            if not value > 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be > 0, got {value}")
        non_negative = {
            "weight_decay": self.weight_decay,
            "warmup_steps": self.warmup_steps,
            "max_grad_norm": self.max_grad_norm,
            "muon_weight_decay": self.muon_weight_decay,
            "eval_every": self.eval_every,
            "eval_every_minutes": self.eval_every_minutes,
            "save_every": self.save_every,
            "skip_nonfinite": self.skip_nonfinite,
            "num_workers": self.num_workers or 0,
        }
        for name, value in non_negative.items():
            if value < 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 0, got {value}")
        unknown = set(self.report_to) - set(TRACKERS)
        if unknown or ("none" in self.report_to and len(self.report_to) > 1):
            raise ConfigError(
                f"--report-to {' '.join(self.report_to)}: give one or more of "
                f"{', '.join(TRACKERS[:-1])}, or none"
            )
        if self.compile_mode not in COMPILE_MODES:
            raise ConfigError(
                f"unknown --compile-mode {self.compile_mode!r}; use one of {COMPILE_MODES}"
            )
        self._check_optimizer()
        if not 0 < self.wsd_decay <= 1:
            raise ConfigError(f"--wsd-decay must be in (0, 1], got {self.wsd_decay}")
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
        if self.bf16 and self.fp16:
            raise ConfigError("--bf16 and --fp16 are two mixed precisions: choose one")
        if self.schedule == "inverse_sqrt" and not self.warmup_steps >= 1:
            raise ConfigError("--schedule inverse_sqrt needs --warmup-steps as a number of steps")

    def _check_optimizer(self) -> None:
        if self.optim not in OPTIMIZERS:
            raise ConfigError(f"unknown --optim {self.optim!r}; use one of {OPTIMIZERS}")
        if self.muon_lr is not None and not self.muon_lr > 0:
            raise ConfigError(f"--muon-lr must be > 0, got {self.muon_lr}")
        if not 0 <= self.muon_momentum < 1:
            raise ConfigError(f"--muon-momentum must be in [0, 1), got {self.muon_momentum}")

    def _check_batch_ramp(self) -> None:
        ramp = f"--batch-ramp-to {self.batch_ramp_to}"
        if self.batch_ramp_to <= self.batch_size or self.batch_ramp_to % self.batch_size:
            raise ConfigError(
                f"{ramp}: give a multiple of --batch-size {self.batch_size} larger than it"
            )
        if self.grad_accum != 1:
            raise ConfigError(f"{ramp} sets the accumulation itself: leave --grad-accum at 1")
        if self.auto_find_batch_size:
            raise ConfigError(f"{ramp} sets the accumulation itself: drop --auto-find-batch-size")

    @property
    def warmup_is_ratio(self) -> bool:
        return 0 < self.warmup_steps < 1


def merge_config_overrides(base: str | None, added: str | None) -> str | None:
    """`added`'s key=value pairs over `base`'s: a key in both takes `added`'s value, the others
    keep theirs (how --config-overrides adds to a recipe's)."""
    items = {}
    for overrides in (base, added):
        for item in filter(None, (overrides or "").split(",")):
            items[item.partition("=")[0].strip()] = item.strip()
    return ",".join(items.values()) or None


def available_presets(family: str) -> list[str]:
    """Preset names shipped for a model family (egbert/configs/<family>-<name>.yaml)."""
    folder = resources.files("egbert") / "configs"
    names = [entry.name for entry in folder.iterdir() if entry.name.endswith(".yaml")]
    prefix = f"{family}-"
    return sorted(name[len(prefix) : -len(".yaml")] for name in names if name.startswith(prefix))


def apply_config_overrides(config, overrides: str | None) -> None:
    """Set the model config fields that `overrides` names ("key=value,key=value", the format of
    `PretrainedConfig.update_from_string`), each cast to the type the field has."""
    if not overrides:
        return
    if any("=" not in item for item in overrides.split(",")):
        raise ConfigError(f"--config-overrides {overrides!r}: write key=value pairs, comma-split")
    try:
        config.update_from_string(overrides)
    except (TypeError, ValueError) as error:
        raise ConfigError(
            f"--config-overrides {overrides!r}: {error}; the {config.model_type} config's fields "
            "are in its config.json"
        ) from None
    try:  # update_from_string sets attributes one by one: rebuild the config so its checks run
        type(config).from_dict(config.to_dict())
    except ConfigError as error:
        raise ConfigError(f"--config-overrides {overrides!r}: {error}") from None


# egbert pretrain, egbert finetune, and quickstart's fine-tunes and probes. (egbert probe's and
# prompt-eval's defaults, the same for every family, are those of run_probe and run_prompt_eval.)
RECIPE_STAGES = ("pretrain", "finetune")
RECIPE_STAGES += ("quickstart-pretrain", "quickstart-finetune", "quickstart-probe")


class RecipeValues(dict):
    """A recipe's option values (option name -> value), and where each was written: `origins`
    (option name -> "egbert/configs/recipes/bert.yaml [pretrain]"), which --print-config names."""

    def __init__(self, values: dict[str, Any] | None = None, origins: dict[str, str] | None = None):
        super().__init__(values or {})
        self.origins = dict(origins or {})


def load_recipe(family: str | None, stage: str) -> RecipeValues:
    """The defaults of `family` (None: any family) for `stage`: egbert/configs/recipes/common.yaml's
    section of that stage with the family's file's over it, as option names -> values."""
    if stage not in RECIPE_STAGES:
        raise ConfigError(f"unknown recipe stage {stage!r}; use one of {RECIPE_STAGES}")
    if family is not None and family not in MODEL_FAMILIES:
        raise ConfigError(f"unknown model family {family!r}; use one of {MODEL_FAMILIES}")
    recipe = RecipeValues()
    for name in ("common", family):
        if name is not None:
            resource = resources.files("egbert") / "configs" / "recipes" / f"{name}.yaml"
            sections = yaml.safe_load(resource.read_text(encoding="utf-8")) or {}
            section = sections.get(stage) or {}
            recipe |= section
            recipe.origins |= dict.fromkeys(
                section, f"egbert/configs/recipes/{name}.yaml [{stage}]"
            )
    return recipe


def pretraining_recipe(options: dict[str, Any]) -> RecipeValues:
    """The pretraining defaults of the family in options["model"], else of the model folder in
    options["init_from"], whose family is then the model's (none without a known family)."""
    family = options.get("model") or model_family(options.get("init_from"))
    if family not in MODEL_FAMILIES:
        return RecipeValues()
    recipe = load_recipe(family, "pretrain")
    if options.get("init_from"):  # a model from --init-from keeps its own config
        recipe.pop("config_overrides", None)
    if not options.get("model"):
        recipe["model"], recipe.origins["model"] = family, "--init-from's config.json"
    return recipe


def model_family(model_dir: str | None) -> str | None:
    """bert, gpt or elmo: the family of a model directory's config.json; None where there is
    none to read (a Hub id, a mistyped path: loading the model says what is wrong)."""
    if model_dir is None:
        return None
    try:
        config = read_model_config(model_dir)
    except (CheckpointError, ConfigError, OSError):
        return None
    return FAMILY_OF_MODEL_TYPE.get(config.get("model_type"))


def load_preset(family: str, preset_or_path: str) -> dict[str, Any]:
    """The model config kwargs of a preset name (`tiny`, `mini`, ...) or of a YAML/JSON file."""
    if family not in MODEL_FAMILIES:
        raise ConfigError(f"unknown model family {family!r}; use one of {MODEL_FAMILIES}")
    path = Path(preset_or_path)
    if path.suffix in (".yaml", ".yml", ".json") or path.is_file():
        return read_config_file(path)
    resource = resources.files("egbert") / "configs" / f"{family}-{preset_or_path}.yaml"
    if not resource.is_file():
        known = ", ".join(available_presets(family)) or "none"
        raise ConfigError(
            f"unknown {family} preset {preset_or_path!r}; use one of {known} or a YAML file"
        )
    values = yaml.safe_load(resource.read_text(encoding="utf-8")) or {}
    return {str(key): value for key, value in values.items()}
