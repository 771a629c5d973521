"""Run configurations: dataclasses whose fields are the command-line options of a job.

Every field is an option (`--seq-len 128`, or `--seq_len 128`), and any of them can come from a
YAML or JSON file instead (`--config run.yaml`, a flat mapping of field names); options given on
the command line override the file. Model sizes live in presets: `load_preset`.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from transformers import HfArgumentParser

from egbert.errors import ConfigError

MODEL_FAMILIES = ("bert", "gpt", "elmo")
BERT_OBJECTIVES = ("mlm", "rtd")
DOC_BOUNDARIES = ("blank", "wikitext", "line", "file")


@dataclass
class PretrainArguments:
    """What to pretrain and on which data (the trainer's options are `TrainingArguments`)."""

    model: str = field(
        metadata={"help": "model family to pretrain", "choices": list(MODEL_FAMILIES)}
    )
    tokenizer: str = field(metadata={"help": "tokenizer directory (egbert tokenizer train)"})
    train_files: list[str] = field(metadata={"help": "plain-text training files"})
    preset: str = field(
        default="tiny",
        metadata={
            "help": "model size: tiny | mini | small | base, or a YAML file of config kwargs"
        },
    )
    init_from: str | None = field(
        default=None,
        metadata={"help": "start from this saved model directory instead of random weights"},
    )
    config_overrides: str | None = field(
        default=None,
        metadata={
            "help": "change fields of the preset's model config, as transformers' run_mlm.py "
            "does: 'pre_layernorm=true,hidden_dropout_prob=0' (a fresh model only)"
        },
    )
    allow_pickle: bool = field(
        default=False,
        metadata={
            "help": "with --init-from: also load a pickle checkpoint (pytorch_model.bin, *.pt), "
            "with torch.load(weights_only=True); only for files you trust"
        },
    )
    validation_files: list[str] = field(
        default_factory=list, metadata={"help": "plain-text files for evaluation"}
    )
    doc_boundary: str = field(
        default="blank",
        metadata={
            "help": "what separates documents: blank lines, WikiText ' = Title = ' lines, "
            "each line, or each file",
            "choices": list(DOC_BOUNDARIES),
        },
    )
    encoding: str = field(default="utf-8", metadata={"help": "text encoding of the files"})
    encoding_errors: str = field(
        default="strict",
        metadata={"help": "on undecodable bytes: strict (stop and say where) | replace | ignore"},
    )
    seq_len: int = field(default=128, metadata={"help": "tokens per example"})
    nsp: bool = field(default=True, metadata={"help": "bert: next-sentence prediction pairs"})
    objective: str = field(
        default="mlm",
        metadata={
            "help": "bert: mlm (masked LM, BERT) or rtd (replaced token detection, ELECTRA: a "
            "small generator fills the masks and the encoder learns which tokens it replaced; "
            "the generator's size and loss weight are the model config's generator_size_ratio "
            "and rtd_loss_weight; needs --nsp false)",
            "choices": list(BERT_OBJECTIVES),
        },
    )
    mlm_probability: float = field(default=0.15, metadata={"help": "bert: share of masked tokens"})
    whole_word_mask: bool = field(default=False, metadata={"help": "bert: mask whole words"})
    dupe_factor: int = field(
        default=1,
        metadata={"help": "bert: > 1 makes that many static-masked copies (default: dynamic)"},
    )
    short_seq_prob: float = field(
        default=0.1, metadata={"help": "bert: share of shorter-than-seq-len pairs"}
    )
    streaming: bool = field(
        default=False, metadata={"help": "stream the corpus instead of caching it in Arrow"}
    )
    num_proc: int | None = field(default=None, metadata={"help": "processes for tokenization"})

    def __post_init__(self) -> None:
        if self.model not in MODEL_FAMILIES:
            raise ConfigError(f"unknown --model {self.model!r}; use one of {MODEL_FAMILIES}")
        if self.objective not in BERT_OBJECTIVES:
            raise ConfigError(
                f"unknown --objective {self.objective!r}; use one of {BERT_OBJECTIVES}"
            )
        if self.objective == "rtd" and (self.model != "bert" or self.nsp):
            raise ConfigError(
                "--objective rtd pretrains a bert encoder without next-sentence prediction; "
                "use it with --model bert --nsp false"
            )
        if self.seq_len < 8:
            raise ConfigError(f"--seq-len must be at least 8, got {self.seq_len}")
        if not 0 < self.mlm_probability < 1:
            raise ConfigError(f"--mlm-probability must be in (0, 1), got {self.mlm_probability}")
        if self.dupe_factor < 1:
            raise ConfigError(f"--dupe-factor must be >= 1, got {self.dupe_factor}")
        if not 0 <= self.short_seq_prob <= 1:
            raise ConfigError(f"--short-seq-prob must be in [0, 1], got {self.short_seq_prob}")
        if self.config_overrides and self.init_from:
            raise ConfigError(
                "--config-overrides changes a fresh model's config; a model from --init-from "
                "keeps its own (edit its config.json, or drop one of the two options)"
            )


def parse_args(
    dataclass_types: tuple[type, ...],
    argv: list[str] | None,
    prog: str,
    description: str,
    defaults: dict[str, Any] | None = None,
) -> tuple[Any, ...]:
    """Parse `argv` into instances of `dataclass_types`. Each option's value comes from the
    command line, else from `--config FILE`, else from `defaults`, else from its dataclass."""
    parser = HfArgumentParser(dataclass_types, prog=prog, description=description)
    parser.set_defaults(**(defaults or {}))
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="YAML or JSON file of options (field names); the command line overrides it",
    )
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    if known.config:
        _apply_config_file(parser, Path(known.config))
    parsed = parser.parse_args_into_dataclasses(args=argv)
    return tuple(parsed[: len(dataclass_types)])


