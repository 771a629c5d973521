"""Prepared folders (`egbert prepare`, `pretrain --data DIR`): the examples read back equal
those pretrain builds in memory, the token dtype, refusals on a mismatch, and a SIGKILL + resume
from a folder (two processes on a folder: tests/test_torchrun.py)."""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import kill_once
from option_coverage import proves
from safetensors.torch import load_file
from test_pretrain_run import _newest_checkpoint_epoch, split_records
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

import egbert
from egbert.cli import main as cli_main
from egbert.errors import ConfigError, DataError
from egbert.pretrain.corpus import build_examples
from egbert.pretrain.options import DataArguments, ObjectiveArguments
from egbert.pretrain.prepared_folder import (
    PreparedFolder,
    files_hash,
    folder_for_run,
    read_manifest,
)
from egbert.pretrain.run import parse_pretrain_args, pretrain_arguments
from egbert.pretrain.shard_writer import token_dtype, write_examples

pytestmark = pytest.mark.usefixtures("one_thread_and_fresh_accelerate")


@pytest.fixture(scope="module")
def corpus(wikitext_slice: Path, tmp_path_factory) -> dict[str, Path]:
    """600 lines of the slice to train on, the next 200 to validate on."""
    folder = tmp_path_factory.mktemp("prepared-corpus")
    lines = wikitext_slice.read_text(encoding="utf-8").splitlines(keepends=True)
    (folder / "train.tokens").write_text("".join(lines[:600]), encoding="utf-8")
    (folder / "valid.tokens").write_text("".join(lines[600:800]), encoding="utf-8")
    return {"train": folder / "train.tokens", "valid": folder / "valid.tokens"}


def options(family: str, tokenizer: Path, corpus: dict[str, Path], **extra) -> dict:
    return {
        "model": family,
        "tokenizer": str(tokenizer),
        "train_files": [str(corpus["train"])],
        "validation_files": [str(corpus["valid"])],
        "doc_boundary": "wikitext",
        "seq_len": 32,
        **extra,
    }


def as_lists(example: dict) -> dict:
    return {name: np.asarray(value).tolist() for name, value in example.items()}


@pytest.mark.parametrize(
    ("family", "extra", "columns"),
    [
        ("bert", {}, {"input_ids", "token_type_ids", "next_sentence_label"}),
        (
            "bert",
            {"nsp": False, "dupe_factor": 2, "whole_word_mask": True},
            {"input_ids", "labels"},
        ),
        ("gpt", {}, {"input_ids"}),
        ("elmo", {"seq_len": 24}, {"input_ids"}),
    ],
    ids=["bert-nsp", "bert-static-masks", "gpt", "elmo"],
)
def test_prepared_examples_equal_those_built_in_memory(
    family, extra, columns, corpus, tiny_tokenizer_dir, tmp_path
):
    run_options = options(family, tiny_tokenizer_dir, corpus, **extra)
    manifest = egbert.prepare_corpus(**run_options, output_dir=str(tmp_path / "folder"), seed=7)
    folder = PreparedFolder(tmp_path / "folder")
    model_args, data_args, objective_args, _ = pretrain_arguments(
        **run_options, output_dir=str(tmp_path / "unused")
    )
    tokenizer = folder.load_tokenizer(str(tiny_tokenizer_dir))  # the same tokenizer: accepted
    parts = (model_args.model, data_args, objective_args, tokenizer)
    for split, files in (
        ("train", data_args.train_files),
        ("validation", data_args.validation_files),
    ):
        in_memory, _ = build_examples(*parts, files, seed=7)
        read_back = folder.examples(split)
        assert len(read_back) == len(in_memory) == manifest["splits"][split]["examples"] > 10
        for index in range(len(in_memory)):
            example = as_lists(read_back[index])
            assert set(example) == columns
            assert example == {name: in_memory[index][name] for name in columns}, index
        tokens = sum(len(example["input_ids"]) for example in in_memory)
        assert manifest["splits"][split]["tokens"] == tokens
    assert manifest["dtype"] == "uint16" and manifest["family"] == family
    assert manifest["splits"]["train"]["documents"] > 1
    files = {path.name for path in (tmp_path / "folder" / "train").iterdir()}
    assert ("00000.segment_b_start.npy" in files) == ("token_type_ids" in columns)
    assert ("00000.labels.bin" in files) == ("labels" in columns)
    ids = np.fromfile(tmp_path / "folder/train/00000.input_ids.bin", dtype=np.uint16)
    assert len(ids) == manifest["splits"]["train"]["tokens"]  # two bytes a token, no more


