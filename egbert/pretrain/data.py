"""Pretraining examples: documents -> token ids -> each family's examples.

Every step goes through `datasets`: cached data sets live in the Arrow cache and are reused by
fingerprint; streamed ones (`IterableDataset`) are built as they are read, by batched maps whose
position `IterableDataset.state_dict()` records, so that a resumed stream goes on where it
stopped. Documents come from egbert.sources; batches are made by
egbert.pretrain.collators. Each example builder is a pure function of (tokenized documents,
options, seed).

Token ids (one row per document, column "input_ids": list of segments, each a list of ids):
    tokenize_documents(docs, tokenizer, split_sentences=True, num_proc=None, batch_size=1000)
        segments are sentences (SENTENCE_END: after . ! ? before a letter of either case, or
        after a full-width stop), or the whole document when split_sentences=False; no special
        tokens are added.

Examples (each with a column NEW_CORPUS_TOKENS: how many of the corpus's token positions the
example is the first to hold; egbert.pretrain.corpus sums it and drops it):
    build_nsp_examples(tokenized, max_seq_length=128, *, cls_id, sep_id, short_seq_prob=0.1,
                       nsp_probability=0.5, dupe_factor=1, seed=0, num_proc=None)
        BERT pairs `[CLS] A [SEP] B [SEP]`: columns input_ids, token_type_ids,
        next_sentence_label (0 = IsNext, 1 = NotNext, as transformers' BertForPreTraining).
        Every token of a document is in a pair of each pass.
    build_mlm_examples(tokenized, max_seq_length=128, *, cls_id, sep_id)
        single-segment packed `[CLS] ... [SEP]` blocks for MLM without NSP.
    pack_blocks(tokenized, block_size, eos_id)
        GPT / ELMo: documents joined by the end-of-text token, cut into block_size blocks
        (each group's last partial block is dropped, below; DataError if no block fits).
    add_static_masks(examples, tokenizer, mlm_probability=0.15, max_predictions=None,
                     whole_word_mask=False, seed=0, num_proc=None)
        BERT's static masking (use with dupe_factor > 1): adds a "labels" column.

Streamed, the builders work on groups of STREAM_GROUP_DOCUMENTS documents: NSP draws its
NotNext segments from the other documents of the group. Packing works on the same groups cached
or streamed, so both give the same blocks: each group's last partial block is dropped (as
run_clm.py's group_texts does per batch of 1,000 rows), since a stream that carried it into the
next group could not resume where it stopped (`state_dict()` records the position in the
documents, not a packer's leftovers).
Data sets come back unshuffled, in document order: the trainer's sampler shuffles.
"""

from __future__ import annotations

import bisect
import collections
import hashlib
import itertools
import random
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset, Features, IterableDataset, List, Value
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerBase

from egbert.errors import ConfigError, DataError
from egbert.pretrain.collators import mask_tokens_for_mlm, masking_options

TokenizedDocs = Dataset | IterableDataset

# Each example's count of the corpus's token positions that it is the first to hold (special
# tokens and bert's NotNext segments are not the corpus's own positions): their sum over the
# examples is how many positions reach at least one example (egbert.pretrain.corpus.CorpusUse).
NEW_CORPUS_TOKENS = "new_corpus_tokens"
TOKENIZED_FEATURES = Features({"input_ids": List(List(Value("int32")))})
BLOCK_FEATURES = Features({"input_ids": List(Value("int32")), NEW_CORPUS_TOKENS: Value("int32")})
NSP_FEATURES = Features(
    {
        "input_ids": List(Value("int32")),
        "token_type_ids": List(Value("int8")),
        "next_sentence_label": Value("int8"),
        NEW_CORPUS_TOKENS: Value("int32"),
    }
)

# Where a sentence ends: . ! or ? (and any closing quote or bracket) before a space and a letter
# of either case, so that lowercased text splits too; or a full-width stop (Chinese, Japanese),
# which needs no space after it. Text with neither is one segment a line, and the pair builder
# cuts a segment longer than its pair into pieces: BERT only needs plausible units to choose its
# A/B split points from, and a missed boundary costs no tokens.
SENTENCE_END = re.compile(r"[.!?][\"'”’)\]]*(\s+)(?=[^\W\d_])|[。！？｡][」』”’）]*(\s*)")
# Documents per group of a streamed builder (see the module doc).
STREAM_GROUP_DOCUMENTS = 1000


# ---------------------------------------------------------------- tokens


