"""How `embed` turns texts into vectors: every option's default and its check, in one place
(`egbert.embed(...)` and `egbert embed` alike)."""

from __future__ import annotations

from dataclasses import dataclass

from egbert.errors import ConfigError
from egbert.models.heads import LAST_LAYERS

# How layers join (egbert.models.heads.LAST4_FEATURES and the probe's --features name theirs by
# these) and how a layer's tokens become one vector. These pools are positions: "cls" is the
# first token, "last" the last real one; the heads' and the probe's "cls", a family's summary
# position, is built from them (egbert.evaluation.probe.SUMMARY_POOLS).
COMBINES = ("concat", "sum", "mean", "scalar-mix", "none")
POOLS = ("none", "cls", "mean", "last")


@dataclass(frozen=True)
class EmbedOptions:
    """The options of `embed` (and of `egbert embed`, whose option names are these): see
    `embed` for what each does. Checked when built."""

    layers: tuple[int, ...] | None = None  # None: the last min(4, depth) layers (last_layers)
    combine: str = "concat"
    pool: str = "mean"
    batch_size: int = 64
    max_length: int | None = None
    normalize: bool = False
    word_level: bool = False
    stride: int | None = None

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
