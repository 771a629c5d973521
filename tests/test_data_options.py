"""The data options of `egbert pretrain` and `egbert prepare`, each against examples this file
computes from the option's definition and the tokenizer (transformers' AutoTokenizer): gpt's
blocks are the documents' ids, each followed by the end-of-text id, end to end and cut every
--seq-len tokens; bert's pairs are runs of a document's tokens; its masks cover
round(--mlm-probability x the sequence's tokens).

Each test reads the examples both commands build from the same options: `egbert pretrain`'s as
its run gets them (`pretraining_data`), `egbert prepare`'s as its folder holds them.
"""

from __future__ import annotations

import collections
import hashlib
import json
from pathlib import Path

import datasets
import numpy as np
import pytest
from option_coverage import proves
from transformers import AutoTokenizer

from egbert.errors import ConfigError, DataError
from egbert.pretrain.prepare import parse_prepare_args, prepare
from egbert.pretrain.prepared_folder import PreparedFolder
from egbert.pretrain.run import parse_pretrain_args, pretraining_data
from egbert.tokenizer import load_tokenizer, train_tokenizer

COMMANDS = ["pretrain", "prepare"]
SENTENCES = [
    "The river rose in the spring .",
    "It flooded the town near the old bridge .",
    "People moved their cattle to the hills .",
    "After the rain the water fell again .",
]


@pytest.fixture(autouse=True)
def private_datasets_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")


@pytest.fixture(scope="module")
def reference(tiny_tokenizer_dir: Path):
    """The WordPiece tokenizer as transformers loads it: the ids the examples must hold."""
    return AutoTokenizer.from_pretrained(tiny_tokenizer_dir)