def read_config_file(path: Path) -> dict[str, Any]:
    """A flat mapping of option names to values from a .yaml/.yml/.json file."""
    if not path.is_file():
        raise ConfigError(f"config file {path} not found")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"config file {path} is not a UTF-8 text file (byte {error.start}); pass a YAML or "
            "JSON file"
        ) from None
    try:
        values = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as error:
        first_line = str(error).splitlines()[0]
        raise ConfigError(f"config file {path} is not valid YAML/JSON: {first_line}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError(f"config file {path} must be a mapping of option names to values")
    return {str(key).replace("-", "_"): value for key, value in values.items()}


def _apply_config_file(parser: argparse.ArgumentParser, path: Path) -> None:
    """Make the file's values the parser's defaults, converted as if typed on the command line
    (YAML reads `1e-3` as a string), so that options on the command line still win."""
    actions = {action.dest: action for action in parser._actions if action.dest != "help"}
    values = read_config_file(path)
    unknown = sorted(set(values) - set(actions) - {"config"})
    if unknown:
        raise ConfigError(f"config file {path}: unknown option(s) {', '.join(unknown)}")
    defaults = {}
    for name, value in values.items():
        if name == "config":
            continue
        action = actions[name]
        defaults[name] = _convert(action, value, path)
        action.required = False
    parser.set_defaults(**defaults)


def _convert(action: argparse.Action, value: Any, path: Path) -> Any:
    if isinstance(value, list):
        return [_convert(action, item, path) for item in value]
    if isinstance(value, str) and action.type is not None:
        try:
            value = action.type(value)
        except (ValueError, TypeError, argparse.ArgumentTypeError):
            raise ConfigError(
                f"config file {path}: bad value {value!r} for {action.dest}"
            ) from None
    if action.choices is not None and value is not None and value not in action.choices:
        raise ConfigError(
            f"config file {path}: {action.dest} must be one of {list(action.choices)}, "
            f"got {value!r}"
        )
    return value


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