def test_shards_split_a_large_split_and_read_back_in_order(tmp_path):
    from datasets import Dataset

    rows = [list(range(i, i + 1 + i % 5)) for i in range(300)]
    written = write_examples(
        Dataset.from_dict({"input_ids": rows}), tmp_path / "train", np.uint16, 100
    )
    tokens = [shard["tokens"] for shard in written["shards"]]
    assert len(tokens) == 10 and all(95 < count <= 100 for count in tokens[:-1])
    assert written["examples"] == 300 and written["tokens"] == 900
    folder = tmp_path / "train"
    from egbert.pretrain.prepared_folder import PreparedExamples

    examples = PreparedExamples(folder, written, np.uint16)
    assert [examples[i]["input_ids"].tolist() for i in range(300)] == rows
    with pytest.raises(IndexError):
        examples[300]


def test_token_dtype_is_uint16_while_every_id_fits():
    assert token_dtype(1000) is np.uint16
    assert token_dtype(2**16) is np.uint16  # ids 0 .. 65,535
    assert token_dtype(2**16 + 1) is np.uint32


def test_a_vocabulary_over_65536_is_stored_as_uint32(corpus, tmp_path):
    # A word-level tokenizer whose corpus words all have ids above 65,535.
    words = sorted(set(corpus["train"].read_text(encoding="utf-8").split()))
    vocab = {"[UNK]": 0, "<eos>": 1} | {f"filler{i}": i + 2 for i in range(70_000)}
    vocab |= {word: 70_002 + index for index, word in enumerate(words)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    tokenizer.add_special_tokens({"eos_token": "<eos>"})
    tokenizer.save_pretrained(tmp_path / "big-tokenizer")
    run_options = options("gpt", tmp_path / "big-tokenizer", corpus)
    manifest = egbert.prepare_corpus(**run_options, output_dir=str(tmp_path / "folder"))
    assert manifest["dtype"] == "uint32"
    model_args, data_args, objective_args, _ = pretrain_arguments(
        **run_options, output_dir=str(tmp_path / "unused")
    )
    parts = (model_args.model, data_args, objective_args, tokenizer)
    in_memory, _ = build_examples(*parts, data_args.train_files, seed=0)
    read_back = PreparedFolder(tmp_path / "folder").examples("train")
    assert max(max(example["input_ids"]) for example in in_memory) > 2**16
    assert [read_back[i]["input_ids"].tolist() for i in range(len(read_back))] == [
        example["input_ids"] for example in in_memory
    ]


def _one_line_error(argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        cli_main(argv)
    message = str(exit_info.value.code)
    assert message.startswith(f"egbert {argv[0]}: error: ") and "\n" not in message, message
    return message


def test_prepare_again_is_a_no_op_and_other_options_are_refused(
    corpus, tiny_tokenizer_dir, tmp_path, capsys
):
    folder = tmp_path / "gpt"
    argv = ["prepare", "--model", "gpt", "--tokenizer", str(tiny_tokenizer_dir)]
    argv += ["--train-files", str(corpus["train"]), "--seq-len", "32"]
    argv += ["--output-dir", str(folder)]
    cli_main(argv)
    assert "for training" in capsys.readouterr().out
    written = {path: path.stat().st_mtime_ns for path in folder.rglob("*")}
    cli_main(argv)
    assert "nothing to do" in capsys.readouterr().out
    assert {path: path.stat().st_mtime_ns for path in folder.rglob("*")} == written
    message = _one_line_error([*argv, "--doc-boundary", "line"])
    assert "doc_boundary: blank -> line" in message
    assert [path.name for path in tmp_path.iterdir()] == ["gpt"]  # no temporary folder left
    assert "not a prepared folder" in _one_line_error([*argv[:-1], str(corpus["train"].parent)])


def test_pretrain_refuses_a_folder_of_other_options(corpus, tiny_tokenizer_dir, tmp_path):
    folder = tmp_path / "bert"
    egbert.prepare_corpus(**options("bert", tiny_tokenizer_dir, corpus), output_dir=str(folder))
    argv = ["pretrain", "--model", "bert", "--data", str(folder), "--seq-len", "32"]
    argv += ["--output-dir", str(tmp_path / "run"), "--max-steps", "1", "--report-to", "none"]
    assert "seq_len 32 there, 48 here" in _one_line_error([*argv, "--seq-len", "48"])
    assert "short_seq_prob 0.1 there, 0.2 here" in _one_line_error(
        [*argv, "--short-seq-prob", "0.2"]
    )
    gpt = [*argv[:2], "gpt", *argv[3:]]
    assert "holds bert examples, not gpt" in _one_line_error(gpt)
    other = tmp_path / "other-tokenizer"
    egbert.train_tokenizer([corpus["valid"]], kind="wordpiece", vocab_size=500, out_dir=other)
    message = _one_line_error([*argv, "--tokenizer", str(other)])
    assert "is not the tokenizer" in message
    message = _one_line_error([*argv, "--train-files", str(corpus["train"])])
    assert "leave out --train-files" in message
    assert "no manifest.json" in _one_line_error([*argv, "--data", str(tmp_path)])
    assert not (tmp_path / "run").exists()


@proves("pretrain", "--data")
def test_pretrain_from_a_folder_equals_pretrain_from_the_files(
    corpus, tiny_tokenizer_dir, tmp_path, capsys
):
    """bert with NSP, validation and max-eval-samples: the same losses and weights, and the
    same share of the corpus reported; the folder's run takes its --seq-len from the folder."""
    common = {"max_steps": 4, "eval_every": 2, "max_eval_samples": 16, "batch_size": 4}
    common |= {"report_to": "none", "seed": 5}
    run_options = options("bert", tiny_tokenizer_dir, corpus)
    egbert.run_pretraining(**run_options, **common, output_dir=str(tmp_path / "files"))
    reported = [line for line in capsys.readouterr().out.splitlines() if "of the corpus's" in line]
    egbert.prepare_corpus(**run_options, output_dir=str(tmp_path / "folder"), seed=5)
    capsys.readouterr()
    data_options = {"model": "bert", "data": str(tmp_path / "folder")}  # seq_len: the folder's
    egbert.run_pretraining(**data_options, **common, output_dir=str(tmp_path / "prepared"))
    out = capsys.readouterr().out
    assert len(reported) == 1 and "training examples hold 100.0% of the corpus's" in reported[0]
    assert reported[0] in out.splitlines()
    # said before the run starts, kept in train.log with the run's own lines
    assert reported[0] in (tmp_path / "files" / "train.log").read_text().splitlines()
    for split in ("train", "eval"):
        from_files = split_records(tmp_path / "files", split)
        from_folder = split_records(tmp_path / "prepared", split)
        assert len(from_folder) == len(from_files) > 0
        for a, b in zip(from_files, from_folder, strict=True):
            compared = [name for name in a if name.endswith(("loss", "accuracy", "step"))]
            assert len(compared) >= 3
            assert [b[name] for name in compared] == pytest.approx([a[name] for name in compared])
    first = load_file(tmp_path / "files/model/model.safetensors")
    second = load_file(tmp_path / "prepared/model/model.safetensors")
    for name, tensor in first.items():
        torch.testing.assert_close(second[name], tensor, atol=1e-6, rtol=0)


@pytest.fixture(scope="module")
def word_tokenizer(tmp_path_factory) -> Path:
    """One token a word (w0 .. w99), with bert's and gpt's special tokens: the tokens of a
    corpus of such words are counted by hand."""
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<eos>"]
    vocab = {token: index for index, token in enumerate(specials)}
    vocab |= {f"w{i}": len(specials) + i for i in range(100)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    names = ("pad", "unk", "cls", "sep", "mask", "eos")
    tokens = {f"{name}_token": token for name, token in zip(names, specials, strict=True)}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, **tokens)
    folder = tmp_path_factory.mktemp("word-tokenizer")
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize(
    ("family", "seq_len", "used", "warned"),
    [
        # gpt: w0-w4 <eos> w5-w10 in the one block of 12; the rest of the second document and
        # the third are the partial block dropped: 11 of 15
        ("gpt", 12, 11, True),
        # bert: every token in a pair (the NotNext segments of another document not counted)
        ("bert", 8, 15, False),
    ],
)
def test_prepare_records_and_reports_the_share_of_the_corpus_in_the_examples(
    family, seq_len, used, warned, word_tokenizer, tmp_path, capsys
):
    text = "w0 w1 w2 w3 w4\n\nw5 w6 w7 w8 w9 w10 w11\n\nw12 w13 w14\n"  # 5 + 7 + 3 tokens
    (tmp_path / "words.txt").write_text(text, encoding="utf-8")
    folder = tmp_path / "folder"
    argv = ["prepare", "--model", family, "--tokenizer", str(word_tokenizer)]
    argv += ["--train-files", str(tmp_path / "words.txt"), "--seq-len", str(seq_len)]
    cli_main([*argv, "--output-dir", str(folder)])
    train = json.loads((folder / "manifest.json").read_text())["splits"]["train"]
    assert (train["corpus_tokens"], train["corpus_tokens_used"]) == (15, used)
    assert train["corpus_share_used"] == round(used / 15, 6)
    out = capsys.readouterr().out.splitlines()
    assert (
        f"egbert: the train examples hold {used / 15:.1%} of the corpus's 15 tokens ({used})" in out
    )
    warnings = [line for line in out if line.startswith("egbert: warning:")]
    assert warnings == ([f"egbert: warning: only {used / 15:.1%} of the train corpus's tokens "
                         "reach an example; the last partial block of each pack is dropped, so "
                         "a corpus of few blocks loses much of itself: use a shorter --seq-len "
                         "or more text"] if warned else [])  # fmt: skip


def test_pretrain_takes_the_sequence_length_of_its_data_folder(small_folder, tmp_path, capsys):
    """bert's recipe says 128; the folder holds examples of 32 tokens: a run takes 32, and an
    explicit other --seq-len is refused in one line."""
    argv = ["pretrain", "--model", "bert", "--data", str(small_folder)]
    argv += ["--output-dir", str(tmp_path / "run"), "--report-to", "none"]
    model_args, data_args, objective_args, _ = parse_pretrain_args(argv[1:])
    assert data_args.seq_len == 32
    folder_for_run(model_args.model, data_args, objective_args)  # accepted
    _, python_data_args, _, _ = pretrain_arguments(
        model="bert", data=str(small_folder), output_dir=str(tmp_path / "run")
    )
    assert python_data_args.seq_len == 32
    with pytest.raises(SystemExit):
        cli_main([*argv, "--print-config"])
    assert "seq_len: 32  # recipe manifest.json in --data" in capsys.readouterr().out
    message = _one_line_error([*argv, "--seq-len", "48"])
    assert "seq_len 32 there, 48 here" in message and "leave out --seq-len" in message
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_sigkill_then_resume_from_a_folder_equals_a_clean_run(
    corpus, tiny_tokenizer_dir, tmp_path, subprocess_env, warm_python, capsys
):
    """bert with NSP and dynamic masking from a prepared folder: killed after a checkpoint in
    epoch 1 and resumed, it ends with the clean run's weights; a changed folder is refused."""
    short = tmp_path / "short.tokens"
    short.write_text("".join(corpus["train"].read_text().splitlines(True)[:80]))
    short_corpus = {"train": short, "valid": corpus["valid"]}
    folder = tmp_path / "folder"
    prepare_options = options("bert", tiny_tokenizer_dir, short_corpus, validation_files=[])
    egbert.prepare_corpus(**prepare_options, output_dir=str(folder))
    argv = ["pretrain", "--model", "bert", "--data", str(folder), "--seq-len", "32"]
    argv += ["--batch-size", "8", "--epochs", "3", "--save-every", "3", "--log-every", "1"]
    argv += ["--report-to", "none"]
    cli_main([*argv, "--output-dir", str(tmp_path / "clean")])

    out = tmp_path / "killed"
    python = warm_python(subprocess_env)
    command = [python, "-m", "egbert.cli", *argv, "--output-dir", str(out), "--resume"]
    in_epoch_1 = lambda: _newest_checkpoint_epoch(out) >= 1  # noqa: E731
    kill_once(command, subprocess_env, in_epoch_1, "checkpoint in epoch 1")
    assert not (out / "model").exists()
    capsys.readouterr()
    cli_main(command[3:])  # resumed in this process, as the clean run
    assert "resumed from" in capsys.readouterr().out
    clean = load_file(tmp_path / "clean/model/model.safetensors")
    weights = load_file(out / "model/model.safetensors")
    for name, tensor in clean.items():
        torch.testing.assert_close(weights[name], tensor, atol=1e-6, rtol=0)

    # the same folder name with other contents: a resumed run refuses it
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "egbert_version": "0.0.9"}))
    with pytest.raises(ConfigError, match=r"data.manifest_sha256"):
        egbert.run_pretraining(
            model="bert", data=str(folder), seq_len=32, output_dir=str(out), resume=True
        )