def tokenize_documents(
    docs: Dataset | IterableDataset,
    tokenizer: PreTrainedTokenizerBase,
    split_sentences: bool = True,
    num_proc: int | None = None,
    batch_size: int = 1000,
) -> Dataset | IterableDataset:
    """Token ids of each document's segments (sentences, or the whole text), without specials.

    Documents and segments with no tokens are dropped. Parallel with `num_proc` processes and
    cached by fingerprint (of the documents, the tokenizer and the options).
    """
    options = {
        "fn_kwargs": {"tokenizer": tokenizer, "split_sentences": split_sentences},
        "batched": True,
        "batch_size": batch_size,
        "remove_columns": ["text"],
        "features": TOKENIZED_FEATURES,
    }
    if isinstance(docs, IterableDataset):
        return docs.map(_tokenize_batch, **options)
    return docs.map(_tokenize_batch, num_proc=num_proc, desc="tokenizing", **options)


def _tokenize_batch(
    batch: dict[str, list], tokenizer: PreTrainedTokenizerBase, split_sentences: bool
) -> dict[str, list]:
    segments = [_segments(text, split_sentences) for text in batch["text"]]
    flat = [segment for document in segments for segment in document]
    ids = token_ids(tokenizer, flat)
    tokenized, start = [], 0
    for document in segments:
        kept = [segment for segment in ids[start : start + len(document)] if segment]
        start += len(document)
        if kept:
            tokenized.append(kept)
    return {"input_ids": tokenized}


def token_ids(tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> list[list[int]]:
    """The ids of each text, without special tokens, truncation or padding, from the Rust
    tokenizer itself: the same ids as `tokenizer(texts, add_special_tokens=False)`, a third
    faster (the transformers call builds a BatchEncoding around them)."""
    backend = tokenizer.backend_tokenizer
    if backend.truncation is not None or backend.padding is not None:
        backend = Tokenizer.from_str(backend.to_str())  # a copy: the caller's stays as it is
        backend.no_truncation()
        backend.no_padding()
    return [encoding.ids for encoding in backend.encode_batch(texts, add_special_tokens=False)]


def _segments(text: str, split_sentences: bool) -> list[str]:
    if not split_sentences:
        return [text]
    return [sentence for line in text.split("\n") for sentence in sentences_of(line)]


def sentences_of(line: str) -> list[str]:
    """The sentences of one line of text (SENTENCE_END), the spaces between them dropped."""
    sentences, start = [], 0
    for match in SENTENCE_END.finditer(line):
        sentences.append(line[start : match.start(match.lastindex)])  # up to the spaces
        start = match.end()
    sentences.append(line[start:])
    return [sentence for sentence in sentences if sentence.strip()]


# ---------------------------------------------------------------- BERT: sentence pairs with NSP


def build_nsp_examples(
    tokenized: TokenizedDocs,
    max_seq_length: int = 128,
    *,
    cls_id: int,
    sep_id: int,
    short_seq_prob: float = 0.1,
    nsp_probability: float = 0.5,
    dupe_factor: int = 1,
    seed: int = 0,
    num_proc: int | None = None,
) -> Dataset | IterableDataset:
    """BERT's `[CLS] A [SEP] B [SEP]` pairs with next-sentence labels, as google-research/bert's
    create_pretraining_data builds them (before masking), but with every token of a document in
    a pair: BERT truncates a chunk that overshoots its length and drops the rest, which loses
    most of a corpus whose sentences are long or not found (a lowercased or unpunctuated one).

    Each chunk is the document's next target length of tokens (`max_seq_length - 3`, or with
    probability `short_seq_prob` a random length from 2), a sentence that reaches past it cut
    there and continued in the next chunk. A is the chunk up to one of its sentence ends, drawn
    at random (up to a random token where it holds none); B is the rest (IsNext, label 0) or,
    with probability `nsp_probability`, a span from another document (NotNext, label 1), and
    the chunk's rest then starts the next chunk. `dupe_factor` passes give different pairs.
    The result depends only on (documents, options, seed), not on `num_proc`.
    """
    if max_seq_length < 5:
        raise ConfigError(f"max_seq_length {max_seq_length} is too small for a pair; use >= 5")
    options = {
        "max_seq_length": max_seq_length,
        "cls_id": cls_id,
        "sep_id": sep_id,
        "short_seq_prob": short_seq_prob,
        "nsp_probability": nsp_probability,
        "dupe_factor": dupe_factor,
        "seed": seed,
    }
    if isinstance(tokenized, IterableDataset):
        return _map_document_groups(tokenized, _streaming_nsp_batch, options, NSP_FEATURES)
    documents = tokenized.with_format(None)
    return documents.map(
        _nsp_batch,
        batched=True,
        with_indices=True,
        # Arrow rows: a NotNext span reads a few sentences of another document, not all of it
        fn_kwargs={"documents": documents.with_format("arrow"), **options},
        remove_columns=documents.column_names,
        features=NSP_FEATURES,
        num_proc=num_proc,
        desc="building NSP pairs",
    )


def _map_document_groups(
    documents: TokenizedDocs, build: Callable, options: dict[str, Any], features: Features
) -> TokenizedDocs:
    """Tokenized documents as the examples `build(batch, **options)` makes of each group of
    STREAM_GROUP_DOCUMENTS documents (see the module doc); cached ones in the Arrow cache, keyed
    by the input's fingerprint and the options."""
    progress = {"desc": "packing blocks"} if isinstance(documents, Dataset) else {}
    return documents.map(
        build,
        batched=True,
        batch_size=STREAM_GROUP_DOCUMENTS,
        fn_kwargs=options,
        remove_columns=["input_ids"],
        features=features,
        **progress,
    )


def _nsp_batch(
    batch: dict[str, list], indices: list[int], documents: Dataset, **options
) -> dict[str, list]:
    def other_document(index: int, rng: random.Random) -> Sequence[list[int]]:
        # Uniform over the other documents. BERT's 10 random tries can all hit this one (one
        # in 1,024 with two documents), making a NotNext pair from the same document; only a
        # one-document corpus has to use its own text.
        if len(documents) == 1:
            return StoredDocument(documents[0])
        other = rng.randrange(len(documents) - 1)
        return StoredDocument(documents[other + (other >= index)])

    examples = _empty_nsp_columns()
    for document, index in zip(batch["input_ids"], indices, strict=True):
        _add_pairs_of_document(document, index, other_document, examples, **options)
    return examples


class StoredDocument(Sequence):
    """One tokenized document of an Arrow table (a one-row `pa.Table`): its sentences, each
    read from Arrow only as far as it is sliced."""

    def __init__(self, row: pa.Table) -> None:
        self.sentences = row.column("input_ids")[0].values

    def __len__(self) -> int:
        return len(self.sentences)

    def __getitem__(self, index: int) -> StoredSentence:
        return StoredSentence(self.sentences[index].values)


class StoredSentence:
    """A sentence of a StoredDocument: its length, and a slice of its ids as a list (a long
    sentence of a one-line corpus is not made a Python list for the few tokens a span needs)."""

    def __init__(self, ids: pa.Array) -> None:
        self.ids = ids

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, part: slice) -> list[int]:
        return self.ids[part].to_pylist()


