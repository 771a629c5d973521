"""Per-step masking and batching: what the trainer's loader calls on each list of examples.

Masks are drawn per example from a generator seeded by (seed, epoch, the example's ids), never
from the global RNG: the loader runs a batch ahead, and a resumed run must draw the same masks.

    mask_tokens_for_mlm(input_ids, *, special_ids, mask_id, vocab_size, rng,
                        mlm_probability=0.15, max_predictions=None, word_continuation=None)
        -> (masked input_ids, labels) as torch.LongTensors.
    wordpiece_continuations(tokenizer) -> bool array over the vocabulary ("##" pieces).
    MLMCollator(tokenizer, mlm_probability=0.15, max_predictions=None, whole_word_mask=False,
                seed=0): pads (right), adds attention_mask where a row is padded, masks
                dynamically unless the examples carry static "labels"; call set_epoch(epoch)
                every epoch.
    CausalLMCollator(tokenizer): pads, attention_mask where a row is padded, labels =
                input_ids (-100 on padding).
    padding_mask(rows) -> {"attention_mask": ...} when the rows differ in length, else {}.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence, Sized

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from egbert.errors import ConfigError

# ---------------------------------------------------------------- masking


def mask_tokens_for_mlm(
    input_ids: torch.Tensor | np.ndarray | Sequence,
    *,
    special_ids: Iterable[int],
    mask_id: int,
    vocab_size: int,
    rng: np.random.Generator,
    mlm_probability: float = 0.15,
    max_predictions: int | None = None,
    word_continuation: np.ndarray | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masking of one sequence or a (batch, seq) batch; returns (input_ids, labels).

    In each sequence exactly `min(max_predictions, max(1, round(mlm_probability * n)))`
    positions are chosen, n counting the tokens that are not special (specials, padding
    included, are never chosen); `max_predictions=None` means no cap (BERT used 20 at length
    128 and 80 at 512). Of the chosen tokens 80% become `mask_id`, 10% a random non-special
    token, 10% stay. Labels hold the original id at chosen positions, -100 elsewhere.
    With `word_continuation` (a bool per vocabulary id, True for WordPiece "##" pieces; see
    `wordpiece_continuations`) whole words are chosen together, and the count is at most the
    number above, since a word is never split.
    """
    _check_probability(mlm_probability)
    ids = np.array(input_ids, dtype=np.int64)  # a copy: the caller's ids stay as they were
    labels = _mask_in_place(
        ids,
        special_table(special_ids, vocab_size),
        mask_id=mask_id,
        rng=rng,
        mlm_probability=mlm_probability,
        max_predictions=max_predictions,
        word_continuation=word_continuation,
    )
    return torch.from_numpy(ids), torch.from_numpy(labels)


def _check_probability(mlm_probability: float) -> None:
    if not 0.0 < mlm_probability <= 1.0:
        raise ConfigError(f"mlm_probability {mlm_probability} must be in (0, 1]")


def special_table(special_ids: Iterable[int], vocab_size: int) -> np.ndarray:
    """True at each special id: a lookup table, faster than np.isin."""
    is_special = np.zeros(vocab_size, dtype=bool)
    is_special[list(special_ids)] = True
    return is_special


def _mask_in_place(ids: np.ndarray, is_special: np.ndarray, **masking) -> np.ndarray:
    """Mask each row of `ids` (one sequence or a batch) in place; the labels, of its shape."""
    rows = ids.reshape(-1, ids.shape[-1])
    labels = np.full_like(rows, -100)
    for row, row_labels in zip(rows, labels, strict=True):
        _mask_sequence(row, row_labels, is_special, **masking)
    return labels.reshape(ids.shape)


def _mask_sequence(
    ids: np.ndarray,
    labels: np.ndarray,
    is_special: np.ndarray,
    mask_id: int,
    rng: np.random.Generator,
    mlm_probability: float,
    max_predictions: int | None,
    word_continuation: np.ndarray | None,
) -> None:
    """Mask `ids` in place and write the originals of the chosen positions into `labels`."""
    candidates = np.flatnonzero(~is_special[ids])
    if len(candidates) == 0:
        return
    count = max(1, round(mlm_probability * len(candidates)))
    if max_predictions is not None:
        count = min(count, max_predictions)
    if word_continuation is None:
        chosen = rng.choice(candidates, size=count, replace=False)
    else:
        chosen = _whole_word_positions(candidates, word_continuation[ids[candidates]], count, rng)
    labels[chosen] = ids[chosen]
    # 80% [MASK]; 10% a random token, so the model cannot trust unmasked inputs blindly; 10%
    # unchanged, so it also learns representations for the tokens it actually sees.
    roll = rng.random(len(chosen))
    ids[chosen[roll < 0.8]] = mask_id
    randomized = chosen[(roll >= 0.8) & (roll < 0.9)]
    ids[randomized] = _random_non_special(len(randomized), is_special, rng)


def _whole_word_positions(
    candidates: np.ndarray, continues: np.ndarray, count: int, rng: np.random.Generator
) -> np.ndarray:
    """Whole words in random order while they fit in `count` (BERT skips a word that would not)."""
    starts = ~continues
    starts[0] = True
    starts[1:] |= np.diff(candidates) != 1  # a piece after a special token starts a word
    words = np.split(candidates, np.flatnonzero(starts)[1:])
    chosen: list[int] = []
    for word in rng.permutation(len(words)):
        if len(chosen) + len(words[word]) <= count:
            chosen.extend(words[word])
        if len(chosen) == count:
            break
    return np.array(chosen, dtype=np.int64)


