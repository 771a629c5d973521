"""Texts to vectors: tokenize (in windows for long texts), run the model longest first, combine
the chosen layers per token, stitch windows, then pool or keep the tokens (or average words)."""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Encoding
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from egbert.embedding.options import EmbedOptions
from egbert.errors import CheckpointError, ConfigError, DataError

TextOrPair = str | tuple[str, str]


@dataclass
class TokenEmbeddings:
    """The per-token (or, with word_level=True, per-word) vectors of one input.

    offsets are character spans in the input's own text (the first or the second text of a pair,
    as sequence_ids says); special tokens have sequence id None and offsets (0, 0).
    """

    tokens: list[str]
    offsets: list[tuple[int, int]]
    sequence_ids: list[int | None]
    vectors: np.ndarray  # (tokens, dim), float32


@dataclass
class _Sequence:
    """One tokenized input after stitching its windows: what `_finish` turns into a result."""

    vectors: torch.Tensor  # (tokens, dim)
    tokens: list[str]
    offsets: list[tuple[int, int]]
    sequence_ids: list[int | None]
    word_ids: list[int | None]


def check_items(items: Sequence[TextOrPair]) -> list[TextOrPair]:
    checked: list[TextOrPair] = []
    for index, item in enumerate(items):
        if isinstance(item, str):
            checked.append(item)
        elif (
            isinstance(item, tuple | list)
            and len(item) == 2
            and all(isinstance(part, str) for part in item)
        ):
            checked.append((item[0], item[1]))
        else:
            raise DataError(
                f"input {index} is {item!r:.60}; pass a text or an (a, b) pair of texts"
            )
    return checked


# ---------------------------------------------------------------------------------------------
# Tokenizing, running the model, combining layers


def _tokenize(
    tokenizer: PreTrainedTokenizerBase,
    items: list[TextOrPair],
    max_length: int | None,
    stride: int | None,
    first_number: int,
) -> tuple[list[Encoding], list[list[int]], int]:
    """Tokenize; return the windows, each input's window indices and how many were truncated."""
    windowed = stride is not None and max_length is not None
    if windowed and any(isinstance(item, tuple) for item in items):
        raise ConfigError("stride windows work on single texts; pairs are truncated instead")
    encoded = tokenizer(
        items,
        truncation=max_length is not None,
        max_length=max_length,
        stride=stride or 0,
        return_overflowing_tokens=windowed,
    )
    windows = encoded.encodings
    owners = encoded["overflow_to_sample_mapping"] if windowed else range(len(items))
    windows_of_input: list[list[int]] = [[] for _ in items]
    for window, owner in enumerate(owners):
        windows_of_input[owner].append(window)
        if not windows[window].ids:
            raise DataError(
                f"text {first_number + owner} of the input has no tokens (an empty line?); "
                "remove it"
            )
    truncated = 0 if windowed else sum(1 for window in windows if window.overflowing)
    return windows, windows_of_input, truncated


def _pad_batch(
    windows: list[Encoding], pad_id: int, with_token_types: bool, device: torch.device
) -> dict[str, torch.Tensor]:
    """Right-pad a batch: the models expect real tokens first, attention_mask 0 on padding."""
    lengths = [len(window.ids) for window in windows]
    length = max(lengths)
    padding = [length - n for n in lengths]
    input_ids = torch.tensor([w.ids + [pad_id] * p for w, p in zip(windows, padding, strict=True)])
    attention_mask = (torch.arange(length) < torch.tensor(lengths)[:, None]).long()
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    if with_token_types:
        types = [w.type_ids + [0] * p for w, p in zip(windows, padding, strict=True)]
        inputs["token_type_ids"] = torch.tensor(types)
    return {name: tensor.to(device) for name, tensor in inputs.items()}


def _combine_layers(
    hidden_states: Sequence[torch.Tensor], positions: list[int], combine: str
) -> torch.Tensor:
    """(batch, seq, dim) per layer -> (batch, seq, dim or dim * layers for concat)."""
    selected = [hidden_states[position] for position in positions]
    if combine in ("concat", "none"):
        return torch.cat(selected, dim=-1)
    stacked = torch.stack(selected)  # (layers, batch, seq, dim)
    if combine == "sum":
        return stacked.sum(0)
    if combine == "mean":
        return stacked.mean(0)
    # scalar-mix, untrained: softmax of zero scalars gives equal weights, gamma = 1
    weights = torch.softmax(torch.zeros(len(selected), device=stacked.device), dim=0)
    gamma = 1.0
    return gamma * torch.einsum("l,lbsd->bsd", weights.to(stacked.dtype), stacked)