def _streaming_nsp_batch(batch: dict[str, list], **options) -> dict[str, list]:
    """Pairs of a group of streamed documents, NotNext segments from the group's others. Each
    document's generator is seeded by its token ids: the pairs do not depend on where the
    stream was split among processes or resumed."""
    documents = batch["input_ids"]
    examples = _empty_nsp_columns()
    for position, document in enumerate(documents):

        def other_document(_key: int, rng: random.Random, position=position) -> list[list[int]]:
            if len(documents) == 1:
                return documents[0]
            other = rng.randrange(len(documents) - 1)
            return documents[other + (other >= position)]

        _add_pairs_of_document(
            document, _document_key(document), other_document, examples, **options
        )
    return examples


def _document_key(document: list[list[int]]) -> int:
    ids = np.fromiter((token for segment in document for token in segment), dtype=np.int64)
    return int.from_bytes(hashlib.blake2b(ids.tobytes(), digest_size=8).digest(), "little")


def _empty_nsp_columns() -> dict[str, list]:
    return {name: [] for name in NSP_FEATURES}


def _add_pairs_of_document(
    document: list[list[int]],
    index: int,
    other_document: Callable[[int, random.Random], Sequence[Sequence[int]]],
    examples: dict[str, list],
    *,
    max_seq_length: int,
    cls_id: int,
    sep_id: int,
    short_seq_prob: float,
    nsp_probability: float,
    dupe_factor: int,
    seed: int,
) -> None:
    tokens = [token for sentence in document for token in sentence]
    sentence_ends = list(itertools.accumulate(len(sentence) for sentence in document))
    held = np.zeros(len(tokens), dtype=bool)  # the positions an example of an earlier pass holds
    for dupe in range(dupe_factor):
        # One generator per (seed, pass, document): the pairs do not depend on how the corpus
        # is split among processes. A string seed is hashed with SHA-512, stable everywhere.
        rng = random.Random(f"{seed}/{dupe}/{index}")
        pairs = _sentence_pairs(
            tokens,
            sentence_ends,
            lambda rng=rng: other_document(index, rng),
            rng,
            max_num_tokens=max_seq_length - 3,
            short_seq_prob=short_seq_prob,
            nsp_probability=nsp_probability,
        )
        for pair in pairs:
            tokens_a, tokens_b = pair.tokens_a, pair.tokens_b
            examples["input_ids"].append([cls_id, *tokens_a, sep_id, *tokens_b, sep_id])
            examples["token_type_ids"].append([0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1))
            examples["next_sentence_label"].append(int(pair.random_next))
            own = held[pair.start : pair.end]
            examples[NEW_CORPUS_TOKENS].append(len(own) - int(own.sum()))
            own[:] = True


