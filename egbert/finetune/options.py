"""The options of `egbert finetune` that are fine-tuning's own: what to fine-tune and on which
task (`FinetuneArguments`; the trainer's are egbert.config.TrainingArguments)."""

from __future__ import annotations

from dataclasses import dataclass, field

from egbert.config import merge_config_overrides
from egbert.errors import ConfigError
from egbert.models.heads import CLASSIFIER_FEATURES, CLASSIFIER_POOLS


@dataclass
class FinetuneArguments:
    """What to fine-tune and on which task (the trainer's options are `TrainingArguments`)."""

    _argument_group_name = "task, data and model"
    _aliases = {"model": ["--model-name-or-path"]}  # run_glue.py's name

    model: str = field(
        metadata={
            "help": "an egbert model (or pretraining run) directory (bert, gpt or elmo), or a "
            "stock transformers BERT/GPT-2 checkpoint (converted on the fly), with its tokenizer"
        }
    )
    task: str | None = field(
        default=None,
        metadata={
            "help": "a GLUE task (cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli) or all "
            "(every task whose train and dev files are in --data-dir); not with --train-file"
        },
    )
    data_dir: str | None = field(
        default=None,
        metadata={
            "help": "the GLUE folder (CoLA/train.tsv, RTE/dev.tsv, ...); without it the data "
            "comes from the hub's nyu-mll/glue, which needs the network"
        },
    )
    train_file: str | None = field(
        default=None, metadata={"help": "custom task: CSV, TSV or JSONL with a header"}
    )
    validation_file: str | None = field(default=None, metadata={"help": "custom task: dev file"})
    test_file: str | None = field(
        default=None, metadata={"help": "custom task: a file to predict (optional)"}
    )
    text_columns: list[str] = field(
        default_factory=list, metadata={"help": "custom task: one or two text columns"}
    )
    label_column: str = field(default="label", metadata={"help": "custom task: the label column"})
    regression: bool = field(
        default=False, metadata={"help": "custom task: labels are scores, not classes"}
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "train on the first N training examples only"}
    )
    max_seq_length: int | None = field(
        default=None,
        metadata={
            "help": "tokens per example, longer ones truncated (default: 128, or the model's "
            "max_position_embeddings if smaller)"
        },
    )
    features: str = field(
        default="cls",
        metadata={
            "help": "what the classifier reads: the model's summary vector ([CLS] pooler for "
            "bert), the last 4 layers concatenated or summed, or a learned scalar mix of all "
            "layers",
            "choices": list(CLASSIFIER_FEATURES),
        },
    )
    pool: str = field(
        default="cls",
        metadata={
            "help": "how layer features become one vector, with --features last4-*/scalar-mix: "
            "the summary position or the mean over tokens",
            "choices": list(CLASSIFIER_POOLS),
        },
    )
    layer_norm: bool = field(
        default=False,
        metadata={
            "help": "normalize each pooled layer before the layers are combined (ELMo's option "
            "for layers of very different scales)"
        },
    )
    freeze: bool = field(
        default=False, metadata={"help": "feature-based: train only the classifier head"}
    )
    config_overrides: str | None = field(
        default=None,
        metadata={
            "help": "change fields of the model's config for fine-tuning, e.g. "
            "'hidden_dropout_prob=0.1' (the format of run_mlm.py's --config_overrides); added "
            "to the recipe's: a key given replaces that key only",
            "merge": merge_config_overrides,
        },
    )
    allow_pickle: bool = field(
        default=False,
        metadata={
            "help": "also load a pickle checkpoint (pytorch_model.bin, *.pt) when the model "
            "directory has no safetensors weights, with torch.load(weights_only=True)"
        },
    )
    predict: bool = field(
        default=True,
        metadata={"help": "write GLUE submission files for the test sets (--no-predict: skip)"},
    )
    base_model_id: str | None = field(
        default=None,
        metadata={"help": "the Hub id of --model, for the model card's base_model metadata"},
    )
    license: str = field(default="apache-2.0", metadata={"help": "the model card's license"})

    def __post_init__(self) -> None:
        if self.features not in CLASSIFIER_FEATURES:
            raise ConfigError(
                f"unknown --features {self.features!r}; use one of {CLASSIFIER_FEATURES}"
            )
        if self.pool not in CLASSIFIER_POOLS:
            raise ConfigError(f"unknown --pool {self.pool!r}; use one of {CLASSIFIER_POOLS}")
        if self.pool == "mean" and self.features == "cls":
            raise ConfigError(
                "--pool mean pools layer features: use it with --features last4-concat, "
                "last4-sum or scalar-mix (--features cls is the model's own summary vector)"
            )
        if self.max_seq_length is not None and self.max_seq_length < 8:
            raise ConfigError(f"--max-seq-length must be >= 8, got {self.max_seq_length}")
        if self.max_train_samples is not None and self.max_train_samples < 1:
            raise ConfigError(f"--max-train-samples must be >= 1, got {self.max_train_samples}")
