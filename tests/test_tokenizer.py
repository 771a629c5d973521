"""The shared tokenizer: training, the three loading routes, stats and the error paths."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from datasets import Dataset
from option_coverage import proves
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from egbert.cli import main as egbert_main
from egbert.errors import CheckpointError, ConfigError, DataError
from egbert.tokenizer import (
    KINDS,
    SPECIAL_TOKENS,
    check_vocab_matches,
    load_tokenizer,
    tokenizer_for_family,
    tokenizer_stats,
    train_tokenizer,
)

PAIR = ("The cat sat on the mat .", "It was very happy there .")


def encode_pair_tokens(tokenizer) -> tuple[list[str], list[int]]:
    encoded = tokenizer(*PAIR)
    return tokenizer.convert_ids_to_tokens(encoded["input_ids"]), encoded["token_type_ids"]


def test_saved_tokenizer_loads_with_auto_tokenizer_and_encodes_bert_pairs(tiny_tokenizer_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    tokens, type_ids = encode_pair_tokens(tokenizer)
    first_sep = tokens.index("[SEP]")
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and tokens.count("[SEP]") == 2
    assert type_ids == [0] * (first_sep + 1) + [1] * (len(tokens) - first_sep - 1)
    ids = tokenizer(PAIR[0])["input_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "The cat sat on the mat."
    for token in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<|endoftext|>"):
        assert tokenizer.convert_tokens_to_ids(token) != tokenizer.unk_token_id or token == "[UNK]"
    assert tokenizer.eos_token == "<|endoftext|>" and tokenizer.pad_token == "[PAD]"


def test_byte_level_bpe_round_trips_any_text(wikitext_slice, tmp_path):
    tokenizer = train_tokenizer([wikitext_slice], kind="bpe", vocab_size=600, out_dir=tmp_path)
    text = "naïve café — 東京 emoji 🙂"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids) == text
    tokens, _ = encode_pair_tokens(AutoTokenizer.from_pretrained(tmp_path))
    assert tokens[0] == "[CLS]" and tokens.count("[SEP]") == 2


def test_lowercase_option(wikitext_slice, tmp_path):
    tokenizer = train_tokenizer([wikitext_slice], vocab_size=500, lowercase=True)
    assert tokenizer.tokenize("The CAT") == tokenizer.tokenize("the cat")


def test_loads_a_stock_bert_vocab_txt(minilm_dir, tmp_path):
    shutil.copy(minilm_dir / "vocab.txt", tmp_path / "vocab.txt")
    ours = load_tokenizer(tmp_path)
    stock = AutoTokenizer.from_pretrained(minilm_dir)
    encoded = ours(*PAIR)
    assert encoded["input_ids"] == stock(*PAIR)["input_ids"]
    assert encoded["token_type_ids"] == stock(*PAIR)["token_type_ids"]
    assert load_tokenizer(tmp_path / "vocab.txt")(PAIR[0])["input_ids"] == encoded["input_ids"][:9]


def test_loads_gpt2_vocab_and_merges(tiny_gpt2_dir, tmp_path):
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(tiny_gpt2_dir / name, tmp_path / name)
    ours = load_tokenizer(tmp_path)
    stock = AutoTokenizer.from_pretrained(tiny_gpt2_dir)
    text = "Hello world, this is GPT-2's byte-level BPE."
    assert ours(text)["input_ids"] == stock(text)["input_ids"]
    assert ours.eos_token == "<|endoftext|>" and len(ours) == 50257
    assert ours.decode(ours(text)["input_ids"]) == text


def test_family_tokenizers_encode_what_each_family_was_pretrained_on(tiny_tokenizer_dir, tmp_path):
    shared = load_tokenizer(tiny_tokenizer_dir)
    a, b = (shared(text, add_special_tokens=False)["input_ids"] for text in PAIR)
    bert = tokenizer_for_family(shared, "bert", 128)
    cls, sep = shared.cls_token_id, shared.sep_token_id
    assert bert(*PAIR)["input_ids"] == [cls, *a, sep, *b, sep]
    assert bert.model_max_length == 128 and "token_type_ids" in bert(PAIR[0])
    for family in ("gpt", "elmo"):
        tokenizer = tokenizer_for_family(shared, family, 64)
        assert tokenizer(PAIR[0])["input_ids"] == a  # as pretraining packs a document
        assert tokenizer(*PAIR)["input_ids"] == [*a, shared.eos_token_id, *b]
        assert tokenizer.model_max_length == 64 and "token_type_ids" not in tokenizer(PAIR[0])
        assert len(tokenizer(" ".join(PAIR) * 20, truncation=True)["input_ids"]) == 64
        tokenizer.save_pretrained(tmp_path / family)
        assert "token_type_ids" not in load_tokenizer(tmp_path / family)(PAIR[0])


def test_the_bert_family_needs_cls_and_sep_tokens(tiny_gpt2_dir):
    with pytest.raises(CheckpointError, match=r"no \[CLS\]/\[SEP\] tokens"):
        tokenizer_for_family(load_tokenizer(tiny_gpt2_dir), "bert", 1024)


def test_stats_report_sensible_numbers(tiny_tokenizer_dir, wikitext_slice):
    stats = tokenizer_stats(load_tokenizer(tiny_tokenizer_dir), [wikitext_slice])
    assert stats["lines"] > 1000 and stats["tokens"] > stats["words"] > 0
    assert 1.0 < stats["tokens_per_word"] < 3.0
    assert 0.0 <= stats["unknown_rate"] < 0.01
    assert stats["length_p50"] <= stats["length_p90"] <= stats["length_p99"] <= stats["length_max"]


def test_vocab_mismatch_is_refused(tiny_tokenizer_dir):
    tokenizer = load_tokenizer(tiny_tokenizer_dir)
    check_vocab_matches(tokenizer, len(tokenizer), "model")
    with pytest.raises(CheckpointError, match="vocab_size 500"):
        check_vocab_matches(tokenizer, 500, "model")


@pytest.mark.parametrize(
    ("make_input", "error", "message"),
    [
        (lambda tmp: tmp / "absent.txt", DataError, "no such file"),
        (lambda tmp: _write(tmp / "empty.txt", b""), DataError, "empty"),
        (lambda tmp: _write(tmp / "blank.txt", b"\n \n\n"), DataError, "no text"),
        (lambda tmp: _write(tmp / "latin.txt", b"ok\ncaf\xe9\n"), DataError, "offset 6"),
    ],
)
def test_bad_corpus_files_fail_with_one_clear_error(tmp_path, make_input, error, message):
    out = tmp_path / "out"
    with pytest.raises(error, match=message):
        train_tokenizer([make_input(tmp_path)], vocab_size=100, out_dir=out)
    assert not out.exists()


def test_latin1_book_needs_its_encoding(data_dir, tmp_path):
    book = data_dir / "corpus" / "gutenberg" / "chesterton-ball.txt"
    with pytest.raises(DataError, match="offset 229333.*--encoding latin-1"):
        train_tokenizer([book], vocab_size=200)
    tokenizer = train_tokenizer([book], vocab_size=300, encoding="latin-1")
    assert len(tokenizer) == 300


def test_vocab_size_below_the_special_tokens_is_refused(wikitext_slice):
    with pytest.raises(ConfigError, match="too small"):
        train_tokenizer([wikitext_slice], vocab_size=5)
    with pytest.raises(ConfigError, match="256 bytes"):
        train_tokenizer([wikitext_slice], kind="bpe", vocab_size=100)


def test_missing_tokenizer_directory_is_a_checkpoint_error(tmp_path):
    with pytest.raises(CheckpointError, match="no tokenizer found"):
        load_tokenizer(tmp_path)


def test_cli_train_then_stats(wikitext_slice, tmp_path, capsys):
    out = tmp_path / "tok"
    egbert_main(
        [
            "tokenizer",
            "train",
            "--files",
            str(wikitext_slice),
            "--vocab-size",
            "400",
            "--out",
            str(out),
        ]
    )
    assert (out / "tokenizer.json").is_file()
    egbert_main(["tokenizer", "stats", "--tokenizer", str(out), "--files", str(wikitext_slice)])
    assert "tokens_per_word" in capsys.readouterr().out


def test_cli_error_is_one_line_and_nonzero(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        egbert_main(
            [
                "tokenizer",
                "train",
                "--files",
                str(tmp_path / "nope.txt"),
                "--out",
                str(tmp_path / "o"),
            ]
        )
    assert exit_info.value.code != 0
    message = str(exit_info.value.code)
    assert message.startswith("egbert tokenizer: error:") and "\n" not in message
    assert not (tmp_path / "o").exists()


def _write(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    return path


# ---------------------------------------------------------------- the corpora pretraining reads

MARK = "zyxq"  # a word WikiText lacks: in a vocabulary only where rows of it were read
CONFIGS_README = """---
configs:
- config_name: plain
  data_files:
  - {split: train, path: plain/train.parquet}
  - {split: validation, path: plain/validation.parquet}