@dataclass
class SentencePair:
    """A and B of one example, and the positions of the document it holds: start:end (A's
    tokens alone when B comes from another document)."""

    tokens_a: list[int]
    tokens_b: list[int]
    random_next: bool
    start: int
    end: int


def _sentence_pairs(
    tokens: list[int],
    sentence_ends: list[int],
    other_document: Callable[[], Sequence[Sequence[int]]],
    rng: random.Random,
    max_num_tokens: int,
    short_seq_prob: float,
    nsp_probability: float,
) -> list[SentencePair]:
    """The pairs of one document (its tokens, and where each of its sentences ends), every token
    in one of them: each chunk is the next target length of tokens (a sentence longer than
    that is cut into pieces, not truncated), A its sentences up to a random sentence end in
    it (or a random token, where it holds none), B the rest, or, with probability
    nsp_probability, a span of another document (NotNext), the rest then starting the next
    chunk, as BERT puts the unused sentences back."""
    pairs = []
    start = 0
    while start < len(tokens):
        # Drawn per chunk (BERT draws once per document), so that short_seq_prob is the
        # share of short examples, which is how the paper describes it.
        target_length = _target_length(max_num_tokens, short_seq_prob, rng)
        end = min(start + target_length, len(tokens))
        # the sentence ends strictly inside the chunk: where A may stop
        inside = sentence_ends[
            bisect.bisect_right(sentence_ends, start) : bisect.bisect_left(sentence_ends, end)
        ]
        random_next = rng.random() < nsp_probability
        if inside:
            a_end = inside[rng.randrange(len(inside))]
        elif end - start >= 2:
            # One sentence, or a piece of a long one: cut at a random token, so that IsNext is
            # a genuine continuation (BERT would pair it with a random B, which skews the labels
            # towards NotNext: 70% on WikiText at length 64).
            a_end = rng.randint(start + 1, end - 1)
        else:  # one token left: it can only be A
            a_end, random_next = end, True
        tokens_a = tokens[start:a_end]
        if random_next:
            tokens_b = _random_span(other_document(), target_length - len(tokens_a), rng)
            pairs.append(SentencePair(tokens_a, tokens_b, True, start, a_end))
            start = a_end  # the chunk's rest goes back: the next chunk starts there
        else:
            pairs.append(SentencePair(tokens_a, tokens[a_end:end], False, start, end))
            start = end
    return pairs


def _target_length(max_num_tokens: int, short_seq_prob: float, rng: random.Random) -> int:
    # Some short sequences, so that the model also sees the lengths of fine-tuning inputs.
    if rng.random() < short_seq_prob:
        return rng.randint(2, max_num_tokens)
    return max_num_tokens


def _random_span(document: Sequence[Sequence[int]], length: int, rng: random.Random) -> list[int]:
    """`length` consecutive tokens of `document` (fewer where it ends first) from the start of
    a random sentence, or from a random token of one longer than `length` (so that a long
    sentence does not always give its first tokens)."""
    index = rng.randrange(len(document))
    sentence = document[index]
    start = rng.randrange(len(sentence) - length + 1) if len(sentence) > length else 0
    tokens = sentence[start : start + length]
    while len(tokens) < length and index + 1 < len(document):
        index += 1
        tokens += document[index][: length - len(tokens)]
    return tokens


# ---------------------------------------------------------------- packed blocks


def pack_blocks(tokenized: TokenizedDocs, block_size: int, eos_id: int) -> TokenizedDocs:
    """GPT / ELMo examples: the documents of each group joined, each followed by the end-of-text
    token, and cut into `block_size`-token blocks; a group's remainder (< block_size) is dropped."""
    return _packed(tokenized, block_size, eos_id, prefix=(), suffix=())


def build_mlm_examples(
    tokenized: TokenizedDocs, max_seq_length: int = 128, *, cls_id: int, sep_id: int
) -> TokenizedDocs:
    """Single-segment MLM examples (no NSP): documents joined by [SEP], packed into
    `[CLS] ... [SEP]` blocks of `max_seq_length` tokens, like RoBERTa's full-sentence inputs."""
    return _packed(tokenized, max_seq_length - 2, sep_id, prefix=(cls_id,), suffix=(sep_id,))