def _random_non_special(size: int, is_special: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    # Rejection sampling: the specials are a handful of ids, so redraws are rare.
    tokens = rng.integers(0, len(is_special), size=size)
    while (redraw := is_special[tokens]).any():
        tokens[redraw] = rng.integers(0, len(is_special), size=int(redraw.sum()))
    return tokens


def wordpiece_continuations(tokenizer: PreTrainedTokenizerBase) -> np.ndarray:
    """True for each vocabulary id whose token continues a word (WordPiece "##" pieces)."""
    continuation = np.zeros(len(tokenizer), dtype=bool)
    for token, index in tokenizer.get_vocab().items():
        continuation[index] = token.startswith("##")
    if not continuation.any():
        raise ConfigError(
            "whole-word masking needs a WordPiece tokenizer ('##' pieces); this one has none"
        )
    return continuation


def masking_options(
    tokenizer: PreTrainedTokenizerBase,
    mlm_probability: float,
    max_predictions: int | None,
    whole_word_mask: bool,
) -> dict:
    if tokenizer.mask_token_id is None:
        raise ConfigError("masked LM needs a tokenizer with a mask token ([MASK])")
    _check_probability(mlm_probability)
    return {
        "special_ids": tokenizer.all_special_ids,
        "mask_id": tokenizer.mask_token_id,
        "vocab_size": len(tokenizer),
        "mlm_probability": mlm_probability,
        "max_predictions": max_predictions,
        "word_continuation": wordpiece_continuations(tokenizer) if whole_word_mask else None,
    }


# ---------------------------------------------------------------- collators


class MLMCollator:
    """Pads a list of examples into a batch (right padding) and masks it for MLM.

    Masks are dynamic (new each epoch, BERT-style 80/10/10; see `mask_tokens_for_mlm`) unless
    the examples carry static "labels" (`add_static_masks`), which are then padded with -100.
    Each example's mask is drawn from a generator seeded by (seed, epoch, the example's ids):
    reproducible, independent of batch size, process count and of batches skipped on resume.
    Call `set_epoch(epoch)` at the start of every epoch.
    Returns input_ids, labels, attention_mask when some example is padded (`padding_mask`), and
    token_type_ids / next_sentence_label when the examples have them, all as int64 tensors.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        mlm_probability: float = 0.15,
        max_predictions: int | None = None,
        whole_word_mask: bool = False,
        seed: int = 0,
    ) -> None:
        self.pad_id = tokenizer.pad_token_id
        self.masking = masking_options(tokenizer, mlm_probability, max_predictions, whole_word_mask)
        # built once, not per example: a batch of 256 spent a quarter of its time on these
        self.is_special = special_table(
            self.masking.pop("special_ids"), self.masking.pop("vocab_size")
        )
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        # np.array copies: masking in place must not reach the data set's own arrays
        rows = [np.array(example["input_ids"], dtype=np.int64) for example in examples]
        if "labels" in examples[0]:
            labels = [np.asarray(example["labels"], dtype=np.int64) for example in examples]
        else:
            # the rows stay numpy arrays up to _pad: a tensor's len() and its copy back into
            # numpy cost more than the masking
            labels = [
                _mask_in_place(ids, self.is_special, rng=self._example_rng(ids), **self.masking)
                for ids in rows
            ]
        batch = {
            "input_ids": _pad(rows, self.pad_id),
            **padding_mask(rows),
            "labels": _pad(labels, -100),
        }
        if "token_type_ids" in examples[0]:
            batch["token_type_ids"] = _pad([example["token_type_ids"] for example in examples], 0)
        if "next_sentence_label" in examples[0]:
            batch["next_sentence_label"] = torch.tensor(
                [int(example["next_sentence_label"]) for example in examples], dtype=torch.long
            )
        return batch

    def _example_rng(self, ids: np.ndarray) -> np.random.Generator:
        digest = hashlib.blake2b(ids.tobytes(), digest_size=8).digest()
        return np.random.default_rng([self.seed, self.epoch, int.from_bytes(digest, "little")])


class CausalLMCollator:
    """Pads examples into a batch for GPT / ELMo: input_ids, labels (a copy of input_ids with
    -100 on padding; the models shift the labels themselves) and, when some example is padded,
    attention_mask (`padding_mask`)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        pad_id = tokenizer.pad_token_id
        self.pad_id = tokenizer.eos_token_id if pad_id is None else pad_id

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        rows = [example["input_ids"] for example in examples]
        input_ids = _pad(rows, self.pad_id)
        batch = {"input_ids": input_ids, **padding_mask(rows)}
        if "attention_mask" in batch:
            batch["labels"] = input_ids.masked_fill(batch["attention_mask"] == 0, -100)
        else:
            batch["labels"] = input_ids.clone()
        return batch


def padding_mask(rows: Sequence[Sized]) -> dict[str, torch.Tensor]:
    """{"attention_mask": 1 on real tokens, 0 on padding} when the rows differ in length, {}
    when none needs padding. Decided here, on the host, so that the models take SDPA's unmasked
    (or is_causal) kernels without asking the device in every forward (a stall, and a break in
    a compiled graph; layers.self_attention_mask)."""
    lengths = [len(row) for row in rows]
    if min(lengths) == max(lengths):
        return {}
    return {"attention_mask": _pad([np.ones(length, dtype=np.int64) for length in lengths], 0)}


def _pad(rows: Sequence[Sequence[int] | np.ndarray | torch.Tensor], value: int) -> torch.Tensor:
    """Right-pad rows of ids into a (batch, longest) int64 tensor."""
    padded = np.full((len(rows), max(len(row) for row in rows)), value, dtype=np.int64)
    for index, row in enumerate(rows):
        padded[index, : len(row)] = row
    return torch.from_numpy(padded)