- config_name: marked
  data_files:
  - {split: train, path: marked/train.parquet}
  - {split: validation, path: marked/validation.parquet}
---
"""


@pytest.fixture(scope="module")
def shapes(wikitext_slice: Path, tmp_path_factory) -> dict[str, Path]:
    """150 lines of WikiText-2 in every shape pretraining reads, one text a line or a row."""
    root = tmp_path_factory.mktemp("shapes")
    lines = [line.strip() for line in wikitext_slice.read_text().splitlines() if line.strip()]
    lines = lines[:150]
    table = Dataset.from_dict(
        {"id": list(range(len(lines))), "content": lines, "title": [MARK] * len(lines)}
    )
    paths = {"txt": root / "wiki.txt", "gz": root / "wiki.txt.gz", "jsonl": root / "docs.jsonl"}
    paths["txt"].write_text("\n".join(lines) + "\n", encoding="utf-8")
    with gzip.open(paths["gz"], "wt", encoding="utf-8") as handle:
        handle.write(paths["txt"].read_text(encoding="utf-8"))
    rows = [{"meta": {"source": "café", "line": i}, "text": line} for i, line in enumerate(lines)]
    paths["jsonl"].write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    for name in ("parquet", "csv"):
        paths[name] = root / f"docs.{name}"
        getattr(table.remove_columns("title"), f"to_{name}")(paths[name])
    paths["saved"] = root / "saved"
    table.remove_columns("title").save_to_disk(paths["saved"])
    paths["hub"] = root / "hub"  # a Hub repository's layout: parquet shards under data/
    (paths["hub"] / "data").mkdir(parents=True)
    for index in range(2):
        shard = table.shard(2, index, contiguous=True).remove_columns("title")
        shard.to_parquet(paths["hub"] / "data" / f"train-0000{index}-of-00002.parquet")
    paths["titled"] = root / "titled.parquet"  # two text columns: content and title
    table.remove_columns("id").to_parquet(paths["titled"])
    paths["marks"] = root / "marks.txt"
    paths["marks"].write_text(f"{MARK}\n" * 3, encoding="utf-8")
    paths["configs"] = root / "configs"  # two configurations with two splits each
    marked = Dataset.from_dict({"content": [MARK] * 20})  # a split's columns: its config's
    for config, validation in (("plain", table.select_columns("content")), ("marked", marked)):
        (paths["configs"] / config).mkdir(parents=True)
        table.select_columns("content").to_parquet(paths["configs"] / config / "train.parquet")
        validation.to_parquet(paths["configs"] / config / "validation.parquet")
    (paths["configs"] / "README.md").write_text(CONFIGS_README, encoding="utf-8")
    return paths


def trained_vocab(tmp_path: Path, *options: str) -> dict[str, int]:
    """`egbert tokenizer train OPTIONS` -> the saved vocabulary (byte-level BPE of 300 tokens:
    its training is deterministic, where WordPiece's breaks ties by hash order)."""
    out = tmp_path / f"tokenizer-{len(list(tmp_path.iterdir()))}"
    argv = ["tokenizer", "train", *options, "--kind", "bpe", "--vocab-size", "300"]
    egbert_main([*argv, "--out", str(out)])
    return AutoTokenizer.from_pretrained(out).get_vocab()


@proves("tokenizer train", "--files", "--dataset")
def test_the_tokenizer_learns_the_same_vocabulary_from_every_shape_of_a_corpus(shapes, tmp_path):
    """The texts pretraining reads, whatever the files: not the JSON around them, not the
    compressed bytes (the vocabulary of the plain text has no `meta` or `u00e9`)."""
    plain = trained_vocab(tmp_path, "--files", str(shapes["txt"]))
    assert "meta" not in plain and not any("u00e9" in token for token in plain)
    for shape in ("gz", "jsonl", "parquet", "csv", "saved", "hub"):
        assert trained_vocab(tmp_path, "--files", str(shapes[shape])) == plain, shape
    assert trained_vocab(tmp_path, "--dataset", str(shapes["hub"])) == plain
    # sources of two kinds, unweighted: one after the other, as pretraining reads them
    lines = shapes["txt"].read_text(encoding="utf-8").splitlines(keepends=True)
    (tmp_path / "first.txt").write_text("".join(lines[:75]), encoding="utf-8")
    rest = "".join(json.dumps({"text": line.strip()}) + "\n" for line in lines[75:])
    (tmp_path / "rest.jsonl").write_text(rest, encoding="utf-8")
    files = [str(tmp_path / "first.txt"), str(tmp_path / "rest.jsonl")]
    assert trained_vocab(tmp_path, "--files", *files) == plain


@proves("tokenizer train", "--text-column", "--source-weights")
def test_the_text_column_and_source_weights_decide_what_the_tokenizer_reads(shapes, tmp_path):
    assert MARK not in trained_vocab(tmp_path, "--files", str(shapes["titled"]))  # content
    assert MARK in trained_vocab(
        tmp_path, "--files", str(shapes["titled"]), "--text-column", "title"
    )
    # three lines of MARK beside 150 of WikiText: learned only where the mix draws them often
    sources = ["--files", str(shapes["marks"]), str(shapes["txt"])]
    assert MARK not in trained_vocab(tmp_path, *sources)
    assert MARK in trained_vocab(tmp_path, *sources, "--source-weights", "10", "1")


@proves("tokenizer train", "--dataset-config", "--split")
def test_the_dataset_config_and_split_name_the_part_of_a_data_set_read(shapes, tmp_path):
    dataset = ["--dataset", str(shapes["configs"])]
    assert MARK in trained_vocab(
        tmp_path, *dataset, "--dataset-config", "marked", "--split", "validation"
    )
    assert MARK not in trained_vocab(tmp_path, *dataset, "--dataset-config", "marked")  # train
    assert MARK not in trained_vocab(
        tmp_path, *dataset, "--dataset-config", "plain", "--split", "validation"
    )


# ---------------------------------------------------------------- the options of the command

MADE_UP = "zorblax"  # a word of the test corpus only


def corpus_with(tmp_path: Path, made_up_times: int, encoding: str = "utf-8") -> Path:
    """Common words many times, the made-up word `made_up_times` times, café in every line."""
    lines = [f"The river ran past the café and the town {i % 7} ." for i in range(120)]
    lines += [f"We saw {MADE_UP} there ." for _ in range(made_up_times)]
    path = tmp_path / f"corpus-{made_up_times}-{encoding}.txt"
    path.write_bytes(("\n".join(lines) + "\n").encode(encoding))
    return path


def cli_tokenizer(out: Path, *argv: str) -> AutoTokenizer:
    egbert_main(["tokenizer", "train", *argv, "--out", str(out)])
    return AutoTokenizer.from_pretrained(out)


@proves("tokenizer train", "--files", "--kind", "--vocab-size", "--out")
def test_train_learns_a_tokenizer_of_the_kind_and_size_asked_from_the_files(
    wikitext_slice, tmp_path
):
    corpus = corpus_with(tmp_path, 10_000)  # among the corpus's most frequent words
    for kind, model, vocab_size, word in (
        ("wordpiece", "WordPiece", 700, MADE_UP),
        ("bpe", "BPE", 400, f"\u0120{MADE_UP}"),  # byte-level: Ġ marks the space before a word
    ):
        files = ["--files", str(wikitext_slice), str(corpus), "--vocab-size", str(vocab_size)]
        tokenizer = cli_tokenizer(tmp_path / kind, *files, "--kind", kind)
        saved = json.loads((tmp_path / kind / "tokenizer.json").read_text(encoding="utf-8"))
        assert saved["model"]["type"] == model and len(tokenizer) == vocab_size
        assert word in tokenizer.get_vocab()  # learned from the second file
        without = cli_tokenizer(tmp_path / f"{kind}-wiki", *files[:2], *files[3:], "--kind", kind)
        assert word not in without.get_vocab()


@proves("tokenizer train", "--lowercase", "--min-frequency", "--encoding")
def test_train_lowercases_keeps_only_frequent_pieces_and_decodes_the_files(tmp_path):
    """A vocabulary too large to fill: the trainer learns every merge that occurs at least
    --min-frequency times, so the made-up word (3 times) becomes a token at 2, not at 4."""
    corpus = corpus_with(tmp_path, 3, encoding="latin-1")
    argv = ["--files", str(corpus), "--encoding", "latin-1", "--vocab-size", "5000"]
    kept = cli_tokenizer(tmp_path / "two", *argv, "--min-frequency", "2")
    dropped = cli_tokenizer(tmp_path / "four", *argv, "--min-frequency", "4")
    assert MADE_UP in kept.get_vocab() and MADE_UP not in dropped.get_vocab()
    assert "café" in kept.get_vocab()  # é read as Latin-1: one character, not two bytes
    assert kept.tokenize("The CAFÉ") != kept.tokenize("the café")
    lowered = cli_tokenizer(tmp_path / "lower", *argv, "--lowercase")
    assert lowered.tokenize("The CAFÉ") == lowered.tokenize("the cafe")  # accents stripped too
    with pytest.raises(SystemExit, match="byte 0xe9 at offset"):
        egbert_main(["tokenizer", "train", *argv[:2], "--out", str(tmp_path / "utf8")])


@proves("tokenizer train", "--encoding-errors")
@proves("tokenizer stats", "--encoding-errors")
def test_encoding_errors_say_what_becomes_of_undecodable_bytes(
    tiny_tokenizer_dir, tmp_path, capsys
):
    """Latin-1 bytes read as UTF-8: a strict read stops and names --encoding-errors; `ignore`
    drops the bytes and `replace` puts U+FFFD for each, as Python's own decoding does."""
    corpus = tmp_path / "latin1.txt"
    corpus.write_bytes("the river ran past the café à midi .\n".encode("latin-1") * 50)
    argv = ["--files", str(corpus), "--vocab-size", "5000"]
    with pytest.raises(SystemExit, match="or replace such bytes \\(--encoding-errors replace\\)"):
        cli_tokenizer(tmp_path / "strict", *argv)
    assert "caf" in cli_tokenizer(tmp_path / "ignore", *argv, "--encoding-errors", "ignore").vocab
    stats = ["tokenizer", "stats", "--tokenizer", str(tiny_tokenizer_dir), "--files", str(corpus)]
    capsys.readouterr()  # what train printed
    for errors in ("ignore", "replace"):  # "à" a word of its own: a U+FFFD, or nothing
        egbert_main([*stats, "--encoding-errors", errors, "--json"])
        words = len(corpus.read_bytes().decode("utf-8", errors).split())
        assert json.loads(capsys.readouterr().out)["words"] == words


@proves("tokenizer stats", "--tokenizer", "--files", "--encoding", "--json")
def test_stats_count_the_lines_words_and_tokens_of_the_files(
    tiny_tokenizer_dir, wikitext_slice, tmp_path, capsys
):
    corpus = corpus_with(tmp_path, 5, encoding="latin-1")
    lines = [line for line in corpus.read_text(encoding="latin-1").splitlines() if line.strip()]
    other = tmp_path / "other"
    train_tokenizer([wikitext_slice], vocab_size=500, out_dir=other)
    for folder in (tiny_tokenizer_dir, other):
        reference = AutoTokenizer.from_pretrained(folder)
        argv = ["--tokenizer", str(folder), "--files", str(corpus), "--encoding", "latin-1"]
        egbert_main(["tokenizer", "stats", *argv, "--json"])
        stats = json.loads(capsys.readouterr().out)
        tokens = [len(reference(line, add_special_tokens=False)["input_ids"]) for line in lines]
        assert stats["vocab_size"] == len(reference) and stats["lines"] == len(lines)
        assert stats["words"] == sum(len(line.split()) for line in lines)
        assert stats["tokens"] == sum(tokens) and stats["length_max"] == max(tokens)
        egbert_main(["tokenizer", "stats", *argv])
        table = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
        assert table["tokens"] == f"{sum(tokens):,}"  # without --json: a table for people
    with pytest.raises(SystemExit, match="byte 0xe9 at offset"):
        egbert_main(["tokenizer", "stats", *argv[:4]])


TRAIN_IN_A_FRESH_PROCESS = """
import sys
from egbert.tokenizer import KINDS, train_tokenizer
for kind in KINDS:
    train_tokenizer([sys.argv[1]], kind=kind, vocab_size=1000, out_dir=f"{sys.argv[2]}/{kind}",
                    show_progress=False)
"""


def test_training_gives_the_same_file_in_every_fresh_process(
    wikitext_slice, subprocess_env, tmp_path
):
    """WordPiece's `##` pieces are numbered in hash-map order upstream (huggingface/tokenizers
    #1794), a new order in each process: three processes, started together, must still write
    byte-identical files of each kind."""
    runs = [tmp_path / f"run-{run}" for run in range(3)]
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", TRAIN_IN_A_FRESH_PROCESS, str(wikitext_slice), str(out)],
            env=subprocess_env,
        )
        for out in runs
    ]
    assert [process.wait(timeout=300) for process in processes] == [0] * len(processes)
    for kind in KINDS:
        files = [(run / kind / "tokenizer.json").read_bytes() for run in runs]
        assert files[0] == files[1] == files[2], kind


