"""Pretraining data: documents, tokens, BERT pairs, masking, packing and collators."""

from __future__ import annotations

import ast
import collections
import inspect
import itertools
import os
import re
import time
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pytest
import torch
from datasets import Dataset, Features, List, Value
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from egbert import sources
from egbert.errors import ConfigError, DataError
from egbert.pretrain import collators, data
from egbert.tokenizer import load_tokenizer, train_tokenizer

CLS, SEP, PAD, MASK = 1, 2, 0, 3
SPECIALS = (PAD, CLS, SEP, MASK)
VOCAB = 1000
# Plain data tests, not slow ones: hypothesis should not flag datasets' per-call overhead.
FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer_dir: Path):
    return load_tokenizer(tiny_tokenizer_dir)


@pytest.fixture(scope="module")
def wiki_tokenized(wikitext_slice: Path, tokenizer) -> Dataset:
    docs = sources.read_documents([wikitext_slice], doc_boundary="wikitext")
    return data.tokenize_documents(docs, tokenizer)


EOS = 4


class SimpleTokenizer:
    """The few attributes the collators read, for ids of the test's own (GPT-2's tokenizer has
    no pad token; the MLM collator's masking needs its specials and vocabulary)."""

    def __init__(self, pad_token_id: int | None = PAD) -> None:
        self.pad_token_id, self.eos_token_id, self.mask_token_id = pad_token_id, EOS, MASK
        self.all_special_ids = list(SPECIALS)

    def __len__(self) -> int:
        return VOCAB


def write(path: Path, text: str, encoding: str = "utf-8") -> Path:
    path.write_text(text, encoding=encoding)
    return path


# ---------------------------------------------------------------- documents


def test_token_ids_are_the_tokenizers_own_without_truncation(tokenizer):
    texts = ["The quick brown fox jumps over the lazy dog.", "", "a b c d e f g h i j k l m"]
    expected = tokenizer(texts, add_special_tokens=False)["input_ids"]
    assert data.token_ids(tokenizer, texts) == expected
    backend = tokenizer.backend_tokenizer
    backend.enable_truncation(3)  # as a tokenizer.json that keeps a max length would
    try:
        assert data.token_ids(tokenizer, texts) == expected
        assert backend.truncation["max_length"] == 3  # the caller's tokenizer is left as it was
    finally:
        backend.no_truncation()


def test_wikitext_articles_start_at_titles_and_drop_headings(wikitext_slice: Path):
    lines = wikitext_slice.read_text(encoding="utf-8").split("\n")
    titles = [
        line.strip()
        for before, line, after in zip(lines, lines[1:], lines[2:], strict=False)
        if re.fullmatch(r" = [^=].* = ", line) and not before.strip() and not after.strip()
    ]
    docs = sources.read_documents([wikitext_slice], doc_boundary="wikitext")
    assert len(docs) == len(titles) > 5
    assert docs[0]["text"].startswith("Senjō no Valkyria 3 : <unk> Chronicles")
    for text in docs["text"]:
        assert not re.search(r"^= = .* = =$", text, flags=re.M), "section headings are dropped"
        assert "\n\n" not in text and text == text.strip()


def test_blank_line_and_file_boundaries(tmp_path: Path):
    corpus = write(tmp_path / "c.txt", "a one.\na two.\n\n\nb one.\n  \nc one.\n")
    blank = sources.read_documents([corpus], doc_boundary="blank")
    assert blank["text"] == ["a one.\na two.", "b one.", "c one."]
    assert sources.read_documents([corpus], doc_boundary="line")["text"] == [
        "a one.",
        "a two.",
        "b one.",
        "c one.",
    ]
    whole = sources.read_documents([corpus, corpus], doc_boundary="file")
    assert whole["text"] == ["a one.\na two.\nb one.\nc one."] * 2
    streamed = sources.read_documents([corpus], doc_boundary="blank", streaming=True)
    assert [row["text"] for row in streamed] == blank["text"]


def test_an_edited_file_is_read_again_not_taken_from_the_cache(tmp_path: Path):
    corpus = write(tmp_path / "c.txt", "first text.\n")
    assert sources.read_documents([corpus])["text"] == ["first text."]
    write(corpus, "second text, longer.\n")
    assert sources.read_documents([corpus])["text"] == ["second text, longer."]


def test_latin1_book_names_file_and_offset_then_loads_with_its_encoding(data_dir: Path):
    book = data_dir / "corpus" / "gutenberg" / "chesterton-ball.txt"
    with pytest.raises(DataError) as error:
        sources.read_documents([book])
    message = str(error.value)
    for expected in ("chesterton-ball.txt", "0xe8", "offset 229333", "encoding"):
        assert expected in message
    docs = sources.read_documents([book], encoding="latin-1")
    assert len(docs) > 100 and any("è" in text for text in docs["text"])


@pytest.mark.parametrize("text", ["", "\n  \n\n"])
def test_a_file_without_text_is_an_error_naming_it(tmp_path: Path, text: str):
    empty = write(tmp_path / "empty.txt", text)
    with pytest.raises(DataError, match="empty.txt"):
        sources.read_documents([write(tmp_path / "ok.txt", "some text.\n"), empty])


def test_a_missing_file_is_an_error_naming_it(tmp_path: Path):
    with pytest.raises(DataError, match="nope.txt: no such file"):
        sources.read_documents([tmp_path / "nope.txt"])


