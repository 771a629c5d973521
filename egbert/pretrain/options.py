"""The options of `egbert pretrain` and `egbert prepare`, by concern, as transformers' run_mlm.py
(ModelArguments, DataTrainingArguments) and cramming (cfg.arch, cfg.data) split theirs: the
model's (`ModelArguments`: which family, its size, the model it starts from), the data's
(`DataArguments`: the tokenizer, the sources, how documents become examples) and the objective's
(`ObjectiveArguments`: what bert learns to predict). The trainer's are `TrainingArguments`
(egbert.config). PRETRAIN_ARGUMENTS and PREPARE_ARGUMENTS are each command's parts. Each helper
takes the parts it reads; `check_pretraining_options` checks the options that depend on one
another across parts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from egbert.config import MODEL_FAMILIES, TrainingArguments, merge_config_overrides
from egbert.errors import ConfigError
from egbert.sources import DOC_BOUNDARIES, ENCODING_ERRORS_HELP

BERT_OBJECTIVES = ("mlm", "rtd")


@dataclass
class ModelArguments:
    """Which model to pretrain: its family and size, or the saved model it starts from."""

    _argument_group_name = "model"
    _aliases = {"init_from": ["--model-name-or-path"]}  # run_mlm.py's name

    model: str = field(
        metadata={
            "help": "model family to pretrain (with --init-from: the model's)",
            "choices": list(MODEL_FAMILIES),
        }
    )
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
            "does: 'pre_layernorm=true,hidden_dropout_prob=0' (a fresh model only); added to "
            "the recipe's: a key given replaces that key only",
            "merge": merge_config_overrides,
        },
    )
    allow_pickle: bool = field(
        default=False,
        metadata={
            "help": "with --init-from: also load a pickle checkpoint (pytorch_model.bin, *.pt), "
            "with torch.load(weights_only=True); only for files you trust"
        },
    )
    license: str = field(default="apache-2.0", metadata={"help": "the model card's license"})

    def __post_init__(self) -> None:
        if self.model not in MODEL_FAMILIES:
            raise ConfigError(f"unknown --model {self.model!r}; use one of {MODEL_FAMILIES}")
        if self.config_overrides and self.init_from:
            raise ConfigError(
                "--config-overrides changes a fresh model's config; a model from --init-from "
                "keeps its own (edit its config.json, or drop one of the two options)"
            )


@dataclass
class DataArguments:
    """What to pretrain on: the tokenizer, the sources, and how their documents become examples
    of --seq-len tokens."""

    _argument_group_name = "data"
    _aliases = {  # run_mlm.py's and run_clm.py's names
        "seq_len": ["--block-size", "--max-seq-length"],
        "num_proc": ["--preprocessing-num-workers"],
    }

    tokenizer: str | None = field(
        default=None,
        metadata={
            "help": "tokenizer directory (egbert tokenizer train); with --data: its own; with "
            "--init-from: the model folder's"
        },
    )
    data: str | None = field(
        default=None,
        metadata={
            "help": "train from a folder of `egbert prepare` (tokenized once) instead of "
            "--train-files/--validation-files"
        },
    )
    train_files: list[str] = field(
        default_factory=list,
        metadata={
            "help": "training files, read by extension: text (.txt, .tokens, ...; also .gz .bz2 "
            ".xz .zst), .jsonl/.json/.csv/.parquet (one row a document), or a data set folder "
            "(save_to_disk, or files load_dataset reads)"
        },
    )
    dataset: str | None = field(
        default=None,
        metadata={
            "help": "a Hub data set to train on (e.g. Salesforce/wikitext), or its local copy: a "
            "folder of its files or a save_to_disk folder"
        },
    )
    dataset_config: str | None = field(
        default=None, metadata={"help": "--dataset's configuration (e.g. wikitext-103-raw-v1)"}
    )
    split: str = field(default="train", metadata={"help": "--dataset's split to train on"})
    text_column: str | None = field(
        default=None,
        metadata={
            "help": "the column of the text in tables and data sets (default: the only string "
            "column, else one named text, content or document)"
        },
    )
    source_weights: list[float] = field(
        default_factory=list,
        metadata={
            "help": "mix the sources (each of --train-files, then --dataset) with these weights, "
            "one per source (datasets.interleave_datasets; smaller sources repeat until every "
            "one is read through); without: one after the other"
        },
    )
    validation_files: list[str] = field(
        default_factory=list,
        metadata={"help": "files for evaluation (the same kinds as --train-files)"},
    )
    validation_split: str | None = field(
        default=None, metadata={"help": "evaluate on this split of --dataset (e.g. validation)"}
    )
    validation_split_percentage: float | None = field(
        default=None,
        metadata={
            "help": "hold out this percentage of the training documents for evaluation, "
            "chosen by a hash of each document's text (run_mlm.py's name for it)"
        },
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "train on the first N training examples only"}
    )
    max_eval_samples: int | None = field(
        default=None,
        metadata={"help": "evaluate on the first N examples of the validation files only"},
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
        metadata={"help": ENCODING_ERRORS_HELP},
    )
    seq_len: int = field(default=128, metadata={"help": "tokens per example"})
    streaming: bool = field(
        default=False,
        metadata={
            "help": "stream the corpus instead of caching it in Arrow (needs --max-steps or "
            "--budget-minutes; each process reads its own shards)"
        },
    )
    shuffle_buffer: int | None = field(
        default=None,
        metadata={
            "help": "with --streaming: shuffle examples in a buffer of this many (default: in "
            "order); a resume starts with an empty buffer"
        },
    )
    num_proc: int | None = field(default=None, metadata={"help": "processes for tokenization"})
    card_datasets: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Hub ids of the training corpora for the model card's metadata (e.g. "
            "Salesforce/wikitext); the Hub refuses local paths there"
        },
    )

    def __post_init__(self) -> None:
        if self.seq_len < 8:
            raise ConfigError(f"--seq-len must be at least 8, got {self.seq_len}")
        for name in ("max_train_samples", "max_eval_samples"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(
                    f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}"
                )
        held_out = [
            name
            for name, given in (
                ("--validation-files", bool(self.validation_files)),
                ("--validation-split", self.validation_split is not None),
                ("--validation-split-percentage", self.validation_split_percentage is not None),
            )
            if given
        ]
        if len(held_out) > 1:
            raise ConfigError(f"{' and '.join(held_out)}: choose one source of validation data")
        if self.validation_split is not None and not self.dataset:
            raise ConfigError("--validation-split names a split of --dataset; pass --dataset too")
        self._check_streaming_options()

    def _check_streaming_options(self) -> None:
        if self.shuffle_buffer is not None and (not self.streaming or self.shuffle_buffer < 1):
            raise ConfigError(
                "--shuffle-buffer N (N >= 1) shuffles a stream: use it with --streaming (a "
                "cached data set is shuffled by the sampler)"
            )
        if self.streaming and self.num_proc is not None:
            raise ConfigError(
                "--num-proc tokenizes a cached data set in parallel; a stream is tokenized as "
                "it is read, by each training process: drop --num-proc (or launch more processes)"
            )


@dataclass
class ObjectiveArguments:
    """What the model learns to predict: bert's objective, its sentence pairs and its masks
    (gpt and elmo predict the next and the previous tokens, with no options)."""

    _argument_group_name = "objective"

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
    nsp: bool = field(default=True, metadata={"help": "bert: next-sentence prediction pairs"})
    mlm_probability: float = field(default=0.15, metadata={"help": "bert: share of masked tokens"})
    whole_word_mask: bool = field(default=False, metadata={"help": "bert: mask whole words"})
    dupe_factor: int = field(
        default=1,
        metadata={
            "help": "bert: N > 1 makes N copies of the examples (with NSP: N different pairings), "
            "each masked once, differently, as BERT's original data (default 1: dynamic masks, "
            "new each epoch); gpt and elmo refuse it"
        },
    )
    short_seq_prob: float = field(
        default=0.1, metadata={"help": "bert: share of shorter-than-seq-len pairs"}
    )

    def __post_init__(self) -> None:
        if self.objective not in BERT_OBJECTIVES:
            raise ConfigError(
                f"unknown --objective {self.objective!r}; use one of {BERT_OBJECTIVES}"
            )
        if self.objective == "rtd" and self.nsp:
            raise ConfigError(RTD_NEEDS)
        if not 0 < self.mlm_probability < 1:
            raise ConfigError(f"--mlm-probability must be in (0, 1), got {self.mlm_probability}")
        if self.dupe_factor < 1:
            raise ConfigError(f"--dupe-factor must be >= 1, got {self.dupe_factor}")
        if not 0 <= self.short_seq_prob <= 1:
            raise ConfigError(f"--short-seq-prob must be in [0, 1], got {self.short_seq_prob}")


@dataclass
class PrepareArguments:
    """Where `egbert prepare` writes its folder (what it prepares: egbert.pretrain.options)."""

    _argument_group_name = "prepared folder"

    output_dir: str = field(
        metadata={"help": "the folder to write (if it exists: prepared with the same options)"}
    )
    seed: int = field(
        default=TrainingArguments.seed,
        metadata={"help": "bert: the seed of the sentence pairs and static masks"},
    )
    verify: bool = field(
        default=False,
        metadata={"help": "check the folder in --output-dir (every file's sha256) and exit"},
    )


# The parts both commands read, in their order; each adds its own last.
PRETRAINING_PARTS = (ModelArguments, DataArguments, ObjectiveArguments)
CommandPart = TypeVar("CommandPart")
# The parsed options of such a command: PRETRAINING_PARTS' instances, then its own part's.
PretrainingOptions = tuple[ModelArguments, DataArguments, ObjectiveArguments, CommandPart]
# `egbert pretrain`'s: then the trainer's.
PRETRAIN_ARGUMENTS = (*PRETRAINING_PARTS, TrainingArguments)
PretrainOptions = PretrainingOptions[TrainingArguments]
# `egbert prepare`'s: pretrain's but the trainer's, then where it writes.
PREPARE_ARGUMENTS = (*PRETRAINING_PARTS, PrepareArguments)
PrepareOptions = PretrainingOptions[PrepareArguments]


RTD_NEEDS = (
    "--objective rtd pretrains a bert encoder without next-sentence prediction; "
    "use it with --model bert --nsp false"
)


def check_pretraining_options(
    model: ModelArguments, data: DataArguments, objective: ObjectiveArguments, *_: object
) -> None:
    """Refuse the options that each part accepts alone but not together (the job's other parts,
    the trainer's or prepare's, take no part: `egbert.arguments.Check`)."""
    if objective.objective == "rtd" and model.model != "bert":
        raise ConfigError(RTD_NEEDS)
    if objective.dupe_factor > 1 and model.model != "bert":
        raise ConfigError(
            f"--dupe-factor {objective.dupe_factor}: static-masked copies are for bert's masked "
            f"LM; {model.model} reads each block once an epoch, so drop the option"
        )
    if data.streaming and objective.dupe_factor > 1:
        raise ConfigError(
            "--dupe-factor makes static-masked copies of a cached data set; a stream is "
            "masked anew at each step: drop --dupe-factor or --streaming"
        )


def example_options(
    family: str, objective_args: ObjectiveArguments, seed: int | None = None
) -> dict[str, Any]:
    """The objective's options bert's examples depend on besides the corpus, the tokenizer, the
    family and the sequence length (those that do not apply left out; what a prepared folder
    records); with `seed` where the pairs or static masks are drawn with it. gpt and elmo have
    none."""
    if family != "bert":
        return {}
    options = asdict(objective_args)
    del options["objective"]  # the model's heads: the same examples
    if not objective_args.nsp:
        del options["short_seq_prob"]
    if objective_args.dupe_factor == 1:  # masks are then drawn per step, by the run
        del options["mlm_probability"], options["whole_word_mask"]
    if seed is not None and (objective_args.nsp or objective_args.dupe_factor > 1):
        options["seed"] = seed
    return options