def test_wordpiece_learns_the_pieces_of_the_stock_trainer(wikitext_slice, tmp_path):
    """egbert's way round #1794 learns what `WordPieceTrainer` learns, up to its ties: the same
    alphabet, each character both as a word's start and as a `##` piece (characters beyond
    U+1FFFF included), and nearly every merged piece; and a
    tokenizer trained the stock way, as before the fix, still loads and encodes as it did."""
    corpus = tmp_path / "corpus.txt"
    rare = "x\U000e0100\U00030001y"  # a variation selector and a CJK Extension G character
    text = wikitext_slice.read_text(encoding="utf-8")
    corpus.write_text(f"{text}\n{rare} {rare} and ñandú 𝔸𝔹ℂ\n", encoding="utf-8")
    stock = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    stock.normalizer = normalizers.BertNormalizer(lowercase=False, strip_accents=False)
    stock.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    options = {"vocab_size": 1000, "min_frequency": 2, "show_progress": False}
    trainer = trainers.WordPieceTrainer(special_tokens=SPECIAL_TOKENS, **options)
    stock.train([str(corpus)], trainer=trainer)
    ours = set(train_tokenizer([corpus], vocab_size=1000, show_progress=False).get_vocab())
    expected = set(stock.get_vocab())

    def alphabet(vocab: set[str]) -> set[str]:
        return {piece for piece in vocab if len(piece.removeprefix("##")) == 1}

    assert alphabet(ours) == alphabet(expected)
    assert {f"##{char}" for char in rare[1:]} <= ours
    assert len(ours) == len(expected) and len(ours ^ expected) <= 0.02 * len(expected)
    old = tmp_path / "old-tokenizer"
    stock.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        special_tokens=[(t, stock.token_to_id(t)) for t in ("[CLS]", "[SEP]")],
    )
    PreTrainedTokenizerFast(tokenizer_object=stock, unk_token="[UNK]").save_pretrained(old)
    line = "The ñandú of Valkyria Chronicles III was released in 2011 ."
    assert load_tokenizer(old)(line)["input_ids"] == stock.encode(line).ids