def test_hub_offline_fails_fast_and_clearly():
    assert os.environ.get("HF_DATASETS_OFFLINE") == "1"
    start = time.perf_counter()
    with pytest.raises(DataError, match=r"could not reach the hub .*offline.*local text files"):
        sources.load_hub_documents("egbert-tests/no-such-corpus")
    assert time.perf_counter() - start < 5


def test_hub_loader_accepts_a_local_data_set_folder(tmp_path: Path):
    write(tmp_path / "part.txt", "one line.\n\nanother line.\n")
    docs = sources.load_hub_documents(str(tmp_path))
    assert docs["text"] == ["one line.", "another line."]
    with pytest.raises(DataError, match="no column 'body'"):
        sources.load_hub_documents(str(tmp_path), text_column="body")


# ---------------------------------------------------------------- tokens


def documented_signatures(doc: str) -> dict[str, dict[str, Any]]:
    """The signatures a module's docstring writes out, `name(arg, arg=default, ...)`: each
    function's parameters in order, with their defaults (`inspect.Parameter.empty` for none)."""
    signatures = {}
    for match in re.finditer(r"^ {4}(\w+)\(([^)]*)\)", doc, flags=re.MULTILINE):
        name, parameters = match.group(1), " ".join(match.group(2).split())
        arguments = ast.parse(f"def {name}({parameters}): pass").body[0].args
        required = [None] * (len(arguments.args) - len(arguments.defaults))
        written = zip(
            [*arguments.args, *arguments.kwonlyargs],
            [*required, *arguments.defaults, *arguments.kw_defaults],
            strict=True,
        )
        signatures[name] = {
            argument.arg: inspect.Parameter.empty if node is None else ast.literal_eval(node)
            for argument, node in written
        }
    return signatures


DOCUMENTED_SIGNATURES = documented_signatures(data.__doc__)


def documented_defaults(name: str) -> dict[str, Any]:
    parameters = DOCUMENTED_SIGNATURES[name].items()
    return {name: value for name, value in parameters if value is not inspect.Parameter.empty}


def test_the_functions_defaults_are_those_the_module_doc_states(tokenizer):
    """Their signatures, and what a call that leaves the options out does: the same as one that
    gives the documented defaults."""
    docs, _ = numbered_documents([[3, 4, 5] * 20] * 3)
    specials = {"cls_id": CLS, "sep_id": SEP}
    for build in (data.build_nsp_examples, data.build_mlm_examples):
        given = build(docs, **specials, **documented_defaults(build.__name__))["input_ids"]
        assert build(docs, **specials)["input_ids"] == given, build.__name__
    pairs = Dataset.from_dict(data.build_nsp_examples(docs, 32, **specials).to_dict())
    given = data.add_static_masks(pairs, tokenizer, **documented_defaults("add_static_masks"))
    assert data.add_static_masks(pairs, tokenizer)["labels"] == given["labels"]

    documented = {"tokenize_documents", "build_nsp_examples", "add_static_masks"}
    assert set(DOCUMENTED_SIGNATURES) >= documented
    for name, parameters in DOCUMENTED_SIGNATURES.items():
        signature = inspect.signature(getattr(data, name)).parameters.values()
        assert [(p.name, p.default) for p in signature] == [*parameters.items()], name


def test_tokenize_documents_splits_sentences_without_special_tokens(tmp_path: Path, tokenizer):
    corpus = write(
        tmp_path / "c.txt", "The cat sat . The dog ran !\nA bird flew\nit sang .\n\nOther doc .\n"
    )
    docs = sources.read_documents([corpus])
    tokenized = data.tokenize_documents(docs, tokenizer)
    # a line ends a sentence, with or without a stop
    expected = [["The cat sat .", "The dog ran !", "A bird flew", "it sang ."], ["Other doc ."]]
    for document, sentences in zip(tokenized["input_ids"], expected, strict=True):
        assert document == [tokenizer.encode(s, add_special_tokens=False) for s in sentences]
    whole = data.tokenize_documents(docs, tokenizer, split_sentences=False)
    assert [sum(doc, []) for doc in whole["input_ids"]] == [
        sum(doc, []) for doc in tokenized["input_ids"]
    ]
    assert all(len(doc) == 1 for doc in whole["input_ids"])


@pytest.mark.parametrize(
    ("line", "sentences"),
    [
        ("The cat sat. The dog ran! A bird.", ["The cat sat.", "The dog ran!", "A bird."]),
        ("the cat sat . the dog ran ! a bird .", ["the cat sat .", "the dog ran !", "a bird ."]),
        ('she said "go." then left', ['she said "go."', "then left"]),
        ("我爱北京。天安门很大！你好吗？", ["我爱北京。", "天安门很大！", "你好吗？"]),
        ("日本語の文です。 次の文です。", ["日本語の文です。", "次の文です。"]),
        ("it cost 3.5 dollars in no. 7 street", ["it cost 3.5 dollars in no. 7 street"]),
        ("no stop anywhere in this line", ["no stop anywhere in this line"]),
    ],
    ids=["cased", "lowercased", "quoted", "chinese", "japanese", "numbers", "unpunctuated"],
)  # fmt: skip
def test_sentences_are_found_in_lowercased_and_cjk_text(line, sentences):
    """Sentences end at . ! ? before a letter of either case and at full-width stops; text
    with neither stays whole (the pair builder cuts it into pieces: the next test)."""
    assert data.sentences_of(line) == sentences


