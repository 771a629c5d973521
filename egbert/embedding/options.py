"""The options of embedding: how `embed` turns texts into vectors (`EmbedOptions`), how it
loads the model (`EmbedLoading`), and `egbert embed`'s files (`EmbedFiles`); every default and
its check in one place (`egbert.embed(...)` and `egbert embed` alike)."""

from __future__ import annotations

from dataclasses import dataclass, field

from egbert.errors import ConfigError
from egbert.model_files import ALLOW_PICKLE_HELP
from egbert.models.heads import LAST_LAYERS

# How layers join (egbert.models.heads.LAST4_FEATURES and the probe's --features name theirs by
# these) and how a layer's tokens become one vector. These pools are positions: "cls" is the
# first token, "last" the last real one; the heads' and the probe's "cls", a family's summary
# position, is built from them (egbert.evaluation.probe.SUMMARY_POOLS).
COMBINES = ("concat", "sum", "mean", "scalar-mix", "none")
POOLS = ("none", "cls", "mean", "last")


def parse_layers(text: str) -> tuple[int, ...]:
    """--layers' comma-separated indices ("-1,-2")."""
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError as error:
        raise ConfigError(
            f"--layers {text!r}: give comma-separated integers such as -1,-2,-3,-4"
        ) from error


@dataclass(frozen=True)
class EmbedFiles:
    """What `egbert embed` reads and writes (`embed` takes texts and an output)."""

    _argument_group_name = None  # among the parser's own options

    model: str = field(metadata={"help": "model directory (with its tokenizer)"})
    input: str = field(
        metadata={
            "help": '.jsonl (one object per line) or text, one input per line ("a ||| b" for a '
            "pair); - reads text lines from stdin"
        }
    )
    output: str = field(
        metadata={
            "help": ".npy or .safetensors (pooled vectors, one row per input) or .jsonl (one "
            "record per input: a pooled vector, or tokens, offsets and vectors with --pool none); "
            "- writes JSONL to stdout (progress and messages go to stderr)"
        }
    )


@dataclass(frozen=True)
class EmbedOptions:
    """The options of `embed` (and of `egbert embed`, whose option names are these) that say
    how texts become vectors: see `embed` for what each does. Checked when built."""

    _argument_group_name = None  # among the parser's own options

    layers: tuple[int, ...] | None = field(  # None: the last min(4, depth) (last_layers)
        default=None,
        metadata={
            "help": "comma-separated layer indices: -1 last layer, 0 embeddings (default: the "
            "last 4, -1,-2,-3,-4, or all of a model with fewer)",
            "parse": parse_layers,
            "show": lambda layers: ",".join(map(str, layers)),
        },
    )
    combine: str = field(
        default="concat",
        metadata={
            "help": "per token: concat (in --layers order), sum, mean, scalar-mix (untrained: "
            "equal weights, gamma 1) or none (one layer)",
            "choices": COMBINES,
        },
    )
    pool: str = field(
        default="mean",
        metadata={
            "help": "cls: first token, mean: average of the real tokens, last: last real token, "
            "none: per-token vectors, .jsonl only",
            "choices": POOLS,
        },
    )
    batch_size: int = field(default=64, metadata={"help": "inputs per forward pass"})
    max_length: int | None = field(
        default=None, metadata={"help": "truncate to N tokens (default: model maximum)"}
    )
    normalize: bool = field(default=False, metadata={"help": "unit-length vectors"})
    word_level: bool = field(
        default=False, metadata={"help": "average word pieces per word (--pool none)"}
    )
    stride: int | None = field(
        default=None,
        metadata={
            "help": "embed long texts in windows overlapping by N tokens instead of truncating them"
        },
    )

    def __post_init__(self) -> None:
        if self.combine not in COMBINES:
            raise ConfigError(f"combine={self.combine!r} is not one of {', '.join(COMBINES)}")
        if self.pool not in POOLS:
            raise ConfigError(f"pool={self.pool!r} is not one of {', '.join(POOLS)}")
        if self.layers is not None and not self.layers:
            raise ConfigError("layers is empty; pick at least one layer, for example -1")
        if self.combine == "none" and (self.layers is None or len(self.layers) != 1):
            given = "the default, the last 4" if self.layers is None else len(self.layers)
            raise ConfigError(
                f"combine='none' takes exactly one layer, got {given}; "
                "pass one layer or choose concat, sum, mean or scalar-mix"
            )
        if self.word_level and self.pool != "none":
            raise ConfigError("word_level=True gives per-word vectors: it needs pool='none'")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size={self.batch_size} must be at least 1")
        if self.max_length is not None and self.max_length < 1:
            raise ConfigError(f"max_length={self.max_length} must be at least 1")


def last_layers(depth: int, count: int = LAST_LAYERS) -> tuple[int, ...]:
    """The default layers: the last `count` of a model of `depth` layers, or all of a
    shallower one (-1 the last; BERT's feature-based recipe concatenates its last four)."""
    return tuple(range(-1, -min(count, depth) - 1, -1))


@dataclass(frozen=True)
class EmbedLoading:
    """How `egbert embed` reads its input file, and how `embed` loads and runs the model."""

    _argument_group_name = None  # among the parser's own options

    text_field: str = field(default="text", metadata={"help": "text field of .jsonl input"})
    pair_field: str | None = field(
        default=None, metadata={"help": "second text field of .jsonl input, for pairs"}
    )
    encoding: str = field(default="utf-8", metadata={"help": "input file encoding"})
    device: str | None = field(
        default=None, metadata={"help": "cpu, cuda, ... (default: cuda when available)"}
    )
    bf16: bool = field(default=False, metadata={"help": "bf16 autocast (vectors stay float32)"})
    fp16: bool = field(
        default=False,
        metadata={"help": "fp16 autocast, for GPUs without bf16 (T4, V100); instead of --bf16"},
    )
    allow_pickle: bool = field(default=False, metadata={"help": ALLOW_PICKLE_HELP})


# `egbert embed`'s options, in the order of its --help
EMBED_ARGUMENTS = (EmbedFiles, EmbedOptions, EmbedLoading)