@pytest.fixture(scope="module")
def bpe_dir(wikitext_slice: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE tokenizer: it keeps every character, U+FFFD too (WordPiece drops it)."""
    out = tmp_path_factory.mktemp("bpe")
    train_tokenizer([wikitext_slice], kind="bpe", vocab_size=400, out_dir=out)
    return out


def plain(example: dict) -> dict:
    return {name: np.asarray(value).tolist() for name, value in example.items()}


def data_of(model_args, data_args, objective_args, training_args):
    """The examples a pretraining run of these options gets (`pretraining_data`)."""
    tokenizer = load_tokenizer(data_args.tokenizer)
    parts = (model_args.model, data_args, objective_args, tokenizer)
    return pretraining_data(*parts, training_args.seed, None)


def built(command: str, out: Path, argv: list[str]) -> tuple[list[dict], list[dict] | None]:
    """The training and validation examples of `egbert COMMAND ARGV --output-dir OUT`: those
    pretrain's run gets, or those prepare's folder holds."""
    argv = [*argv, "--output-dir", str(out)]
    if command == "pretrain":
        data = data_of(*parse_pretrain_args(argv))
        train, validation = data.train, data.eval
    else:
        folder = PreparedFolder(prepare(*parse_prepare_args(argv))["folder"])
        train = folder.examples("train")
        validation = folder.examples("validation") if folder.has_split("validation") else None
    listed = [plain(example) for example in train]
    return listed, None if validation is None else [plain(example) for example in validation]


def gpt_argv(tokenizer: Path, *argv: str, seq_len: int = 8) -> list[str]:
    return ["--model", "gpt", "--tokenizer", str(tokenizer), "--seq-len", str(seq_len), *argv]


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def gpt_blocks(tokenizer, documents: list[str], seq_len: int = 8) -> list[list[int]]:
    """gpt's examples by definition: each document's ids and the end-of-text id, end to end,
    cut into seq_len-token blocks; the remainder shorter than a block is dropped."""
    stream = [
        token for text in documents for token in [*ids(tokenizer, text), tokenizer.eos_token_id]
    ]
    return [
        stream[start : start + seq_len] for start in range(0, len(stream) - seq_len + 1, seq_len)
    ]


def input_ids(examples: list[dict]) -> list[list[int]]:
    return [example["input_ids"] for example in examples]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


# ---------------------------------------------------------------- where documents come from

WIKITEXT = """
 = Rivers =

 The river rose in the spring .
 It flooded the town near the old bridge .

 = = Floods = =

 People moved their cattle to the hills .

 = Hills =

 After the rain the water fell again .
"""
DOCUMENTS = {
    "line": [
        "= Rivers =",
        SENTENCES[0],
        SENTENCES[1],
        "= = Floods = =",
        SENTENCES[2],
        "= Hills =",
        SENTENCES[3],
    ],
    "blank": [
        "= Rivers =",
        "\n".join(SENTENCES[:2]),
        "= = Floods = =",
        SENTENCES[2],
        "= Hills =",
        SENTENCES[3],
    ],
    "wikitext": ["\n".join(SENTENCES[:3]), SENTENCES[3]],
    "file": [
        "\n".join(
            [
                "= Rivers =",
                *SENTENCES[:2],
                "= = Floods = =",
                SENTENCES[2],
                "= Hills =",
                SENTENCES[3],
            ]
        )
    ],
}


@pytest.mark.parametrize("boundary", list(DOCUMENTS))
@pytest.mark.parametrize("command", COMMANDS)
@proves("pretrain", "--doc-boundary", "--train-files", "--seq-len")
@proves("prepare", "--doc-boundary", "--train-files", "--seq-len", "--model", "--tokenizer")
def test_documents_end_where_doc_boundary_says(
    command, boundary, tiny_tokenizer_dir, reference, tmp_path
):
    corpus = tmp_path / "wiki.tokens"
    corpus.write_text(WIKITEXT * 3, encoding="utf-8")
    argv = gpt_argv(tiny_tokenizer_dir, "--train-files", str(corpus), "--doc-boundary", boundary)
    train, _ = built(command, tmp_path / "out", argv)
    documents = DOCUMENTS[boundary] * 3  # the file's three copies: one document, or each's own
    expected = ["\n".join(documents)] if boundary == "file" else documents
    assert input_ids(train) == gpt_blocks(reference, expected)


@pytest.mark.parametrize(
    ("encoding", "errors", "decoded"),
    [
        ("latin-1", "strict", "café über"),
        ("utf-8", "replace", "caf\ufffd \ufffdber"),
        ("utf-8", "ignore", "caf ber"),
    ],
)
@pytest.mark.parametrize("command", COMMANDS)
@proves("pretrain", "--encoding", "--encoding-errors")
@proves("prepare", "--encoding", "--encoding-errors")
def test_bytes_decode_with_encoding_and_encoding_errors(
    command, encoding, errors, decoded, bpe_dir, tmp_path
):
    corpus = tmp_path / "latin1.txt"
    corpus.write_bytes(("\n".join(f"{s} café über" for s in SENTENCES) + "\n").encode("latin-1"))
    argv = gpt_argv(bpe_dir, "--train-files", str(corpus), "--doc-boundary", "line")
    argv += ["--encoding", encoding, "--encoding-errors", errors]
    train, _ = built(command, tmp_path / "out", argv)
    bpe = AutoTokenizer.from_pretrained(bpe_dir)
    assert input_ids(train) == gpt_blocks(bpe, [f"{s} {decoded}" for s in SENTENCES])
    with pytest.raises(DataError, match=r"byte 0xe9 at offset \d+ is not valid utf-8"):
        built(command, tmp_path / "strict", argv[:-4] + ["--encoding", "utf-8"])


@pytest.mark.parametrize("command", COMMANDS)
@proves("pretrain", "--text-column")
@proves("prepare", "--text-column")
def test_a_table_gives_the_text_of_its_text_column(
    command, tiny_tokenizer_dir, reference, tmp_path
):
    rows = [{"title": f"title {i}", "body": sentence} for i, sentence in enumerate(SENTENCES)]
    table = write_jsonl(tmp_path / "table.jsonl", rows * 2)
    argv = gpt_argv(tiny_tokenizer_dir, "--train-files", str(table), "--text-column", "body")
    train, _ = built(command, tmp_path / "out", argv)
    assert input_ids(train) == gpt_blocks(reference, SENTENCES * 2)


def hub_style_folder(folder: Path) -> Path:
    """A data set folder as on the Hub: two configs, each with a train and a validation split
    of its own (each row's text in "text", beside a string column "lang")."""
    splits = {("short", "train"): SENTENCES[:2], ("short", "validation"): SENTENCES[2:]}
    splits |= {("long", "train"): SENTENCES * 2, ("long", "validation"): SENTENCES[1:3]}
    for (config, split), texts in splits.items():
        (folder / config).mkdir(parents=True, exist_ok=True)
        write_jsonl(folder / config / f"{split}.jsonl", [{"text": t, "lang": "en"} for t in texts])
    configs = "".join(
        f"- config_name: {config}\n  data_files:\n"
        + "".join(
            f"  - split: {split}\n    path: {config}/{split}.jsonl\n"
            for split in ("train", "validation")
        )
        for config in ("short", "long")
    )
    (folder / "README.md").write_text(f"---\nconfigs:\n{configs}---\n", encoding="utf-8")
    return folder


@pytest.mark.parametrize("command", COMMANDS)
@proves("pretrain", "--dataset", "--dataset-config", "--split", "--validation-split")
@proves("prepare", "--dataset", "--dataset-config", "--split", "--validation-split")
def test_a_hub_style_folder_gives_the_config_and_splits_named(
    command, tiny_tokenizer_dir, reference, tmp_path
):
    folder = hub_style_folder(tmp_path / "hub")
    argv = gpt_argv(tiny_tokenizer_dir, "--dataset", str(folder), "--dataset-config", "long")
    argv += ["--text-column", "text"]
    train, validation = built(command, tmp_path / "train", [*argv, "--split", "train"])
    assert input_ids(train) == gpt_blocks(reference, SENTENCES * 2) and validation is None
    argv += ["--split", "validation", "--validation-split", "train"]  # the other way round
    train, validation = built(command, tmp_path / "swapped", argv)
    assert input_ids(train) == gpt_blocks(reference, SENTENCES[1:3])
    assert input_ids(validation) == gpt_blocks(reference, SENTENCES * 2)


@pytest.mark.parametrize("command", COMMANDS)
@proves("pretrain", "--validation-files")
@proves("prepare", "--validation-files")
def test_validation_files_are_the_validation_examples(
    command, tiny_tokenizer_dir, reference, tmp_path
):
    train_file, valid_file = tmp_path / "train.txt", tmp_path / "valid.txt"
    train_file.write_text("\n".join(SENTENCES[:2] * 2) + "\n", encoding="utf-8")
    valid_file.write_text("\n".join(SENTENCES[2:] * 2) + "\n", encoding="utf-8")
    argv = gpt_argv(tiny_tokenizer_dir, "--train-files", str(train_file), "--doc-boundary", "line")
    train, validation = built(
        command, tmp_path / "out", [*argv, "--validation-files", str(valid_file)]
    )
    assert input_ids(train) == gpt_blocks(reference, SENTENCES[:2] * 2)
    assert input_ids(validation) == gpt_blocks(reference, SENTENCES[2:] * 2)


def held_out(text: str, percentage: float) -> bool:
    """--validation-split-percentage's rule: a document is held out when its text's 8-byte
    BLAKE2b digest (little-endian) modulo 10,000 is below percentage x 100."""
    digest = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
    return digest % 10_000 < round(percentage * 100)


@pytest.mark.parametrize("command", COMMANDS)
@proves("pretrain", "--validation-split-percentage")
@proves("prepare", "--validation-split-percentage")
def test_validation_split_percentage_holds_out_the_documents_of_its_hash_share(
    command, tiny_tokenizer_dir, reference, tmp_path
):
    documents = [f"{sentence} number {i} ." for i in range(30) for sentence in SENTENCES[:1]]
    corpus = tmp_path / "lines.txt"
    corpus.write_text("\n".join(documents) + "\n", encoding="utf-8")
    argv = gpt_argv(tiny_tokenizer_dir, "--train-files", str(corpus), "--doc-boundary", "line")
    train, validation = built(
        command, tmp_path / "out", [*argv, "--validation-split-percentage", "30"]
    )
    kept = [text for text in documents if not held_out(text, 30)]
    out = [text for text in documents if held_out(text, 30)]
    assert 4 <= len(out) <= 16  # about 30% of 30: both sides hold examples
    assert input_ids(train) == gpt_blocks(reference, kept)
    assert input_ids(validation) == gpt_blocks(reference, out)


@pytest.mark.parametrize("command", COMMANDS)
@proves("pretrain", "--source-weights")
@proves("prepare", "--source-weights")
def test_sources_are_drawn_by_their_weights(command, tiny_tokenizer_dir, reference, tmp_path):
    """Two sources of 150 one-word documents, drawn 1:3 until both are read through: about
    three times as many of the second's words as of the first's."""
    first, second = "the", "and"
    files = []
    for word in (first, second):
        files.append(tmp_path / f"{word}.txt")
        files[-1].write_text(f"{word}\n" * 150, encoding="utf-8")
    argv = gpt_argv(tiny_tokenizer_dir, "--train-files", *map(str, files), "--doc-boundary", "line")
    train, _ = built(command, tmp_path / "out", [*argv, "--source-weights", "1", "3"])
    tokens = [token for block in input_ids(train) for token in block]
    (first_id,), (second_id,) = ids(reference, first), ids(reference, second)
    counts = {word: tokens.count(token) for word, token in ((first, first_id), (second, second_id))}
    assert 2.3 < counts[second] / counts[first] < 3.9, counts
    assert counts[first] > 140  # every document of both (less a block's rest), the other repeated


# ---------------------------------------------------------------- pretrain's own


@pytest.mark.parametrize(
    ("option", "split"), [("--max-train-samples", 0), ("--max-eval-samples", 1)]
)
@proves("pretrain", "--max-train-samples", "--max-eval-samples")
def test_max_samples_keep_the_first_examples_of_their_split(
    option, split, tiny_tokenizer_dir, reference, tmp_path
):
    corpus = tmp_path / "lines.txt"
    corpus.write_text("\n".join(SENTENCES * 3) + "\n", encoding="utf-8")
    argv = gpt_argv(tiny_tokenizer_dir, "--train-files", str(corpus), "--doc-boundary", "line")
    argv += ["--validation-files", str(corpus), option, "3"]
    examples = built("pretrain", tmp_path / "out", argv)[split]
    assert len(gpt_blocks(reference, SENTENCES * 3)) > 3
    assert input_ids(examples) == gpt_blocks(reference, SENTENCES * 3)[:3]


@proves("pretrain", "--streaming")
def test_a_stream_reads_the_examples_as_it_trains(tiny_tokenizer_dir, reference, tmp_path):
    corpus = tmp_path / "lines.txt"
    corpus.write_text("\n".join(SENTENCES * 3) + "\n", encoding="utf-8")
    argv = gpt_argv(tiny_tokenizer_dir, "--train-files", str(corpus), "--doc-boundary", "line")
    parsed = parse_pretrain_args([*argv, "--streaming", "--output-dir", str(tmp_path)])
    stream = data_of(*parsed).train
    assert isinstance(stream, datasets.IterableDataset)
    assert not list((tmp_path / "hf-cache").rglob("*.arrow"))  # nothing cached
    assert input_ids(map(plain, stream)) == gpt_blocks(reference, SENTENCES * 3)


@proves("pretrain", "--shuffle-buffer")
def test_shuffle_buffer_shuffles_a_stream_within_the_buffer(tiny_tokenizer_dir, tmp_path):
    """A buffer of 4 examples: the example at place i was read at place i + 3 at the latest
    (the buffer fills with 4, then yields one and reads one), and every example comes once."""
    corpus = tmp_path / "lines.txt"
    corpus.write_text("\n".join(f"{s} {i}" for i in range(20) for s in SENTENCES) + "\n")
    argv = gpt_argv(tiny_tokenizer_dir, "--train-files", str(corpus), "--doc-boundary", "line")
    argv += ["--streaming", "--output-dir", str(tmp_path)]
    examples = {}
    for buffer in ([], ["--shuffle-buffer", "4"]):
        stream = data_of(*parse_pretrain_args([*argv, *buffer])).train
        examples[bool(buffer)] = [tuple(example["input_ids"]) for example in stream]
    read, shuffled = examples[False], examples[True]
    assert len(read) > 50 and sorted(shuffled) == sorted(read)
    unread = collections.defaultdict(collections.deque)  # equal examples: the first unread
    for place, example in enumerate(read):
        unread[example].append(place)
    places = [unread[example].popleft() for example in shuffled]
    assert places != sorted(places)
    assert all(place <= index + 3 for index, place in enumerate(places)), places


# ---------------------------------------------------------------- bert's examples


def bert_argv(tokenizer: Path, corpus: Path, *argv: str, seq_len: int = 32) -> list[str]:
    return [
        "--model",
        "bert",
        "--tokenizer",
        str(tokenizer),
        "--seq-len",
        str(seq_len),
        "--train-files",
        str(corpus),
        "--doc-boundary",
        "line",
        *argv,
    ]


@pytest.fixture
def paragraphs(wikitext_slice: Path, tmp_path: Path) -> Path:
    """40 WikiText paragraphs of several sentences, one a line: bert's documents."""
    lines = [line for line in wikitext_slice.read_text(encoding="utf-8").splitlines()]
    long = [line.strip() for line in lines if line.count(" . ") >= 3 and not line.startswith(" =")]
    path = tmp_path / "paragraphs.txt"
    path.write_text("\n".join(long[:40]) + "\n", encoding="utf-8")
    return path


def runs_in(run: list[int], documents: list[list[int]]) -> list[tuple[int, int]]:
    """(document, place) of each appearance of `run` as consecutive tokens in a document
    (places in characters of the ids written out: they order as the tokens do)."""
    needle = "," + ",".join(map(str, run)) + ","
    found = []
    for index, document in enumerate(documents):
        haystack = "," + ",".join(map(str, document)) + ","
        place = haystack.find(needle)
        while place >= 0:
            found.append((index, place))
            place = haystack.find(needle, place + 1)
    return found


def segments(example: dict, tokenizer) -> tuple[list[int], list[int]]:
    """A and B of `[CLS] A [SEP] B [SEP]`, checked against the token types."""
    tokens, types = example["input_ids"], example["token_type_ids"]
    b_start = types.index(1)
    assert tokens[0] == tokenizer.cls_token_id and tokens[b_start - 1] == tokenizer.sep_token_id
    assert tokens[-1] == tokenizer.sep_token_id and types == sorted(types)
    return tokens[1 : b_start - 1], tokens[b_start:-1]


@pytest.mark.parametrize("command", COMMANDS)
@proves("pretrain", "--nsp")
@proves("prepare", "--nsp", "--model")
def test_nsp_makes_sentence_pairs_and_without_it_packed_blocks(
    command, paragraphs, tiny_tokenizer_dir, reference, tmp_path
):
    texts = paragraphs.read_text(encoding="utf-8").splitlines()
    documents = [ids(reference, text) for text in texts]
    pairs, _ = built(command, tmp_path / "nsp", bert_argv(tiny_tokenizer_dir, paragraphs))
    labels = [example["next_sentence_label"] for example in pairs]
    assert 0.3 < sum(labels) / len(labels) < 0.7  # about half NotNext
    for example in pairs:
        assert len(example["input_ids"]) <= 32
        a, b = segments(example, reference)
        found_a, found_b = runs_in(a, documents), runs_in(b, documents)
        assert found_a and found_b  # A and B: each a run of a document's tokens
        if example["next_sentence_label"] == 0:  # IsNext: B follows A in its document
            assert any(d == e and after > at for d, at in found_a for e, after in found_b)
    blocks, _ = built(
        command, tmp_path / "mlm", bert_argv(tiny_tokenizer_dir, paragraphs, "--no-nsp")
    )
    stream = [token for document in documents for token in [*document, reference.sep_token_id]]
    cls, sep = reference.cls_token_id, reference.sep_token_id
    expected = [[cls, *stream[start : start + 30], sep] for start in range(0, len(stream) - 29, 30)]
    assert input_ids(blocks) == expected


@pytest.mark.parametrize("command", COMMANDS)
@proves("pretrain", "--short-seq-prob")
@proves("prepare", "--short-seq-prob")
def test_short_seq_prob_shortens_that_share_of_the_pairs(
    command, paragraphs, tiny_tokenizer_dir, tmp_path
):
    """Each chunk aims at 29 tokens of A and B, or with --short-seq-prob at a random 2 to 29:
    all chunks short make the pairs about half as long."""
    lengths = {}
    for share in ("0", "1"):
        argv = bert_argv(tiny_tokenizer_dir, paragraphs, "--short-seq-prob", share)
        pairs, _ = built(command, tmp_path / share, argv)
        lengths[share] = np.mean([len(example["input_ids"]) for example in pairs])
    assert lengths["0"] > 26 and lengths["1"] < 0.8 * lengths["0"], lengths


def restored(example: dict) -> list[int]:
    """The example's ids before masking: the labels where a position was chosen."""
    return [
        label if label != -100 else token
        for token, label in zip(example["input_ids"], example["labels"], strict=True)
    ]


def masked_examples(command: str, out: Path, argv: list[str]) -> list[dict]:
    """pretrain's examples masked by its collator (new masks each step), prepare's with the
    static masks stored beside them (--dupe-factor 2)."""
    if command == "prepare":
        examples, _ = built(command, out / "folder", [*argv, "--dupe-factor", "2"])
        return examples
    data = data_of(*parse_pretrain_args([*argv, "--output-dir", str(out)]))
    examples = [plain(example) for example in data.train]
    batch = data.collator([{"input_ids": example["input_ids"]} for example in examples])
    return [
        {"input_ids": row.tolist(), "labels": labels.tolist()}
        for row, labels in zip(batch["input_ids"], batch["labels"], strict=True)
    ]


@pytest.mark.parametrize("command", COMMANDS)
@proves("pretrain", "--mlm-probability")
@proves("prepare", "--mlm-probability")
def test_mlm_probability_masks_that_share_of_each_sequence(
    command, paragraphs, tiny_tokenizer_dir, reference, tmp_path
):
    """BERT's count: round(p x the sequence's tokens that are not special), at least 1."""
    special = set(reference.all_special_ids)
    argv = bert_argv(tiny_tokenizer_dir, paragraphs, "--no-nsp", "--mlm-probability", "0.3")
    examples = masked_examples(command, tmp_path, argv)
    for example in examples:
        masked = sum(label != -100 for label in example["labels"])
        tokens = sum(token not in special for token in restored(example))
        assert masked == max(1, round(0.3 * tokens)), (masked, tokens)
    assert len(examples) > 20


def split_words(example: dict, continuation: np.ndarray, special: set[int]) -> int:
    """How many words are masked in part: a piece chosen while another piece of its word is
    not (a block may start inside a word: its pieces there make a word of their own)."""
    tokens, chosen = restored(example), [label != -100 for label in example["labels"]]
    words, current = [], []
    for position, token in enumerate(tokens):
        if current and (token in special or not continuation[token]):
            words.append(current)
            current = []
        if token not in special:
            current.append(position)
    words.append(current)
    return sum(len({chosen[position] for position in word}) > 1 for word in words)


@pytest.mark.parametrize("command", COMMANDS)
@proves("pretrain", "--whole-word-mask")
@proves("prepare", "--whole-word-mask")
def test_whole_word_mask_masks_every_piece_of_a_chosen_word(
    command, paragraphs, tiny_tokenizer_dir, reference, tmp_path
):
    continuation = np.array(
        [token.startswith("##") for token in reference.convert_ids_to_tokens(range(len(reference)))]
    )
    argv = bert_argv(tiny_tokenizer_dir, paragraphs, "--no-nsp", "--mlm-probability", "0.3")
    split = {}
    for whole in ("false", "true"):
        examples = masked_examples(command, tmp_path / whole, [*argv, "--whole-word-mask", whole])
        special = set(reference.all_special_ids)
        split[whole] = sum(split_words(example, continuation, special) for example in examples)
    assert split["true"] == 0 and split["false"] > 10, split


@pytest.mark.parametrize("command", COMMANDS)
@proves("pretrain", "--dupe-factor")
@proves("prepare", "--dupe-factor")
def test_dupe_factor_makes_that_many_copies_each_masked_its_own_way(
    command, paragraphs, tiny_tokenizer_dir, tmp_path
):
    argv = bert_argv(tiny_tokenizer_dir, paragraphs, "--no-nsp")
    once, _ = built(command, tmp_path / "once", argv)
    copies, _ = built(command, tmp_path / "thrice", [*argv, "--dupe-factor", "3"])
    assert "labels" not in once[0] and len(copies) == 3 * len(once)
    thirds = [copies[index :: len(once)] for index in range(len(once))]
    for example, (first, second, third) in zip(once, thirds, strict=True):
        assert restored(first) == restored(second) == restored(third) == example["input_ids"]
    masks = [[label != -100 for label in example["labels"]] for example in copies]
    assert masks[: len(once)] != masks[len(once) : 2 * len(once)]


@pytest.mark.parametrize("command", COMMANDS)
@proves("pretrain", "--seed")
@proves("prepare", "--seed")
def test_seed_draws_the_static_masks_and_the_pairs(
    command, paragraphs, tiny_tokenizer_dir, tmp_path
):
    """Another seed: other masks of the same blocks, other pairs. prepare --seed S stores what a
    pretraining run of --seed S builds."""
    static = bert_argv(tiny_tokenizer_dir, paragraphs, "--no-nsp", "--dupe-factor", "2")
    pairs = bert_argv(tiny_tokenizer_dir, paragraphs)
    for argv in (static, pairs):
        made = [
            built(command, tmp_path / f"{len(argv)}-{seed}", [*argv, "--seed", seed])[0]
            for seed in ("1", "2")
        ]
        assert made[0] != made[1]
        if argv is static:
            assert [restored(example) for example in made[0]] == [restored(e) for e in made[1]]
        if command == "prepare":
            assert made[0] == built("pretrain", tmp_path / "run", [*argv, "--seed", "1"])[0]


@pytest.mark.parametrize("command", COMMANDS)
@proves("pretrain", "--num-proc")
@proves("prepare", "--num-proc")
def test_num_proc_builds_the_examples_in_that_many_processes(
    command, paragraphs, tiny_tokenizer_dir, tmp_path, monkeypatch, capfd
):
    """The same examples; `datasets` maps them in 2 processes (its progress bars say so, one a
    map: tokens, then pairs)."""
    argv = bert_argv(tiny_tokenizer_dir, paragraphs)
    one, _ = built(command, tmp_path / "one", argv)
    # a cache of its own: the second build runs its maps rather than reading the first's
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "second-cache")
    capfd.readouterr()
    two, _ = built(command, tmp_path / "two", [*argv, "--num-proc", "2"])
    progress = capfd.readouterr().err
    assert "tokenizing (num_proc=2)" in progress
    assert "building NSP pairs (num_proc=2)" in progress
    assert two == one


# ---------------------------------------------------------------- prepare's own


@proves("prepare", "--output-dir")
def test_prepare_writes_its_folder_at_output_dir(tiny_tokenizer_dir, reference, tmp_path):
    corpus = tmp_path / "lines.txt"
    corpus.write_text("\n".join(SENTENCES * 2) + "\n", encoding="utf-8")
    argv = gpt_argv(tiny_tokenizer_dir, "--train-files", str(corpus), "--doc-boundary", "line")
    manifest = prepare(*parse_prepare_args([*argv, "--output-dir", str(tmp_path / "here")]))
    assert manifest["folder"] == str(tmp_path / "here")
    examples = PreparedFolder(tmp_path / "here").examples("train")
    assert input_ids(map(plain, examples)) == gpt_blocks(reference, SENTENCES * 2)


@proves("prepare", "--streaming", "--shuffle-buffer", "--data")
def test_prepare_refuses_what_belongs_to_a_run(tiny_tokenizer_dir, tmp_path):
    argv = gpt_argv(
        tiny_tokenizer_dir, "--train-files", "a.txt", "--output-dir", str(tmp_path / "x")
    )
    for extra, message in (
        (["--streaming"], "leave out --streaming"),
        (["--streaming", "--shuffle-buffer", "4"], "leave out --streaming"),
        (["--shuffle-buffer", "4"], "--shuffle-buffer N .* use it with --streaming"),
        (["--data", str(tmp_path)], "give --output-dir, not --data"),
    ):
        with pytest.raises(ConfigError, match=message):
            prepare(*parse_prepare_args([*argv, *extra]))
    assert not (tmp_path / "x").exists()


@proves("prepare", "--preset", "--init-from", "--config-overrides", "--allow-pickle")
@proves("prepare", "--objective", "--max-eval-samples", "--card-datasets", "--license")
def test_options_of_the_model_and_the_run_leave_the_examples_alone(
    paragraphs, tiny_tokenizer_dir, tmp_path, capsys
):
    """prepare takes them (one --config for both commands) and ignores them: preparing again
    with them changed is the same folder, nothing to do."""
    argv = bert_argv(
        tiny_tokenizer_dir, paragraphs, "--no-nsp", "--output-dir", str(tmp_path / "f")
    )
    prepare(*parse_prepare_args(argv))
    written = {path: path.stat().st_mtime_ns for path in (tmp_path / "f").rglob("*")}
    others = ["--preset", "base", "--init-from", str(tmp_path), "--allow-pickle", "--objective"]
    others += ["rtd", "--max-eval-samples", "3", "--card-datasets", "a/b", "--license", "mit"]
    for changed in (others, ["--config-overrides", "hidden_size=64"]):
        capsys.readouterr()
        prepare(*parse_prepare_args([*argv, *changed]))
        assert "nothing to do" in capsys.readouterr().out
    assert {path: path.stat().st_mtime_ns for path in (tmp_path / "f").rglob("*")} == written
