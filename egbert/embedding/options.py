"""How `embed` turns texts into vectors: every option's default and its check, in one place
(`egbert.embed(...)` and `egbert embed` alike)."""

from __future__ import annotations

from dataclasses import dataclass

from egbert.errors import ConfigError

COMBINES = ("concat", "sum", "mean", "scalar-mix", "none")
POOLS = ("none", "cls", "mean", "last")


@dataclass(frozen=True)
class EmbedOptions:
    """The options of `embed` (and of `egbert embed`, whose option names are these): see
    `embed` for what each does. Checked when built."""

    layers: tuple[int, ...] = (-1, -2, -3, -4)
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
        if not self.layers:
            raise ConfigError("layers is empty; pick at least one layer, for example -1")
        if self.combine == "none" and len(self.layers) != 1:
            raise ConfigError(
                f"combine='none' takes exactly one layer, got {len(self.layers)}; "
                "pass one layer or choose concat, sum, mean or scalar-mix"
            )
        if self.word_level and self.pool != "none":
            raise ConfigError("word_level=True gives per-word vectors: it needs pool='none'")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size={self.batch_size} must be at least 1")
        if self.max_length is not None and self.max_length < 1:
            raise ConfigError(f"max_length={self.max_length} must be at least 1")