def _packed(
    tokenized: TokenizedDocs,
    block_size: int,
    separator_id: int,
    prefix: tuple[int, ...],
    suffix: tuple[int, ...],
) -> TokenizedDocs:
    """Cached or streamed, the same blocks: each group of STREAM_GROUP_DOCUMENTS documents
    packed on its own (the module doc), so that a stream, which cannot carry a group's rest
    into the next and still resume where it stopped, makes what the cache holds."""
    if block_size < 1:
        raise ConfigError(f"block size {block_size} leaves no room for text; use a larger one")
    options = dict(block_size=block_size, separator_id=separator_id, prefix=prefix, suffix=suffix)
    blocks = _map_document_groups(tokenized, _packed_batch, options, BLOCK_FEATURES)
    if isinstance(blocks, Dataset) and len(blocks) == 0:
        joined = corpus_token_count(tokenized) + len(tokenized)
        raise DataError(
            f"the corpus has {joined} tokens (with a separator after each document), and no "
            f"group of {STREAM_GROUP_DOCUMENTS:,} documents holds one block of {block_size}; "
            "give it more text or use a shorter sequence length"
        )
    return blocks


def _packed_batch(
    batch: dict[str, list],
    block_size: int,
    separator_id: int,
    prefix: tuple[int, ...],
    suffix: tuple[int, ...],
) -> dict[str, list]:
    """The blocks of one group of documents; its last partial block is dropped."""
    blocks = list(_blocks(batch["input_ids"], block_size, separator_id, prefix, suffix))
    return {name: [block[name] for block in blocks] for name in BLOCK_FEATURES}


def _blocks(
    documents: Iterable[list[list[int]]],
    block_size: int,
    separator_id: int,
    prefix: tuple[int, ...],
    suffix: tuple[int, ...],
) -> Iterator[dict[str, Any]]:
    """The documents joined, each followed by the separator, in blocks of `block_size` (the
    last partial one dropped), each wrapped in prefix and suffix, with its count of the
    corpus's tokens (the block less its separators)."""
    buffer: list[int] = []
    emitted = 0  # tokens of the joined documents already in blocks (and out of the buffer)
    separators: collections.deque[int] = collections.deque()  # their places, from the start
    for document in documents:
        for segment in document:
            buffer.extend(segment)
        separators.append(emitted + len(buffer))
        buffer.append(separator_id)
        full = len(buffer) // block_size * block_size
        for start in range(0, full, block_size):
            end = emitted + start + block_size
            inside = 0
            while separators and separators[0] < end:
                separators.popleft()
                inside += 1
            yield {
                "input_ids": [*prefix, *buffer[start : start + block_size], *suffix],
                NEW_CORPUS_TOKENS: block_size - inside,
            }
        del buffer[:full]
        emitted += full


def corpus_token_count(tokenized: Dataset) -> int:
    """The tokens of tokenized documents (no special tokens: none is added), counted in Arrow."""
    segments = pc.list_flatten(tokenized.data.column("input_ids"))
    return pc.sum(pc.list_value_length(segments)).as_py() or 0


def add_static_masks(
    examples: Dataset,
    tokenizer: PreTrainedTokenizerBase,
    mlm_probability: float = 0.15,
    max_predictions: int | None = None,
    whole_word_mask: bool = False,
    seed: int = 0,
    num_proc: int | None = None,
) -> Dataset:
    """Mask every example once, as BERT's create_pretraining_data does (with dupe_factor copies
    getting different masks): input_ids masked, a "labels" column added. Row i's mask depends
    only on (seed, i, its ids)."""
    return examples.with_format(None).map(
        _static_mask_batch,
        batched=True,
        with_indices=True,
        fn_kwargs={
            "seed": seed,
            **masking_options(tokenizer, mlm_probability, max_predictions, whole_word_mask),
        },
        num_proc=num_proc,
        desc="masking",
    )


def _static_mask_batch(
    batch: dict[str, list], indices: list[int], seed: int, **masking
) -> dict[str, list]:
    masked, labels = [], []
    for ids, index in zip(batch["input_ids"], indices, strict=True):
        new_ids, new_labels = mask_tokens_for_mlm(
            ids, rng=np.random.default_rng([seed, index]), **masking
        )
        masked.append(new_ids.tolist())
        labels.append(new_labels.tolist())
    return {"input_ids": masked, "labels": labels}