def test_streaming_pipeline_matches_the_cached_one(wikitext_slice: Path, tokenizer):
    def blocks(streaming: bool) -> list[list[int]]:
        docs = sources.read_documents(
            [wikitext_slice], doc_boundary="wikitext", streaming=streaming
        )
        tokenized = data.tokenize_documents(docs, tokenizer, split_sentences=False)
        return [row["input_ids"] for row in data.pack_blocks(tokenized, 128, 5)]

    assert blocks(streaming=True) == blocks(streaming=False)


# ---------------------------------------------------------------- NSP pairs


def numbered_documents(sentence_lengths: list[list[int]]) -> tuple[Dataset, dict[int, tuple]]:
    """Documents whose every token id is unique, with a map id -> (document, position)."""
    where, documents, next_id = {}, [], 10
    for doc_index, lengths in enumerate(sentence_lengths):
        document, position = [], 0
        for length in lengths:
            document.append(list(range(next_id, next_id + length)))
            for token in document[-1]:
                where[token] = (doc_index, position)
                position += 1
            next_id += length
        documents.append(document)
    return Dataset.from_dict({"input_ids": documents}), where


def segments(example: dict) -> tuple[list[int], list[int]]:
    ids = example["input_ids"]
    first_sep = ids.index(SEP)
    return ids[1:first_sep], ids[first_sep + 1 : -1]


documents_strategy = st.lists(
    st.lists(st.integers(1, 30), min_size=1, max_size=12), min_size=2, max_size=8
)