# ---------------------------------------------------------------- damaged folders


def damaged(folder: Path) -> str:
    """How every refusal of a damaged folder ends (written out, not egbert's helper)."""
    return f"the folder {folder} is damaged: delete it and run `egbert prepare` again"


def _truncate(path: Path, size: int) -> None:
    with path.open("r+b") as handle:
        handle.truncate(size)


def _append(path: Path, data: bytes) -> None:
    with path.open("ab") as handle:
        handle.write(data)


def _edit_npy(path: Path, value, at: int) -> None:
    """Entry `at` of a shard's .npy set to value(array), in the same dtype and shape."""
    array = np.load(path)
    array[at] = value(array)
    np.save(path, array)


def _edit_manifest(folder: Path, edit) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    edit(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF  # the size stays: only a hash tells
    path.write_bytes(bytes(data))


def _more_examples(manifest: dict) -> None:
    manifest["splits"]["train"]["examples"] += 100
    manifest["splits"]["train"]["shards"][0]["examples"] += 100


# (what is damaged, how, the file the one line names, what it says)
DAMAGES = [
    ("a shard cut short", lambda f: _truncate(f / "train/00000.input_ids.bin", 6000),
     "train/00000.input_ids.bin", "6,000 bytes, where the manifest says"),
    ("counts edited in the manifest", lambda f: _edit_manifest(f, _more_examples),
     "train/00000.offsets.npy", "entries, where the manifest's"),
    ("one split's count edited",
     lambda f: _edit_manifest(f, lambda m: m["splits"]["train"].update(examples=10**6)),
     "manifest.json", "train has 1,000,000 examples, its shards"),
    ("the manifest cut in half",
     lambda f: _truncate(f / "manifest.json", (f / "manifest.json").stat().st_size // 2),
     "manifest.json", "not valid JSON at line"),
    ("the tokenizer's file changed",
     lambda f: (f / "tokenizer/tokenizer.json").write_text("{}"),
     "tokenizer", "not the tokenizer the examples were made with"),
    ("the offsets' end edited (the file's size unchanged)",
     lambda f: _edit_npy(f / "train/00000.offsets.npy", lambda a: a[-1] - 1, at=-1),
     "train/00000.offsets.npy", "entries, where the manifest's"),
    ("a shard's file deleted",
     lambda f: (f / "train/00000.next_sentence_label.npy").unlink(),
     "train/00000.next_sentence_label.npy", "missing; the folder"),
    ("a shard's .npy grown (its header, and so its shape, unchanged)",
     lambda f: _append(f / "train/00000.segment_b_start.npy", b"\0" * 8),
     "train/00000.segment_b_start.npy", "bytes, where the manifest says"),
]  # fmt: skip


@pytest.fixture(scope="module")
def small_folder(corpus, tiny_tokenizer_dir, tmp_path_factory) -> Path:
    """A bert folder (NSP: four files a shard) of 200 lines of the slice."""
    lines = corpus["train"].read_text(encoding="utf-8").splitlines(keepends=True)[:200]
    text = tmp_path_factory.mktemp("small") / "small.tokens"
    text.write_text("".join(lines), encoding="utf-8")
    folder = tmp_path_factory.mktemp("folders") / "bert"
    run_options = options("bert", tiny_tokenizer_dir, {"train": text, "valid": text})
    egbert.prepare_corpus(**{**run_options, "validation_files": []}, output_dir=str(folder))
    return folder


def test_a_validation_shard_cut_short_is_refused_when_opened(corpus, tiny_tokenizer_dir, tmp_path):
    """guarantees.md: a shard cut short is refused, the validation split's as the train's."""
    lines = corpus["valid"].read_text(encoding="utf-8").splitlines(keepends=True)[:100]
    text = tmp_path / "short.tokens"
    text.write_text("".join(lines), encoding="utf-8")
    run_options = options("gpt", tiny_tokenizer_dir, {"train": text, "valid": text})
    folder = Path(egbert.prepare_corpus(**run_options, output_dir=str(tmp_path / "f"))["folder"])
    _truncate(folder / "validation/00000.input_ids.bin", 100)
    with pytest.raises(DataError, match="validation/00000.input_ids.bin: 100 bytes, where"):
        PreparedFolder(folder)


@pytest.mark.parametrize(
    ("damage", "named", "expected"),
    [pytest.param(how, named, expected, id=what) for what, how, named, expected in DAMAGES],
)
def test_a_damaged_folder_is_refused_in_one_line_before_anything_is_written(
    damage, named, expected, small_folder, tmp_path
):
    folder = shutil.copytree(small_folder, tmp_path / "folder")
    damage(folder)
    out = tmp_path / "run"
    argv = ["pretrain", "--model", "bert", "--data", str(folder), "--seq-len", "32"]
    message = _one_line_error([*argv, "--output-dir", str(out), "--report-to", "none"])
    assert f"{folder / named}: " in message and expected in message, message
    assert message.endswith(damaged(folder))
    assert not out.exists()  # no train.log, no checkpoint
    verify = ["prepare", "--model", "bert", "--output-dir", str(folder), "--verify"]
    assert _one_line_error(verify) == message.replace("egbert pretrain", "egbert prepare")


def prepare_again_argv(folder: Path, tokenizer: Path) -> list[str]:
    """The `egbert prepare` command line that made `small_folder`."""
    manifest = json.loads((folder / "manifest.json").read_text())
    argv = ["prepare", "--model", "bert", "--tokenizer", str(tokenizer), "--seq-len", "32"]
    argv += ["--doc-boundary", "wikitext", "--output-dir", str(folder), "--train-files"]
    return [*argv, manifest["sources"]["train_files"][0].rsplit(" (", 1)[0]]


def test_prepare_refuses_to_call_a_damaged_folder_done(small_folder, tiny_tokenizer_dir, tmp_path):
    folder = shutil.copytree(small_folder, tmp_path / "folder")
    argv = prepare_again_argv(folder, tiny_tokenizer_dir)
    cli_main(argv)  # the same options: nothing to do
    _truncate(folder / "train/00000.input_ids.bin", 6000)
    message = _one_line_error(argv)
    assert "train/00000.input_ids.bin: 6,000 bytes" in message and "damaged" in message


@proves("prepare", "--max-train-samples")
def test_max_train_samples_is_the_runs_and_leaves_the_examples_alone(
    small_folder, tiny_tokenizer_dir, tmp_path, capsys
):
    """pretrain's --max-train-samples takes the first examples of a folder; prepare accepts it
    (one --config file for both) and stores every example: the same folder, nothing to do."""
    folder = shutil.copytree(small_folder, tmp_path / "folder")
    written = {path: path.stat().st_mtime_ns for path in folder.rglob("*")}
    cli_main([*prepare_again_argv(folder, tiny_tokenizer_dir), "--max-train-samples", "5"])
    assert "already holds these examples; nothing to do" in capsys.readouterr().out
    assert {path: path.stat().st_mtime_ns for path in folder.rglob("*")} == written


@proves("prepare", "--verify")
def test_verify_hashes_every_file_where_opening_checks_sizes(small_folder, tmp_path, capsys):
    folder = shutil.copytree(small_folder, tmp_path / "folder")
    manifest = json.loads((folder / "manifest.json").read_text())
    files = manifest["splits"]["train"]["shards"][0]["files"]
    for name, record in files.items():  # the manifest's sizes and sha256 are the files'
        data = (folder / "train" / name).read_bytes()
        assert record == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert set(files) == {
        f"00000.{name}"
        for name in (
            "input_ids.bin",
            "offsets.npy",
            "segment_b_start.npy",
            "next_sentence_label.npy",
        )
    }
    cli_main(["prepare", "--output-dir", str(folder), "--verify"])  # needs no other option
    assert f"{folder} is intact (4 files checked against their sha256)" in capsys.readouterr().out
    _flip_a_byte(folder / "train/00000.input_ids.bin")
    PreparedFolder(folder)  # sizes and counts still agree: opening does not hash
    message = _one_line_error(["prepare", "--output-dir", str(folder), "--verify"])
    assert message.endswith(
        f"{folder}/train/00000.input_ids.bin: its sha256 is not the one the manifest records (the "
        f"file changed after `egbert prepare` wrote it); the folder {folder} is damaged: delete "
        "it and run `egbert prepare` again"
    )


def test_a_folder_prepared_before_the_checksums_stays_readable(small_folder, tmp_path):
    folder = shutil.copytree(small_folder, tmp_path / "folder")
    for shard in (manifest := json.loads((folder / "manifest.json").read_text()))["splits"][
        "train"
    ]["shards"]:
        del shard["files"]  # what egbert wrote before the sizes and hashes were recorded
    (folder / "manifest.json").write_text(json.dumps(manifest))
    examples = PreparedFolder(folder).examples("train")
    assert len(examples) == manifest["splits"]["train"]["examples"] > 10
    ids = folder / "train/00000.input_ids.bin"
    size = ids.stat().st_size
    _truncate(ids, 6000)  # still caught: by the counts
    with pytest.raises(DataError) as error:
        PreparedFolder(folder)
    expected = f"{ids}: 6,000 bytes, where the manifest says {size:,}; {damaged(folder)}"
    assert str(error.value) == expected
    shutil.copy(small_folder / "train/00000.input_ids.bin", folder / "train")
    with pytest.raises(DataError) as error:
        PreparedFolder(folder).verify_checksums()
    assert str(error.value) == (
        f"{folder}/manifest.json records no checksums (an older egbert wrote it); to verify "
        "every byte, delete the folder and prepare it again"
    )
    # NSP's per-example arrays are counted too, and a missing .npy is named
    examples = manifest["splits"]["train"]["shards"][0]["examples"]
    labels = folder / "train/00000.next_sentence_label.npy"
    np.save(labels, np.load(labels)[:-1])
    with pytest.raises(DataError) as error:
        PreparedFolder(folder)
    tokens = manifest["splits"]["train"]["shards"][0]["tokens"]
    assert str(error.value) == (
        f"{labels}: {examples - 1:,} entries, where the manifest's {examples:,} examples and "
        f"{tokens:,} tokens need {examples:,}; {damaged(folder)}"
    )
    offsets = folder / "train/00000.offsets.npy"
    offsets.write_bytes(b"not numpy")
    with pytest.raises(DataError) as error:
        PreparedFolder(folder)
    assert str(error.value).startswith(f"{offsets}: not a readable .npy (")
    assert str(error.value).endswith(damaged(folder))
    offsets.unlink()
    with pytest.raises(DataError) as error:
        PreparedFolder(folder)
    assert str(error.value) == f"{offsets}: missing; {damaged(folder)}"


# ---------------------------------------------------------------- breaks mutation testing found
# (docs/testing.md, pretrain/prepared_folder): expectations from hashlib, or the words written out


def test_the_tokenizer_hash_is_sha256_of_each_file_s_name_and_bytes_in_name_order(tmp_path):
    """The hash a manifest records: a change of it would refuse every folder prepared before."""
    (tmp_path / "b.txt").write_bytes(b"world")
    (tmp_path / "a.txt").write_bytes(b"hello")
    expected = hashlib.sha256(b"a.txt\0hello\0b.txt\0world\0").hexdigest()
    assert files_hash(tmp_path) == expected


@pytest.mark.parametrize(
    ("content", "found"),
    [
        (b"\xff\xfe{", "not valid JSON; the folder {folder} is damaged"),
        (b'{\n  "format": }', "not valid JSON at line 2; the folder {folder} is damaged"),
        (b"[1]", "format None, this egbert reads 'egbert-prepared/1'; prepare it again"),
        (b'{"format": "other/2"}', "format 'other/2', this egbert reads 'egbert-prepared/1'"),
    ],
)
def test_a_manifest_not_json_or_of_another_format_is_refused_in_one_line(content, found, tmp_path):
    (tmp_path / "manifest.json").write_bytes(content)
    with pytest.raises(DataError) as error:
        read_manifest(tmp_path)
    assert str(error.value).startswith(
        f"{tmp_path / 'manifest.json'}: {found.format(folder=tmp_path)}"
    )


def test_a_folder_without_a_manifest_is_refused_naming_the_command_that_makes_one(tmp_path):
    with pytest.raises(DataError) as error:
        read_manifest(tmp_path)
    assert (
        str(error.value)
        == f"{tmp_path}: no manifest.json there; make the folder with `egbert prepare`"
    )


def test_a_manifest_missing_a_field_is_refused_naming_it(tmp_path):
    (tmp_path / "manifest.json").write_text('{"format": "egbert-prepared/1"}')
    with pytest.raises(DataError) as error:
        PreparedFolder(tmp_path)
    assert str(error.value) == (
        f"{tmp_path / 'manifest.json'}: a field is missing or malformed (KeyError('family')); "
        + damaged(tmp_path)
    )


def test_static_masks_prepared_before_the_checksums_are_checked_by_their_size(
    corpus, tiny_tokenizer_dir, tmp_path
):
    """bert with --dupe-factor 2 keeps its masks' labels in labels.bin (int32, one a token): a
    folder without recorded file sizes still refuses one cut short."""
    lines = corpus["train"].read_text(encoding="utf-8").splitlines(keepends=True)[:60]
    text = tmp_path / "short.tokens"
    text.write_text("".join(lines), encoding="utf-8")
    extra = {"nsp": False, "dupe_factor": 2, "validation_files": []}
    run_options = options("bert", tiny_tokenizer_dir, {"train": text, "valid": text}, **extra)
    folder = Path(egbert.prepare_corpus(**run_options, output_dir=str(tmp_path / "f"))["folder"])
    manifest = json.loads((folder / "manifest.json").read_text())
    (shard,) = manifest["splits"]["train"]["shards"]
    del shard["files"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    examples = PreparedFolder(folder).examples("train")
    assert examples[0]["labels"].dtype == examples[0]["input_ids"].dtype == np.int64
    assert not examples._shard(0)["labels"].flags.writeable  # mapped read-only
    labels = folder / "train/00000.labels.bin"
    assert labels.stat().st_size == 4 * shard["tokens"]
    _truncate(labels, 4 * shard["tokens"] - 4)
    with pytest.raises(DataError) as error:
        PreparedFolder(folder)
    assert str(error.value).startswith(
        f"{labels}: {4 * shard['tokens'] - 4:,} bytes, where the manifest says "
        f"{4 * shard['tokens']:,}; the folder {folder} is damaged"
    )


def test_a_run_s_identity_of_its_folder_is_the_path_and_the_manifest_s_hash(small_folder):
    """What checkpoints record, so that a resumed run refuses another folder or manifest."""
    manifest = (small_folder / "manifest.json").read_bytes()
    assert PreparedFolder(small_folder).identity() == {
        "prepared": str(small_folder.resolve()),
        "manifest_sha256": hashlib.sha256(manifest).hexdigest()[:16],
    }


@pytest.mark.parametrize(
    "corpus_option",
    [{"train_files": ["a.txt"]}, {"validation_files": ["b.txt"]}, {"dataset": "wikitext"}]
    + [{"streaming": True}],
)
def test_a_folder_refuses_each_option_that_names_another_corpus(corpus_option, small_folder):
    args = DataArguments(data=str(small_folder), seq_len=32, **corpus_option)
    with pytest.raises(ConfigError) as error:
        PreparedFolder(small_folder).check_run("bert", args, ObjectiveArguments())
    assert str(error.value) == (
        f"--data {small_folder} holds the training and validation examples; leave out "
        "--train-files, --validation-files, --dataset and --streaming"
    )


def test_a_folder_names_every_option_that_differs_set_on_one_side_only_or_both(small_folder):
    """small_folder holds bert's default pairs (nsp, short_seq_prob 0.1, dupe_factor 1)."""
    folder, args = PreparedFolder(small_folder), DataArguments(data=str(small_folder), seq_len=32)
    folder.check_run("bert", args, ObjectiveArguments())  # the same options: accepted
    with pytest.raises(ConfigError) as error:
        folder.check_run("bert", args, ObjectiveArguments(nsp=False, dupe_factor=2))
    assert str(error.value) == (
        f"--data {small_folder} was prepared with other options (dupe_factor 1 there, 2 here; "
        "mlm_probability (unset) there, 0.15 here; nsp True there, False here; short_seq_prob "
        "0.1 there, (unset) here; whole_word_mask (unset) there, False here); pass the folder's "
        "options or prepare it again"
    )


def test_another_tokenizer_given_with_a_folder_is_refused_naming_the_folder_s(
    small_folder, word_tokenizer
):
    expected = json.loads((small_folder / "manifest.json").read_text())["tokenizer"]["sha256"]
    with pytest.raises(ConfigError) as error:
        PreparedFolder(small_folder).load_tokenizer(str(word_tokenizer))
    assert str(error.value) == (
        f"--tokenizer {word_tokenizer} is not the tokenizer {small_folder} was prepared with "
        f"(sha256 {expected[:12]}...); leave --tokenizer out to use the folder's"
    )


def test_an_example_is_int64_arrays_read_only_mapped_and_one_past_the_end_is_an_index_error(
    small_folder,
):
    examples = PreparedFolder(small_folder).examples("train")
    example = examples[0]
    assert example["input_ids"].dtype == example["token_type_ids"].dtype == np.int64
    assert type(example["next_sentence_label"]) is int
    with pytest.raises(IndexError) as error:
        examples[len(examples)]
    assert str(error.value) == f"example {len(examples)} of {len(examples)}"
    # the shards are mapped read-only, and a pickled copy (a loader worker's) maps its own
    assert not any(array.flags.writeable for array in examples._shard(0).values())
    copy = pickle.loads(pickle.dumps(examples))
    assert copy._shards == {} and as_lists(copy[3]) == as_lists(examples[3])