def _forward_batches(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    windows: list[Encoding],
    positions: list[int],
    combine: str,
    batch_size: int,
) -> Iterator[tuple[list[int], torch.Tensor]]:
    """Yield (window indices, (batch, seq, dim) float32 vectors), batching windows of similar
    length, the longest first; row r holds window indices[r], its real tokens first."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    accepted = inspect.signature(model.forward).parameters
    # GPT-2 style models accept token_type_ids but embed them with the word table, so pass them
    # only when the tokenizer, too, says the model was trained with them.
    with_token_types = (
        "token_type_ids" in accepted and "token_type_ids" in tokenizer.model_input_names
    )
    # a key/value cache costs time and memory and is of no use when nothing is generated
    options = {"use_cache": False} if "use_cache" in accepted else {}
    order = sorted(range(len(windows)), key=lambda index: len(windows[index].ids), reverse=True)
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        inputs = _pad_batch([windows[i] for i in batch], pad_id, with_token_types, model.device)
        outputs = model(**inputs, **options, output_hidden_states=True, return_dict=True)
        if outputs.hidden_states is None:
            raise CheckpointError(f"{type(model).__name__} returns no hidden_states")
        yield batch, _combine_layers(outputs.hidden_states, positions, combine).float().cpu()


def _real_token_rows(
    batches: Iterator[tuple[list[int], torch.Tensor]], windows: list[Encoding]
) -> Iterator[tuple[int, torch.Tensor]]:
    """(window index, (tokens, dim) vectors of its real tokens) of each row of `batches`."""
    for batch, combined in batches:
        for row, index in enumerate(batch):
            yield index, combined[row, : len(windows[index].ids)]


def _pooled_batches(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    windows: list[Encoding],
    positions: list[int],
    options: EmbedOptions,
) -> np.ndarray:
    """One pooled vector per window, a batch at a time: for inputs of one window each, what
    `_finish` gives input by input, without a Python step per input."""
    order, pooled = [], []
    for batch, combined in _forward_batches(
        model, tokenizer, windows, positions, options.combine, options.batch_size
    ):
        lengths = torch.tensor([len(windows[index].ids) for index in batch])
        pooled.append(_pool(combined, lengths, options))
        order.extend(batch)
    rows = torch.cat(pooled)
    results = torch.empty_like(rows)
    results[order] = rows
    return results.numpy()


# ---------------------------------------------------------------------------------------------
# Stitching windows, pooling, word averages


def _as_sequence(window: Encoding, vectors: torch.Tensor) -> _Sequence:
    return _Sequence(vectors, window.tokens, window.offsets, window.sequence_ids, window.word_ids)


def _stitch_windows(windows: list[Encoding], vectors: list[torch.Tensor], step: int) -> _Sequence:
    """Rebuild one long input from its overlapping windows.

    Window j holds text tokens j*step ... j*step + n_j - 1 (the tokenizer's stride overlap). Each
    text token is taken from the window where it has the most context on its shorter side (the
    rule of BERT's SQuAD windows; ties go to the earlier window); the leading special tokens come
    from the first window and the trailing ones from the last.
    """
    spans = []  # per window: (first text position, last text position)
    for window in windows:
        text = [p for p, sequence_id in enumerate(window.sequence_ids) if sequence_id is not None]
        spans.append((text[0], text[-1]))
    length = (len(windows) - 1) * step + spans[-1][1] - spans[-1][0] + 1
    best_context = [-1] * length
    source = [(0, 0)] * length  # (window, position in window)
    for j, (first, last) in enumerate(spans):
        count = last - first + 1
        for t in range(count):
            context = min(t, count - 1 - t)
            if context > best_context[j * step + t]:
                best_context[j * step + t] = context
                source[j * step + t] = (j, first + t)
    head = [(0, p) for p in range(spans[0][0])]
    tail = [(len(windows) - 1, p) for p in range(spans[-1][1] + 1, len(windows[-1].ids))]
    picks = head + source + tail
    return _Sequence(
        vectors=torch.stack([vectors[j][p] for j, p in picks]),
        tokens=[windows[j].tokens[p] for j, p in picks],
        offsets=[windows[j].offsets[p] for j, p in picks],
        sequence_ids=[windows[j].sequence_ids[p] for j, p in picks],
        word_ids=[windows[j].word_ids[p] for j, p in picks],
    )


def _pool(vectors: torch.Tensor, lengths: torch.Tensor, options: EmbedOptions) -> torch.Tensor:
    """(batch, seq, dim), real tokens first, `lengths` of them a row -> (batch, dim), normalized
    where the options say so."""
    if options.pool == "cls":
        pooled = vectors[:, 0]
    elif options.pool == "last":
        pooled = vectors[torch.arange(len(vectors)), lengths - 1]
    else:
        real = torch.arange(vectors.shape[1]) < lengths[:, None]
        pooled = (vectors * real.unsqueeze(-1)).sum(1) / lengths[:, None]
    return F.normalize(pooled, dim=-1) if options.normalize else pooled


def _average_words(sequence: _Sequence, texts: tuple[str, ...]) -> _Sequence:
    """Average the word pieces of each word (tokenizer word_ids); special tokens are dropped."""
    pieces: dict[tuple[int, int], list[int]] = {}
    for position, (sequence_id, word_id) in enumerate(
        zip(sequence.sequence_ids, sequence.word_ids, strict=True)
    ):
        if sequence_id is not None and word_id is not None:
            pieces.setdefault((sequence_id, word_id), []).append(position)
    words, offsets, sequence_ids, rows = [], [], [], []
    for (sequence_id, _), positions in pieces.items():
        start, end = sequence.offsets[positions[0]][0], sequence.offsets[positions[-1]][1]
        text = texts[sequence_id]
        # byte-level BPE offsets include the space before a word: leave it out of the word
        while start < end and text[start].isspace():
            start += 1
        words.append(text[start:end])
        offsets.append((start, end))
        sequence_ids.append(sequence_id)
        rows.append(sequence.vectors[positions].mean(0))
    dim = sequence.vectors.shape[-1]
    vectors = torch.stack(rows) if rows else sequence.vectors.new_zeros((0, dim))
    return _Sequence(vectors, words, offsets, sequence_ids, [None] * len(words))


def _finish(
    sequence: _Sequence, item: TextOrPair, options: EmbedOptions
) -> torch.Tensor | TokenEmbeddings:
    if options.pool != "none":
        return _pool(sequence.vectors[None], torch.tensor([len(sequence.vectors)]), options)[0]
    if options.word_level:
        sequence = _average_words(sequence, (item,) if isinstance(item, str) else item)
    vectors = F.normalize(sequence.vectors, dim=-1) if options.normalize else sequence.vectors
    return TokenEmbeddings(
        tokens=list(sequence.tokens),
        offsets=[tuple(span) for span in sequence.offsets],
        sequence_ids=list(sequence.sequence_ids),
        vectors=vectors.numpy().copy(),  # copy: a view would keep the whole batch alive
    )


def embed_items(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    items: list[TextOrPair],
    positions: list[int],
    options: EmbedOptions,
    max_length: int | None,
    first_number: int = 1,
) -> tuple[np.ndarray | list[TokenEmbeddings], int]:
    """Embed checked items with checked options; return the results and the truncated count."""
    windows, windows_of_input, truncated = _tokenize(
        tokenizer, items, max_length, options.stride, first_number
    )
    if options.pool != "none" and len(windows) == len(items):  # one window an input, in order
        with torch.inference_mode():
            return _pooled_batches(model, tokenizer, windows, positions, options), truncated
    step = 0  # text tokens from one window's start to the next's, when windowing
    if options.stride is not None and max_length is not None:
        step = max_length - tokenizer.num_special_tokens_to_add(pair=False) - options.stride
    owner = {window: i for i, indices in enumerate(windows_of_input) for window in indices}
    waiting = [len(indices) for indices in windows_of_input]
    done: dict[int, torch.Tensor] = {}
    results: list = [None] * len(items)
    with torch.inference_mode():
        batches = _forward_batches(
            model, tokenizer, windows, positions, options.combine, options.batch_size
        )
        for window, vectors in _real_token_rows(batches, windows):
            i = owner[window]
            done[window] = vectors
            waiting[i] -= 1
            if waiting[i]:
                continue
            indices = windows_of_input[i]
            if len(indices) == 1:
                sequence = _as_sequence(windows[window], done.pop(window))
            else:
                parts = [done.pop(index) for index in indices]
                sequence = _stitch_windows([windows[index] for index in indices], parts, step)
            results[i] = _finish(sequence, items[i], options)
    if options.pool != "none":
        return torch.stack(results).numpy(), truncated
    return results, truncated