@FAST
@given(documents_strategy, st.integers(8, 64), st.integers(0, 2**16))
def test_nsp_pairs_are_well_formed(sentence_lengths, max_seq_length, seed):
    docs, where = numbered_documents(sentence_lengths)
    pairs = data.build_nsp_examples(
        docs, max_seq_length, cls_id=CLS, sep_id=SEP, seed=seed, dupe_factor=2
    )
    assert len(pairs) > 0
    for example in pairs:
        ids, types = example["input_ids"], example["token_type_ids"]
        assert len(ids) <= max_seq_length and len(types) == len(ids)
        assert ids[0] == CLS and ids[-1] == SEP and ids.count(SEP) == 2 and ids.count(CLS) == 1
        tokens_a, tokens_b = segments(example)
        assert tokens_a and tokens_b
        assert types == [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
        # Each segment is a contiguous run of one document (truncation only trims its ends).
        for segment in (tokens_a, tokens_b):
            places = [where[token] for token in segment]
            assert len({doc for doc, _ in places}) == 1
            assert [pos for _, pos in places] == list(range(places[0][1], places[-1][1] + 1))
        doc_a, end_a = where[tokens_a[-1]]
        doc_b, start_b = where[tokens_b[0]]
        if example["next_sentence_label"] == 0:
            assert doc_a == doc_b and start_b > end_a
            # A ends at a sentence end where its chunk (A and B) holds one
            ends = set(itertools.accumulate(sentence_lengths[doc_a]))
            chunk = range(where[tokens_a[0]][1] + 1, where[tokens_b[-1]][1] + 1)
            if ends.intersection(chunk):
                assert end_a + 1 in ends
        else:
            assert doc_a != doc_b


def test_short_pairs_take_every_length_from_2_up():
    """short_seq_prob 1: every chunk's length is drawn from 2 to max_seq_length - 3."""
    docs, _ = numbered_documents([[3] * 70])
    pairs = data.build_nsp_examples(
        docs, 8, cls_id=CLS, sep_id=SEP, short_seq_prob=1.0, nsp_probability=0.0
    )
    lengths = [len(ids) - 3 for ids in pairs["input_ids"]]
    assert set(lengths[:-1]) == {2, 3, 4, 5}  # the last is what the document had left


def test_a_notnext_span_fills_the_chunk_unless_its_document_ends_first():
    """B of a NotNext pair is the chunk's target length less A's, in consecutive tokens across
    the other document's sentences, fewer only at that document's end."""
    docs, where = numbered_documents([[2, 3, 1, 2, 3]] * 12)
    pairs = data.build_nsp_examples(
        docs, 12, cls_id=CLS, sep_id=SEP, nsp_probability=1.0, short_seq_prob=0.0
    )
    filled = 0
    for pair in pairs:
        tokens_a, tokens_b = segments(pair)
        if where[tokens_b[-1]][1] < 10:  # not the last token of its document
            assert len(tokens_a) + len(tokens_b) == 9
            filled += 1
    assert filled >= 10


def test_a_notnext_span_of_a_long_sentence_starts_anywhere_in_it():
    docs, where = numbered_documents([[100], [100]])
    pairs = data.build_nsp_examples(docs, 16, cls_id=CLS, sep_id=SEP, nsp_probability=1.0)
    starts = {where[segments(pair)[1][0]][1] for pair in pairs}
    assert len(starts) >= 5 and max(starts) > 50


def document_positions(pair: dict, where: dict[int, tuple]) -> list[tuple]:
    """The (document, position) of each token of a pair that is its own document's: A, and B
    when it is the next one (IsNext)."""
    tokens_a, tokens_b = segments(pair)
    own = tokens_a + (tokens_b if pair["next_sentence_label"] == 0 else [])
    return [where[token] for token in own]


@settings(FAST, max_examples=12)
@given(
    st.lists(st.lists(st.integers(1, 300), min_size=1, max_size=6), min_size=2, max_size=6),
    st.integers(8, 64),
    st.integers(1, 2),
    st.integers(0, 2**16),
)
def test_every_token_of_a_document_is_in_one_pair_of_each_pass(
    sentence_lengths, max_seq_length, dupe_factor, seed
):
    """Sentences up to ten times the pair's length: each is cut into pieces, none truncated.
    Each example's new_corpus_tokens counts the positions no earlier example held."""
    docs, where = numbered_documents(sentence_lengths)
    pairs = data.build_nsp_examples(
        docs, max_seq_length, cls_id=CLS, sep_id=SEP, seed=seed, dupe_factor=dupe_factor
    )
    assert all(len(ids) <= max_seq_length for ids in pairs["input_ids"])
    held = [place for pair in pairs for place in document_positions(pair, where)]
    assert sorted(held) == sorted([*where.values()] * dupe_factor)  # each pass: each one, once
    seen, new = set(), []
    for pair in pairs:
        places = set(document_positions(pair, where))
        new.append(len(places - seen))
        seen |= places
    assert pairs[data.NEW_CORPUS_TOKENS] == new
    assert sum(new) == len(where)


def test_nsp_pairs_on_wikitext_are_balanced_and_within_the_limit(wiki_tokenized, tokenizer):
    def build(short_seq_prob: float) -> tuple[np.ndarray, np.ndarray]:
        pairs = data.build_nsp_examples(
            wiki_tokenized,
            64,
            cls_id=tokenizer.cls_token_id,
            sep_id=tokenizer.sep_token_id,
            short_seq_prob=short_seq_prob,
            seed=3,
        )
        lengths = np.array([len(ids) for ids in pairs["input_ids"]])
        return np.array(pairs["next_sentence_label"]), lengths

    labels, lengths = build(short_seq_prob=0.1)
    assert len(labels) > 2000
    assert abs(labels.mean() - 0.5) < 0.04  # the binomial's sd here is about 0.008
    assert lengths.max() <= 64
    # About one pair in ten is deliberately short (documents' ends make a few more).
    _, full_lengths = build(short_seq_prob=0.0)
    assert 0.05 < (full_lengths == 64).mean() - (lengths == 64).mean() < 0.15


def test_nsp_pairs_do_not_depend_on_the_number_of_processes():
    docs, _ = numbered_documents([[5, 9, 3, 12, 7] * 3] * 40)
    build = {"max_seq_length": 32, "cls_id": CLS, "sep_id": SEP, "seed": 1}
    datasets.disable_caching()  # so the second map really runs, in two processes
    try:
        one = data.build_nsp_examples(docs, **build)
        two = data.build_nsp_examples(docs, num_proc=2, **build)
    finally:
        datasets.enable_caching()
    assert one["input_ids"] == two["input_ids"]
    assert one["next_sentence_label"] == two["next_sentence_label"]


# The columns of BERT's examples, cached or streamed: int8 labels and segment ids, a quarter of
# the disk and memory of the int64 that `datasets` would infer.
NSP_COLUMNS = Features(
    {
        "input_ids": List(Value("int32")),
        "token_type_ids": List(Value("int8")),
        "next_sentence_label": Value("int8"),
        "new_corpus_tokens": Value("int32"),
    }
)


def test_a_pair_needs_a_length_of_five_and_five_makes_pairs():
    docs, _ = numbered_documents([[3, 3]] * 2)
    with pytest.raises(ConfigError, match=r"^max_seq_length 4 is too small for a pair; use >= 5$"):
        data.build_nsp_examples(docs, 4, cls_id=CLS, sep_id=SEP)
    pairs = data.build_nsp_examples(docs, 5, cls_id=CLS, sep_id=SEP)
    assert pairs.features == NSP_COLUMNS
    assert len(pairs) >= 6 and all(len(ids) <= 5 for ids in pairs["input_ids"])


def test_streaming_nsp_pairs_are_well_formed():
    docs, where = numbered_documents([[4, 6, 5, 8]] * 30)
    stream = data.build_nsp_examples(docs.to_iterable_dataset(), 24, cls_id=CLS, sep_id=SEP)
    assert stream.features == NSP_COLUMNS
    pairs = list(stream)
    assert 0.3 < np.mean([pair["next_sentence_label"] for pair in pairs]) < 0.7
    drawn_from, cuts = set(), collections.defaultdict(list)
    for pair in pairs:
        tokens_a, tokens_b = segments(pair)
        assert len(pair["input_ids"]) <= 24 and tokens_a and tokens_b
        doc_a, doc_b = where[tokens_a[0]][0], where[tokens_b[0]][0]
        cuts[doc_a].append((len(tokens_a), pair["next_sentence_label"]))
        if pair["next_sentence_label"] == 0:
            assert doc_a == doc_b
        else:  # from one of the group's other documents, any of them
            assert doc_a != doc_b
            drawn_from.add(doc_b)
    assert len(drawn_from) >= 15
    # each document draws its own cuts and labels, though all have the same sentence lengths
    assert len({tuple(cut) for cut in cuts.values()}) >= 10


@pytest.mark.parametrize("streaming", [False, True], ids=["cached", "streamed"])
@pytest.mark.parametrize("count", [1, 2])
def test_notnext_segments_come_from_the_other_document_or_the_only_one(count, streaming):
    """Two documents: B of a NotNext pair is the other one's; one document: its own."""
    docs, where = numbered_documents([[3, 4, 3, 5, 2, 4, 3] * 3] * count)
    built = data.build_nsp_examples(
        docs.to_iterable_dataset() if streaming else docs, 8, cls_id=CLS, sep_id=SEP, seed=1
    )
    pairs = [pair for pair in built if pair["next_sentence_label"] == 1]
    assert len(pairs) >= 3
    for pair in pairs:
        tokens_a, tokens_b = segments(pair)
        doc_a, doc_b = where[tokens_a[0]][0], where[tokens_b[0]][0]
        assert doc_b == (1 - doc_a if count == 2 else 0)


# ---------------------------------------------------------------- masking


def sequences_with_specials(draw_lengths: list[tuple[int, int]], rng) -> np.ndarray:
    """[CLS] A [SEP] B [SEP] [PAD]... rows of random non-special tokens."""
    width = max(a + b for a, b in draw_lengths) + 3
    rows = np.full((len(draw_lengths), width), PAD)
    for row, (a, b) in zip(rows, draw_lengths, strict=True):
        body = rng.integers(len(SPECIALS), VOCAB, size=a + b)
        sequence = [CLS, *body[:a], SEP, *body[a:], SEP]
        row[: len(sequence)] = sequence
    return rows


def mask(ids, rng, **options):
    return collators.mask_tokens_for_mlm(
        ids, special_ids=SPECIALS, mask_id=MASK, vocab_size=VOCAB, rng=rng, **options
    )


@FAST
@given(
    st.lists(st.tuples(st.integers(1, 60), st.integers(0, 60)), min_size=1, max_size=8),
    st.floats(0.05, 0.5),
    st.one_of(st.none(), st.integers(1, 20)),
    st.integers(0, 2**32 - 1),
)
def test_masking_invariants(lengths, probability, max_predictions, seed):
    ids = sequences_with_specials(lengths, np.random.default_rng(seed))
    masked, labels = mask(
        ids,
        np.random.default_rng(seed),
        mlm_probability=probability,
        max_predictions=max_predictions,
    )
    masked, labels = masked.numpy(), labels.numpy()
    special = np.isin(ids, SPECIALS)
    chosen = labels != -100
    for row in range(len(ids)):
        n_real = int((~special[row]).sum())
        expected = max(1, round(probability * n_real))
        if max_predictions is not None:
            expected = min(expected, max_predictions)
        assert chosen[row].sum() == expected
    assert not (chosen & special).any(), "special tokens are never chosen"
    assert (labels[chosen] == ids[chosen]).all()
    assert (masked[~chosen] == ids[~chosen]).all(), "only chosen positions change"
    assert not np.isin(masked[chosen & (masked != MASK)], SPECIALS).any()
    again, again_labels = mask(
        ids,
        np.random.default_rng(seed),
        mlm_probability=probability,
        max_predictions=max_predictions,
    )
    assert (again.numpy() == masked).all() and (again_labels.numpy() == labels).all()


def test_masking_replaces_80_percent_randomizes_10_keeps_10():
    rng = np.random.default_rng(0)
    ids = sequences_with_specials([(60, 60)] * 2000, rng)
    masked, labels = mask(ids, rng)
    chosen = labels.numpy() != -100
    masked, original = masked.numpy()[chosen], ids[chosen]
    assert chosen.sum() == 2000 * 18  # round(0.15 * 120) per sequence
    as_mask = (masked == MASK).mean()
    kept = (masked == original).mean()
    randomized = ((masked != MASK) & (masked != original)).mean()
    # 36,000 draws: a binomial sd of at most 0.0027, so these bounds are about 4 sd.
    assert abs(as_mask - 0.8) < 0.01
    assert abs(kept - 0.1) < 0.01
    assert abs(randomized - 0.1) < 0.01


@FAST
@given(st.lists(st.integers(1, 4), min_size=1, max_size=30), st.integers(0, 2**32 - 1))
def test_whole_word_masking_keeps_words_together(word_lengths, seed):
    # ids 4..99 start words, 100..999 continue them ("##" pieces)
    continuation = np.arange(VOCAB) >= 100
    rng = np.random.default_rng(seed)
    body = [
        rng.integers(4, 100) if piece == 0 else rng.integers(100, VOCAB)
        for length in word_lengths
        for piece in range(length)
    ]
    ids = np.array([CLS, *body, SEP])
    _, labels = mask(ids, rng, mlm_probability=0.3, word_continuation=continuation)
    chosen = labels.numpy() != -100
    assert not chosen[0] and not chosen[-1]
    assert chosen.sum() <= max(1, round(0.3 * len(body)))
    start = 1
    for length in word_lengths:
        word = chosen[start : start + length]
        assert word.all() or not word.any()
        start += length


# ---------------------------------------------------------------- collators


def test_whole_word_masking_fills_its_count_with_whole_words_in_random_order():
    # words [10], [11, ##12], [13]; a special (SEP) then a "##" piece, which starts a word of its
    # own: [##14]. ids 100.. are "##" pieces here, so 112 and 114 continue.
    continuation = np.arange(VOCAB) >= 100
    ids = np.array([CLS, 10, 11, 112, 13, SEP, 114, SEP])
    outcomes = set()
    for seed in range(60):
        _, labels = mask(
            ids, np.random.default_rng(seed), mlm_probability=0.4, word_continuation=continuation
        )
        outcomes.add(tuple(np.flatnonzero(labels.numpy() != -100)))
    # 5 candidates at 40%: 2 positions. Words in random order, each taken while it fits: a
    # two-piece word fills the count alone; else two of the three one-piece words
    assert outcomes == {(2, 3), (1, 4), (1, 6), (4, 6)}


def test_whole_word_masking_needs_wordpiece_pieces(tmp_path: Path):
    text = write(tmp_path / "t.txt", "a b c ab bc abc\n" * 20)
    bpe = train_tokenizer([text], kind="bpe", vocab_size=300, show_progress=False)
    with pytest.raises(ConfigError) as error:
        collators.MLMCollator(bpe, whole_word_mask=True)
    assert str(error.value) == (
        "whole-word masking needs a WordPiece tokenizer ('##' pieces); this one has none"
    )


def test_ids_of_any_integer_type_are_masked_with_int64_labels(tokenizer):
    # uint16 ids, as a memory-mapped token file holds them: -100 must not wrap around
    ids = np.array([tokenizer.cls_token_id, *range(20, 40), tokenizer.sep_token_id], np.uint16)
    masked, labels = collators.mask_tokens_for_mlm(
        ids, special_ids=tokenizer.all_special_ids, mask_id=tokenizer.mask_token_id,
        vocab_size=len(tokenizer), rng=np.random.default_rng(0),
    )  # fmt: skip
    assert masked.dtype == labels.dtype == torch.int64
    assert set(labels.tolist()) - set(range(20, 40)) == {-100}
    batch = collators.MLMCollator(tokenizer)([{"input_ids": ids}, {"input_ids": ids[:5]}])
    assert set(batch["labels"].flatten().tolist()) - set(range(20, 40)) == {-100}


@pytest.mark.parametrize("probability", [0.0, -0.1, 1.01])
def test_a_masking_probability_outside_0_to_1_is_refused(probability):
    with pytest.raises(ConfigError, match=rf"mlm_probability {probability} must be in \(0, 1\]"):
        collators.MLMCollator(SimpleTokenizer(), mlm_probability=probability)


def test_a_probability_of_1_chooses_every_token_but_the_specials():
    ids = np.array([CLS, *range(10, 60), SEP])
    _, labels = mask(ids, np.random.default_rng(0), mlm_probability=1.0)
    assert labels.tolist() == [-100, *range(10, 60), -100]


def test_random_replacements_are_drawn_from_every_non_special_id_independently():
    # ids 0-4 are words, 5-99 specials: most first draws hit a special and are drawn again
    ids = np.arange(3000) % 5
    masked, labels = collators.mask_tokens_for_mlm(
        ids, special_ids=range(5, 100), mask_id=5, vocab_size=100,
        rng=np.random.default_rng(0), mlm_probability=1.0,
    )  # fmt: skip
    replaced = masked[(masked != 5) & (masked != labels)]
    # about 10% of 3,000 chosen tokens are random, less the fifth that draws its own id again
    assert 200 < len(replaced) < 280
    shares = np.bincount(replaced.numpy(), minlength=5) / len(replaced)
    # each about a fifth (a binomial sd of about 0.026): id 0 too, and not one draw shared by
    # every position drawn again
    assert shares.min() > 0.1 and shares.max() < 0.3


def test_the_collator_masks_at_most_max_predictions_and_its_seed_defaults_to_0():
    tokenizer = SimpleTokenizer()
    rows = [{"input_ids": [CLS, *range(10 + i, 90 + i), SEP]} for i in range(3)]
    capped = collators.MLMCollator(tokenizer, max_predictions=2)(rows)
    assert ((capped["labels"] != -100).sum(1) == 2).all()  # 12 without the cap (15% of 80)
    default = collators.MLMCollator(tokenizer)(rows)["input_ids"]
    assert torch.equal(default, collators.MLMCollator(tokenizer, seed=0)(rows)["input_ids"])
    assert not torch.equal(default, collators.MLMCollator(tokenizer, seed=1)(rows)["input_ids"])


def test_masked_lm_needs_a_mask_token():
    tokenizer = SimpleTokenizer()
    tokenizer.mask_token_id = None
    with pytest.raises(ConfigError) as error:
        collators.MLMCollator(tokenizer)
    assert str(error.value) == "masked LM needs a tokenizer with a mask token ([MASK])"


def test_each_example_draws_its_own_mask():
    # the generator is seeded by the example's ids: two examples of one length in one batch,
    # the same seed and epoch, get their own positions
    tokenizer = SimpleTokenizer()
    rows = [{"input_ids": [CLS, *range(10 + i, 50 + i), SEP]} for i in range(4)]
    labels = collators.MLMCollator(tokenizer, seed=3)(rows)["labels"] != -100
    assert len({tuple(row.tolist()) for row in labels}) == 4


def test_mlm_collator_pads_masks_and_is_reproducible(wiki_tokenized, tokenizer):
    pairs = data.build_nsp_examples(
        wiki_tokenized.select(range(5)),
        48,
        cls_id=tokenizer.cls_token_id,
        sep_id=tokenizer.sep_token_id,
        short_seq_prob=0.5,
    )
    by_length = sorted(range(len(pairs)), key=lambda i: len(pairs[i]["input_ids"]))
    examples = [pairs[i] for i in by_length[:4] + by_length[-4:]]
    collator = collators.MLMCollator(tokenizer, seed=7)
    batch = collator(examples)
    lengths = [len(example["input_ids"]) for example in examples]
    assert len(set(lengths)) > 1  # some rows padded
    assert batch["input_ids"].shape == (8, max(lengths))
    assert batch["attention_mask"].sum(1).tolist() == lengths
    padding = batch["attention_mask"] == 0
    assert (batch["input_ids"][padding] == tokenizer.pad_token_id).all()
    assert (batch["labels"][padding] == -100).all()
    assert (batch["token_type_ids"][padding] == 0).all()
    assert batch["next_sentence_label"].tolist() == [e["next_sentence_label"] for e in examples]
    special = torch.isin(batch["labels"], torch.tensor(tokenizer.all_special_ids))
    assert not special.any() and ((batch["labels"] != -100).sum(1) > 0).all()
    # An example's mask depends on the example, seed and epoch, not on its batch.
    alone = collator(examples[3:4])
    assert torch.equal(alone["input_ids"][0], batch["input_ids"][3, : lengths[3]])
    # ids given as int64 arrays (as a prepared folder's) are masked in a copy, not in place
    arrays = [{**example, "input_ids": np.array(example["input_ids"])} for example in examples]
    assert torch.equal(collator(arrays)["input_ids"], batch["input_ids"])
    assert [list(example["input_ids"]) for example in arrays] == [e["input_ids"] for e in examples]
    collator.set_epoch(1)
    assert not torch.equal(collator(examples)["input_ids"], batch["input_ids"])


def test_whole_word_masking_with_a_wordpiece_tokenizer(wiki_tokenized, tokenizer):
    pairs = data.build_nsp_examples(
        wiki_tokenized.select(range(5)),
        64,
        cls_id=tokenizer.cls_token_id,
        sep_id=tokenizer.sep_token_id,
    )
    batch = collators.MLMCollator(tokenizer, whole_word_mask=True)([pairs[i] for i in range(32)])
    chosen = batch["labels"] != -100
    pieces = tokenizer.convert_ids_to_tokens(range(len(tokenizer)))
    continues = torch.tensor([piece.startswith("##") for piece in pieces])
    original = torch.where(chosen, batch["labels"], batch["input_ids"])
    special = torch.isin(original, torch.tensor(tokenizer.all_special_ids))
    # A "##" piece that follows text (truncation can cut a word after [CLS] or [SEP]).
    inside = continues[original][:, 1:] & ~special[:, :-1]
    assert (chosen[:, 1:] & inside).sum() > 0
    # Such a piece is chosen exactly when the piece before it is: words go whole.
    assert torch.equal(chosen[:, 1:] & inside, chosen[:, :-1] & inside)


def test_static_masks_pass_through_the_collator(wiki_tokenized, tokenizer):
    pairs = data.build_nsp_examples(
        wiki_tokenized.select(range(3)),
        32,
        cls_id=tokenizer.cls_token_id,
        sep_id=tokenizer.sep_token_id,
        dupe_factor=2,
    )
    masked = data.add_static_masks(pairs, tokenizer, seed=1)
    for example, original in zip(masked, pairs, strict=True):
        n_real = np.isin(original["input_ids"], tokenizer.all_special_ids, invert=True).sum()
        assert (np.array(example["labels"]) != -100).sum() == max(1, round(0.15 * n_real))
    examples = [masked[i] for i in range(4)]
    batch = collators.MLMCollator(tokenizer)(examples)
    for row, example in enumerate(examples):
        n = len(example["labels"])
        assert batch["labels"][row, :n].tolist() == example["labels"]
        assert batch["input_ids"][row, :n].tolist() == example["input_ids"]


def test_static_masks_take_max_predictions_and_num_proc(wiki_tokenized, tokenizer, capfd):
    """At most max_predictions labels a row; num_proc processes (the progress bar says so) make
    the same masks as one."""
    built = data.build_nsp_examples(
        wiki_tokenized.select(range(2)),
        32,
        cls_id=tokenizer.cls_token_id,
        sep_id=tokenizer.sep_token_id,
    )
    pairs = Dataset.from_dict(built.to_dict())  # in memory: each map runs, none is read back

    def most_labels(masked: Dataset) -> int:
        return max(sum(label != -100 for label in labels) for labels in masked["labels"])

    assert most_labels(data.add_static_masks(pairs, tokenizer)) > 2
    one = data.add_static_masks(pairs, tokenizer, max_predictions=2)
    assert most_labels(one) == 2
    capfd.readouterr()
    two = data.add_static_masks(pairs, tokenizer, max_predictions=2, num_proc=2)
    assert "masking (num_proc=2)" in capfd.readouterr().err
    assert two["labels"] == one["labels"] and two["input_ids"] == one["input_ids"]


def test_an_empty_corpus_counts_no_token():
    empty = Dataset.from_dict({"input_ids": []}, features=data.TOKENIZED_FEATURES)
    assert data.corpus_token_count(empty) == 0


def test_causal_collator_pads_with_eos_where_the_tokenizer_has_no_pad_token():
    tokenizer = SimpleTokenizer(pad_token_id=None)
    batch = collators.CausalLMCollator(tokenizer)([{"input_ids": [7, 8, 9]}, {"input_ids": [5]}])
    assert batch["input_ids"].tolist() == [[7, 8, 9], [5, EOS, EOS]]
    assert batch["labels"].tolist() == [[7, 8, 9], [5, -100, -100]]


def test_causal_collator_labels_copy_inputs_except_padding(tokenizer):
    batch = collators.CausalLMCollator(tokenizer)([{"input_ids": [7, 8, 9]}, {"input_ids": [5]}])
    pad = tokenizer.pad_token_id
    assert batch["input_ids"].tolist() == [[7, 8, 9], [5, pad, pad]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[7, 8, 9], [5, -100, -100]]


def test_collators_leave_out_the_mask_of_a_batch_without_padding(tokenizer):
    """No padding: no attention_mask, so the models take SDPA's unmasked or causal kernels."""
    rows = [{"input_ids": [7, 8, 9]}, {"input_ids": [5, 6, 7]}]
    causal = collators.CausalLMCollator(tokenizer)(rows)
    assert "attention_mask" not in causal and torch.equal(causal["labels"], causal["input_ids"])
    pairs = [{"input_ids": [2, 7, 8, 9, 3], "token_type_ids": [0, 0, 0, 1, 1]}] * 2
    masked = collators.MLMCollator(tokenizer, seed=7)(pairs)
    assert "attention_mask" not in masked and masked["input_ids"].shape == (2, 5)


# ---------------------------------------------------------------- packing


@FAST
@given(
    st.lists(
        st.lists(st.lists(st.integers(10, 99), min_size=1, max_size=20), min_size=1, max_size=5),
        min_size=1,
        max_size=12,
    ),
    st.integers(1, 40),
)
def test_packing_loses_and_duplicates_no_token(documents, block_size):
    eos = 5
    stream = [token for document in documents for token in [*sum(document, []), eos]]
    tokenized = Dataset.from_dict({"input_ids": documents})
    if len(stream) < block_size:
        message = (
            f"^the corpus has {len(stream)} tokens .*, and no group of 1,000 documents holds "
            f"one block of {block_size};"
        )
        with pytest.raises(DataError, match=message):
            data.pack_blocks(tokenized, block_size, eos)
        return
    packed = data.pack_blocks(tokenized, block_size, eos)
    blocks = packed["input_ids"]
    assert all(len(block) == block_size for block in blocks)
    # the corpus's own tokens in each block: all but the separators
    assert packed[data.NEW_CORPUS_TOKENS] == [block_size - block.count(eos) for block in blocks]
    assert len(blocks) == len(stream) // block_size
    assert sum(blocks, []) == stream[: len(blocks) * block_size]
    streamed = data.pack_blocks(tokenized.to_iterable_dataset(), block_size, eos)
    assert [row["input_ids"] for row in streamed] == blocks


def test_packed_mlm_examples_wrap_blocks_in_cls_and_sep(wiki_tokenized, tokenizer):
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    examples = data.build_mlm_examples(wiki_tokenized, 64, cls_id=cls_id, sep_id=sep_id)
    inner = data.pack_blocks(wiki_tokenized, 62, sep_id)["input_ids"]
    assert examples["input_ids"] == [[cls_id, *block, sep_id] for block in inner]
    total = sum(len(sentence) for doc in wiki_tokenized["input_ids"] for sentence in doc)
    assert len(inner) == (total + len(wiki_tokenized)) // 62


BLOCK_COLUMNS = Features({"input_ids": List(Value("int32")), "new_corpus_tokens": Value("int32")})


def test_blocks_have_int32_columns_cached_and_streamed():
    tokenized = Dataset.from_dict({"input_ids": [[[10, 11, 12]]] * 4})
    assert data.pack_blocks(tokenized, 4, EOS).features == BLOCK_COLUMNS
    assert data.pack_blocks(tokenized.to_iterable_dataset(), 4, EOS).features == BLOCK_COLUMNS
    with pytest.raises(ConfigError, match=r"^block size 0 leaves no room for text; use a larger"):
        data.pack_blocks(tokenized, 0, EOS)


def test_packing_is_read_back_from_the_arrow_cache_by_fingerprint_and_options(
    tmp_path, monkeypatch
):
    """A cached corpus is packed once: packing it again with the same options reads the blocks
    back (the packer does not run), other options pack anew into a file of their own."""
    Dataset.from_dict({"input_ids": [[[10, 11, 12]]] * 4}).save_to_disk(tmp_path / "tokens")
    tokenized = datasets.load_from_disk(tmp_path / "tokens")
    packed = data.pack_blocks(tokenized, 4, EOS)
    blocks = data._blocks

    def refuse(*args, **kwargs):
        raise AssertionError("packed again")
        yield from blocks(*args, **kwargs)

    monkeypatch.setattr(data, "_blocks", refuse)
    again = data.pack_blocks(tokenized, 4, EOS)
    assert again["input_ids"] == packed["input_ids"]
    assert again.cache_files == packed.cache_files
    monkeypatch.setattr(data, "_blocks", blocks)
    shorter = data.pack_blocks(tokenized, 2, EOS)
    assert shorter["input_ids"][0] == [10, 11]
    assert shorter.cache_files != packed.cache_files


def test_cached_and_streamed_packing_give_the_same_blocks_group_by_group():
    """Each group of 1,000 documents is packed on its own and drops its last partial block,
    cached or streamed (the module doc). 2,000 documents of 2 tokens and a separator: a group
    is 3,000 tokens, 428 blocks of 7 and 4 tokens dropped; the 6,000 packed as one would make
    857."""
    cached = Dataset.from_dict({"input_ids": [[[10, 11]]] * 2000})
    group = [10, 11, EOS] * 1000
    expected = [group[start : start + 7] for start in range(0, 428 * 7, 7)] * 2
    assert data.pack_blocks(cached, 7, EOS)["input_ids"] == expected
    streamed = data.pack_blocks(cached.to_iterable_dataset(), 7, EOS)
    assert [row["input_ids"] for row in streamed] == expected


def test_a_corpus_without_a_block_is_refused_in_one_line_and_its_packing_is_shown(capfd):
    """Two documents, 2 and 1 tokens, each followed by the separator: 5 tokens, no block of 8;
    a cached corpus's packing shows as such in its progress bar."""
    tokenized = Dataset.from_dict({"input_ids": [[[10, 11]], [[12]]]})
    message = (
        "the corpus has 5 tokens (with a separator after each document), and no group of 1,000 "
        "documents holds one block of 8; give it more text or use a shorter sequence length"
    )
    with pytest.raises(DataError) as refused:
        data.pack_blocks(tokenized, 8, EOS)
    assert str(refused.value) == message
    data.pack_blocks(tokenized, 2, EOS)
    assert "packing blocks: " in capfd.readouterr().err
