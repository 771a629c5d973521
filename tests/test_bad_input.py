"""Bad input to every `egbert` command: each case ends in one `egbert <cmd>: error: ...` line,
a non-zero exit, no traceback and nothing left in the output location. The tables below double
as documentation of what a user gets; `{name}` in an argument is a file or folder made by the
`inputs` fixture. Also: pickle checkpoints need --allow-pickle, and no `trust_remote_code`."""

from __future__ import annotations

import ast
import json
import os
import random
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import Dataset
from safetensors.torch import load_file
from transformers import AutoTokenizer, BertConfig, BertModel

from egbert.arguments import ArgumentParser
from egbert.cli import main as cli_main
from egbert.embedding import load_model
from egbert.errors import CheckpointError
from egbert.models.bert import EgbertBertConfig, EgbertBertModel
from egbert.models.gpt import EgbertGPTConfig, EgbertGPTForCausalLM
from egbert.pretrain import prepare as prepare_module

REPO = Path(__file__).resolve().parents[1]
HUGE_LINE_BYTES = 5_000_000  # refused: a 5 MB TSV field
LONG_LINE_BYTES = 1_000_000  # accepted: a 1 MB text line (tokenizing it takes seconds)
TINY = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
}
LATIN1 = "Un café à Paris, déjà vu; the crème brûlée was très bon.\n".encode("latin-1") * 40
PRETRAIN = "--model gpt --tokenizer {tokenizer} --output-dir {out} --seq-len 16 --batch-size 4"
PRETRAIN += " --max-steps 1"
FINETUNE = "--output-dir {out} --epochs 1 --batch-size 8"
RTE = f"--task rte --model {{bert}} {FINETUNE} --data-dir"
CUSTOM = f"--model {{bert}} {FINETUNE} --text-columns text --train-file"
EMBED_TO = "--output {out}/embeddings.npy --layers -1"

pytestmark = pytest.mark.usefixtures("one_thread_and_fresh_accelerate")


# (command, what is wrong, arguments, what the one-line error says)
CASES = [
    # ---------------------------------------------------------------- tokenizer
    ("tokenizer", "missing file", "train --files {missing} --out {out}", "no such file"),
    ("tokenizer", "empty file", "train --files {empty} --out {out}", "the file is empty"),
    ("tokenizer", "binary junk", "train --files {junk_text} --out {out}", "is not valid utf-8"),
    ("tokenizer", "binary junk, no known extension", "train --files {junk} --out {out}",
     "unknown extension '.bin'"),
    ("tokenizer", "a folder with no corpus in it", "train --files {empty_dir} --out {out}",
     "a folder with no data files"),
    ("tokenizer", "an integer --text-column",
     "train --files {docs_id} --text-column id --out {out}",
     "docs_id.parquet: column 'id' holds int64, not text"),
    ("tokenizer", "a .jsonl cut off at line 900", "train --files {cut} --out {out}",
     "cut.jsonl:900: not a JSON object"),
    ("tokenizer", "Latin-1 text", "train --files {latin1} --out {out}", "--encoding latin-1"),
    ("tokenizer", "unknown encoding", "train --files {text} --out {out} --encoding nope",
     "unknown --encoding 'nope'"),
    ("tokenizer", "--out a file", "train --files {text} --out {text}",
     "text.txt is a file, not a folder; choose another --out"),
    ("tokenizer", "vocab size -5", "train --files {text} --out {out} --vocab-size -5",
     "--vocab-size -5 is too small"),
    ("tokenizer", "min frequency -1", "train --files {text} --out {out} --min-frequency -1",
     "--min-frequency must be >= 0"),
    ("tokenizer", "missing tokenizer", "stats --tokenizer {missing} --files {text}",
     "no such tokenizer directory"),
    ("tokenizer", "folder without a tokenizer", "stats --tokenizer {empty_dir} --files {text}",
     "no tokenizer found"),
    ("tokenizer", "junk tokenizer.json", "stats --tokenizer {junk_tokenizer} --files {text}",
     "tokenizer.json cannot be read"),
    ("tokenizer", "stats of binary junk", "stats --tokenizer {tokenizer} --files {junk}",
     "is not valid utf-8"),
    ("tokenizer", "stats of an empty file", "stats --tokenizer {tokenizer} --files {empty}",
     "the file is empty"),
    # ---------------------------------------------------------------- pretrain
    ("pretrain", "missing file", f"{PRETRAIN} --train-files {{missing}}", "no such file"),
    ("pretrain", "empty file", f"{PRETRAIN} --train-files {{empty}}", "the file is empty"),
    ("pretrain", "binary junk", f"{PRETRAIN} --train-files {{junk}}", "unknown extension '.bin'"),
    ("pretrain", "binary junk as text", f"{PRETRAIN} --train-files {{junk_text}}",
     "is not valid utf-8"),
    ("pretrain", "missing text column",
     f"{PRETRAIN} --train-files {{late_bad}} --text-column title",
     "no column 'title'"),
    ("pretrain", "Latin-1 text", f"{PRETRAIN} --train-files {{latin1}}", "--encoding latin-1"),
    ("pretrain", "an integer --text-column",
     f"{PRETRAIN} --train-files {{docs_id}} --text-column id",
     "docs_id.parquet: column 'id' holds int64, not text; pass a text column with --text-column"),
    ("pretrain", "a nan source weight",
     f"{PRETRAIN} --train-files {{text}} {{docs_id}} --source-weights nan 1",
     "--source-weights nan 1: give finite weights > 0"),
    ("pretrain", "a folder of JSON that is no corpus", f"{PRETRAIN} --train-files {{tokenizer}}",
     "not readable as a data set (its files or rows do not share one table's columns)"),
    ("pretrain", "a corrupt parquet", f"{PRETRAIN} --train-files {{corrupt}}",
     "corrupt.parquet: not a readable parquet file"),
    ("pretrain", "a .jsonl cut off at line 900", f"{PRETRAIN} --train-files {{cut}}",
     "cut.jsonl:900: not a JSON object"),
    ("pretrain", "a .jsonl of blank lines", f"{PRETRAIN} --train-files {{blank}}",
     "blank.jsonl: only blank lines, no rows"),
    ("pretrain", "a folder as --config",
     f"{PRETRAIN} --train-files {{text}} --config {{empty_dir}}",
     "is a folder; pass a YAML or JSON file"),
    ("pretrain", "a folder of .tokens files as --validation-files",
     f"{PRETRAIN} --train-files {{text}} --validation-files {{tokens_dir}}",
     "tokens_dir: a folder with no data files `datasets` reads"),
    ("pretrain", "unknown encoding", f"{PRETRAIN} --train-files {{text}} --encoding nope",
     "unknown --encoding 'nope'"),
    ("pretrain", "missing validation file",
     f"{PRETRAIN} --train-files {{text}} --validation-files {{missing}}", "no such file"),
    ("pretrain", "missing tokenizer", f"{PRETRAIN} --train-files {{text}} --tokenizer {{missing}}",
     "no such tokenizer directory"),
    ("pretrain", "junk tokenizer.json",
     f"{PRETRAIN} --train-files {{text}} --tokenizer {{junk_tokenizer}}",
     "tokenizer.json cannot be read"),
    ("pretrain", "binary junk as --config", f"{PRETRAIN} --train-files {{text}} --config {{junk}}",
     "is not a UTF-8 text file"),
    ("pretrain", "binary junk as --preset", f"{PRETRAIN} --train-files {{text}} --preset {{junk}}",
     "is not a UTF-8 text file"),
    ("pretrain", "--init-from a bert model for gpt",
     f"{PRETRAIN} --train-files {{text}} --init-from {{bert}}", "holds a 'egbert-bert' model"),
    ("pretrain", "--init-from a pickle checkpoint",
     f"{PRETRAIN} --train-files {{text}} --init-from {{gpt_pickle}}", "--allow-pickle"),
    ("pretrain", "tokenizer larger than the model's vocab",
     f"{PRETRAIN} --train-files {{text}} --init-from {{gpt_vocab100}}",
     "the tokenizer has 1000 tokens but the gpt model has vocab_size 100"),
    ("pretrain", "negative lr", f"{PRETRAIN} --train-files {{text}} --lr -1",
     "--lr must be > 0"),
    ("pretrain", "batch size 0", f"{PRETRAIN} --train-files {{text}} --batch-size 0",
     "--batch-size must be > 0"),
    ("pretrain", "seq len above the position table", f"{PRETRAIN} --train-files {{text}} "
     "--seq-len 1024", "--seq-len 1024 is above the model's max_position_embeddings (512); use "
     "--seq-len 512 or less, or give the model more: --config-overrides "
     "max_position_embeddings=1024"),
    ("pretrain", "--output-dir a file, TensorBoard on (the default), checked before the data",
     f"{PRETRAIN} --train-files {{cut}} --output-dir {{text}}",
     "text.txt is a file, not a folder; choose another --output-dir"),
    ("pretrain", "--output-dir a file, --report-to none",
     f"{PRETRAIN} --train-files {{cut}} --output-dir {{text}} --report-to none",
     "text.txt is a file, not a folder; choose another --output-dir"),
    ("pretrain", "--output-dir where no folder may be made",
     f"{PRETRAIN} --train-files {{cut}} --output-dir {{unwritable}}/run", ": cannot write in"),
    ("pretrain", "a Hub id as --init-from", f"{PRETRAIN} --train-files {{text}} "
     "--init-from bert-base-uncased", "bert-base-uncased reads as a Hugging Face Hub id"),
    ("pretrain", "a Hub id as run_mlm's --model_name_or_path", f"{PRETRAIN} --train-files "
     "{text} --model_name_or_path bert-base-uncased", "reads as a Hugging Face Hub id"),
    ("pretrain", "a Hub id as --tokenizer", f"{PRETRAIN} --train-files {{text}} "
     "--tokenizer bert-base-uncased", "bert-base-uncased reads as a Hugging Face Hub id"),
    ("pretrain", "--init-from a model of an unknown model_type",
     f"{PRETRAIN} --train-files {{text}} --init-from {{unknown_auto_map}}",
     "unknown model_type 'my-bert'"),
    ("pretrain", "run_mlm's --train-file (no prefix of --train-files)",
     f"{PRETRAIN} --train-file {{text}}",
     "unrecognized option --train-file (pretrain: --train-files)"),
    ("pretrain", "run_mlm's --train_file", f"{PRETRAIN} --train_file {{text}}",
     "unrecognized option --train_file (pretrain: --train-files)"),
    ("pretrain", "heads not dividing hidden size",
     f"{PRETRAIN} --train-files {{text}} --preset {{odd_heads_preset}}",
     "hidden_size (30) must be divisible by num_attention_heads (4)"),
    # ---------------------------------------------------------------- finetune
    ("finetune", "missing GLUE folder", f"{RTE} {{missing}}", "no such folder"),
    ("finetune", "GLUE folder without the task", f"{RTE} {{empty_dir}}", "train file not found"),
    ("finetune", "empty train.tsv", f"{RTE} {{glue_empty}}", "is empty (no data rows)"),
    ("finetune", "binary junk train.tsv", f"{RTE} {{glue_junk}}", "is not valid UTF-8"),
    ("finetune", "Latin-1 train.tsv", f"{RTE} {{glue_latin1}}", "is not valid UTF-8"),
    ("finetune", "TSV row with 2 of 4 columns", f"{RTE} {{glue_columns}}",
     "train.tsv:3: expected 4 tab-separated fields"),
    ("finetune", "unknown label", f"{RTE} {{glue_label}}",
     "train.tsv:4: label 'maybe' is not one of rte's labels"),
    ("finetune", "a 5 MB line", f"{RTE} {{glue_huge}}", "train.tsv:2: a field is longer than"),
    ("finetune", "custom: missing train file", f"{CUSTOM} {{missing}} --validation-file "
     "{custom_dev}", "file not found"),
    ("finetune", "custom: empty train file", f"{CUSTOM} {{empty_csv}} --validation-file "
     "{custom_dev}", "is empty (no data rows)"),
    ("finetune", "custom: a folder as --train-file", f"{CUSTOM} {{empty_dir}} --validation-file "
     "{custom_dev}", "empty_dir is a folder; pass a CSV, TSV or JSONL file"),
    ("finetune", "custom: binary junk", f"{CUSTOM} {{junk_csv}} --validation-file {{custom_dev}}",
     "is not valid UTF-8"),
    ("finetune", "custom: wrong column count", f"{CUSTOM} {{custom_columns}} --validation-file "
     "{custom_dev}", "custom_columns.csv:3: expected 2 comma-separated fields"),
    ("finetune", "custom: dev label not in train", f"{CUSTOM} {{custom_train}} --validation-file "
     "{custom_dev_label}", "label 'meh' is not one of custom's labels"),
    ("finetune", "custom: invalid JSONL", f"{CUSTOM} {{custom_broken}} --validation-file "
     "{custom_dev}", "custom_broken.jsonl:2: not valid JSON"),
    ("finetune", "custom: one label only", f"{CUSTOM} {{custom_one_label}} --validation-file "
     "{custom_dev}", "has one label"),
    ("finetune", "missing model", f"--task rte --model {{missing}} {FINETUNE} --data-dir {{glue}}",
     "no such model directory"),
    ("finetune", "tokenizer folder as model",
     f"--task rte --model {{tokenizer}} {FINETUNE} --data-dir {{glue}}", "has no config.json"),
    ("finetune", "unknown model type",
     f"--task rte --model {{unknown_type}} {FINETUNE} --data-dir {{glue}}",
     "unknown model_type 'not-a-model'"),
    ("finetune", "unknown model type, the folder's code named in auto_map",
     f"--task rte --model {{unknown_auto_map}} {FINETUNE} --data-dir {{glue}}",
     "unknown model_type 'my-bert'"),
    ("finetune", "a Hub id as --model",
     f"--task rte --model bert-base-uncased {FINETUNE} --data-dir {{glue}}",
     "bert-base-uncased reads as a Hugging Face Hub id"),
    ("finetune", "--output-dir a file, checked before the data",
     f"{RTE} {{glue_junk}} --output-dir {{text}}",
     "text.txt is a file, not a folder; choose another --output-dir"),
    ("finetune", "--output-dir where no folder may be made",
     f"{RTE} {{glue_junk}} --output-dir {{unwritable}}/run", ": cannot write in"),
    ("finetune", "--epoch (no prefix of --epochs)", f"{RTE} {{glue}} --epoch 1",
     "unrecognized option --epoch (did you mean --epochs?)"),
    ("finetune", "junk config.json",
     f"--task rte --model {{junk_config}} {FINETUNE} --data-dir {{glue}}", "is not valid JSON"),
    ("finetune", "junk model.safetensors",
     f"--task rte --model {{junk_weights}} {FINETUNE} --data-dir {{glue}}",
     "cannot load the model"),
    ("finetune", "pickle checkpoint",
     f"--task rte --model {{bert_pickle}} {FINETUNE} --data-dir {{glue}}", "--allow-pickle"),
    ("finetune", "junk tokenizer.json in the model folder",
     f"--task rte --model {{bert_junk_tokenizer}} {FINETUNE} --data-dir {{glue}}",
     "tokenizer.json cannot be read"),
    ("finetune", "heads not dividing hidden size",
     f"--task rte --model {{odd_heads}} {FINETUNE} --data-dir {{glue}}", "divisible"),
    ("finetune", "tokenizer larger than the model's vocab",
     f"--task rte --model {{bert_vocab100}} {FINETUNE} --data-dir {{glue}}",
     "the tokenizer has 1000 tokens"),
    ("finetune", "negative lr", f"{RTE} {{glue}} --lr -1", "--lr must be > 0"),
    ("finetune", "0 epochs", f"{RTE} {{glue}} --epochs 0", "--epochs must be > 0"),
    ("finetune", "negative --skip-nonfinite", f"{RTE} {{glue}} --skip-nonfinite -1",
     "--skip-nonfinite must be >= 0"),
    ("finetune", "seq len above the position table", f"{RTE} {{glue}} --max-seq-length 4096",
     "--max-seq-length 4096 is above the model's max_position_embeddings (64)"),
    # ---------------------------------------------------------------- embed
    ("embed", "missing file", f"--model {{bert}} --input {{missing}} {EMBED_TO}", "not found"),
    ("embed", "a folder as --input", f"--model {{bert}} --input {{empty_dir}} {EMBED_TO}",
     "is a folder; pass a file"),
    ("embed", "empty file", f"--model {{bert}} --input {{empty}} {EMBED_TO}", "is empty"),
    ("embed", "binary junk", f"--model {{bert}} --input {{junk}} {EMBED_TO}", "is not utf-8"),
    ("embed", "Latin-1 text", f"--model {{bert}} --input {{latin1}} {EMBED_TO}", "--encoding"),
    ("embed", "unknown encoding", f"--model {{bert}} --input {{text}} {EMBED_TO} --encoding nope",
     "unknown --encoding 'nope'"),
    ("embed", "bad line 41, after 40 embedded texts",
     f"--model {{bert}} --input {{late_bad}} {EMBED_TO} --batch-size 1",
     "late_bad.jsonl line 41: no text field 'text'"),
    ("embed", "JSONL without the text field",
     f"--model {{bert}} --input {{custom_broken}} {EMBED_TO} --text-field body",
     "custom_broken.jsonl line 1: no text field 'body'"),
    ("embed", "missing model", f"--model {{missing}} --input {{text}} {EMBED_TO}", "not found"),
    ("embed", "unknown model type", f"--model {{unknown_type}} --input {{text}} {EMBED_TO}",
     "unknown model_type 'not-a-model'"),
    ("embed", "unknown model type, the folder's code named in auto_map",
     f"--model {{unknown_auto_map}} --input {{text}} {EMBED_TO}", "unknown model_type 'my-bert'"),
    ("embed", "junk config.json", f"--model {{junk_config}} --input {{text}} {EMBED_TO}",
     "is not valid JSON"),
    ("embed", "junk model.safetensors", f"--model {{junk_weights}} --input {{text}} {EMBED_TO}",
     "cannot load the model"),
    ("embed", "pickle checkpoint", f"--model {{bert_pickle}} --input {{text}} {EMBED_TO}",
     "--allow-pickle"),
    ("embed", "junk tokenizer.json in the model folder",
     f"--model {{bert_junk_tokenizer}} --input {{text}} {EMBED_TO}", "cannot load a tokenizer"),
    ("embed", "heads not dividing hidden size",
     f"--model {{odd_heads}} --input {{text}} {EMBED_TO}", "divisible"),
    ("embed", "tokenizer larger than the model's vocab",
     f"--model {{bert_vocab100}} --input {{text}} {EMBED_TO}", "the tokenizer has 1000 tokens"),
    ("embed", "max length above the position table",
     f"--model {{bert}} --input {{text}} {EMBED_TO} --max-length 4096", "exceeds the model's"),
    ("embed", "batch size 0", f"--model {{bert}} --input {{text}} {EMBED_TO} --batch-size 0",
     "must be at least 1"),
    ("embed", "--output inside a file", "--model {bert} --input {text} --output {text}/e.npy",
     "text.txt is a file, not a folder; choose another --output"),
    ("embed", "--output where no file may be made",
     "--model {bert} --input {text} --output {unwritable}/e.npy", ": cannot write in"),
    ("embed", "--out (no prefix of --output)", "--model {bert} --input {text} --out {out}/e.npy",
     "unrecognized option --out"),
    # ---------------------------------------------------------------- prepare
    ("prepare", "--output-dir where no folder may be made, checked before the data",
     "--model gpt --tokenizer {tokenizer} --train-files {cut} --output-dir {unwritable}/x",
     ": cannot write in"),
    ("prepare", "--output-dir a file",
     "--model gpt --tokenizer {tokenizer} --train-files {cut} --output-dir {text}",
     "text.txt is a file, not a folder"),
    # ---------------------------------------------------------------- probe
    ("probe", "--output-dir a file, checked before the model loads",
     "--model {junk_weights} --task rte --data-dir {glue} --output-dir {text}",
     "text.txt is a file, not a folder; choose another --output-dir"),
    ("probe", "unknown model type, the folder's code named in auto_map",
     "--model {unknown_auto_map} --task rte --data-dir {glue}", "unknown model_type 'my-bert'"),
    # ---------------------------------------------------------------- generate
    ("generate", "missing model", "--model {missing} --prompt hello", "not found"),
    ("generate", "a bert model", "--model {bert} --prompt hello", "needs a gpt model"),
    ("generate", "junk config.json", "--model {junk_config} --prompt hello", "is not valid JSON"),
    ("generate", "junk model.safetensors", "--model {gpt_junk_weights} --prompt hello",
     "cannot load the model"),
    ("generate", "pickle checkpoint", "--model {gpt_pickle} --prompt hello", "--allow-pickle"),
    ("generate", "junk tokenizer.json in the model folder",
     "--model {gpt_junk_tokenizer} --prompt hello", "tokenizer.json cannot be read"),
    ("generate", "tokenizer larger than the model's vocab", "--model {gpt_vocab100} --prompt hi",
     "the tokenizer has 1000 tokens"),
    ("generate", "undecodable bytes in the prompt", "--model {gpt} --prompt caf\udce9",
     "--prompt holds bytes that are not valid text"),
    ("generate", "0 new tokens", "--model {gpt} --prompt hello --max-new-tokens 0",
     "--max-new-tokens must be at least 1"),
    ("generate", "beyond the position table", "--model {gpt} --prompt hello --max-new-tokens 100",
     "exceeds the model's 64 positions"),
    ("generate", "top-p above 1", "--model {gpt} --prompt hello --top-p 2", "--top-p must be in"),
    # ---------------------------------------------------------------- convert
    ("convert", "missing folder", "--from {missing} --to {out}", "not found"),
    ("convert", "junk config.json", "--from {junk_config} --to {out}", "is not valid JSON"),
    ("convert", "unknown model type", "--from {unknown_type} --to {out}",
     "model_type 'not-a-model'"),
    ("convert", "unknown model type to transformers, the folder's code named in auto_map",
     "--from {unknown_auto_map} --to {out} --to-transformers", "unknown model_type 'my-bert'"),
    ("convert", "--to a file", "--from {stock} --to {text}", "text.txt is a file, not a folder"),
    ("convert", "egbert model without --to-transformers", "--from {bert} --to {out}",
     "--to-transformers"),
    ("convert", "stock model with --to-transformers", "--from {stock} --to {out} "
     "--to-transformers", "not an egbert model"),
    ("convert", "junk model.safetensors", "--from {stock_junk_weights} --to {out}",
     "cannot load the model"),
    ("convert", "pickle checkpoint", "--from {stock_pickle} --to {out}", "--allow-pickle"),
    ("convert", "heads not dividing hidden size", "--from {stock_odd_heads} --to {out}",
     "not a multiple of the number of attention heads"),
]  # fmt: skip


# ---------------------------------------------------------------- input files and folders


def write_model(model, tokenizer_dir: Path, out: Path, pickle_name: str | None = None) -> Path:
    """Save `model` with the tiny tokenizer; with `pickle_name`, as a pickle instead."""
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out)
    if pickle_name:
        torch.save(load_file(out / "model.safetensors"), out / pickle_name)
        (out / "model.safetensors").unlink()
    return out


def glue_copy(source: Path, root: Path, name: str, train_lines: list[str] | bytes) -> Path:
    """An RTE folder whose train.tsv is `train_lines` (dev.tsv: 16 real rows)."""
    folder = root / name / "RTE"
    folder.mkdir(parents=True)
    dev = source.joinpath("dev.tsv").read_text(encoding="utf-8").splitlines(True)[:17]
    (folder / "dev.tsv").write_text("".join(dev), encoding="utf-8")
    if isinstance(train_lines, bytes):
        (folder / "train.tsv").write_bytes(train_lines)
    else:
        (folder / "train.tsv").write_text("".join(train_lines), encoding="utf-8")
    return root / name


@pytest.fixture(scope="module")
def inputs(
    tmp_path_factory, tiny_tokenizer_dir: Path, wikitext_slice: Path, data_dir: Path
) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bad-input")
    paths: dict[str, Path] = {"tokenizer": tiny_tokenizer_dir, "missing": root / "missing"}

    def file(name: str, content: str | bytes) -> None:
        paths[name.split(".")[0]] = root / name
        if isinstance(content, bytes):
            (root / name).write_bytes(content)
        else:
            (root / name).write_text(content, encoding="utf-8")

    junk = random.Random(0).randbytes(4096)
    lines = wikitext_slice.read_text(encoding="utf-8").splitlines(True)[:200]
    file("text.txt", "".join(line for line in lines if line.strip()))
    file("empty.txt", "")
    file("junk.bin", junk)
    file("junk_text.txt", junk)
    file("latin1.txt", LATIN1)
    file("long.txt", ("the quick brown fox jumps over the lazy dog " * 25_000)[:LONG_LINE_BYTES])
    file("late_bad.jsonl", '{"text": "fine"}\n' * 40 + '{"body": "no text field"}\n')
    file("odd_heads_preset.yaml", "hidden_size: 30\nnum_hidden_layers: 1\nnum_attention_heads: 4\n")
    file("custom_train.csv", "text,label\n" + "good movie,pos\nbad movie,neg\n" * 4)
    file("custom_dev.csv", "text,label\ngreat movie,pos\nawful movie,neg\n")
    file("custom_dev_label.csv", "text,label\ngreat movie,pos\nso-so movie,meh\n")
    file("custom_columns.csv", "text,label\ngood movie,pos\nbad, really bad,neg\n")
    file("custom_one_label.csv", "text,label\ngood movie,pos\nfine movie,pos\n")
    file(
        "custom_broken.jsonl",
        '{"text": "good movie", "label": "pos"}\n{"text": "bad movie", label}\n',
    )
    file("empty_csv.csv", "")
    file("junk_csv.csv", junk)
    paths["empty_dir"] = root / "empty_dir"
    paths["empty_dir"].mkdir()
    Dataset.from_dict({"id": list(range(len(lines))), "content": lines}).to_parquet(
        root / "docs_id.parquet"
    )
    paths["docs_id"] = root / "docs_id.parquet"
    file("corrupt.parquet", junk)
    # 900 rows of 400 bytes, the last cut off: past the first block `datasets` parses at once
    rows = [json.dumps({"text": f"{index} " + "word " * 76}) + "\n" for index in range(900)]
    file("cut.jsonl", "".join(rows)[:-40])
    file("blank.jsonl", "\n \n\n")
    paths["tokens_dir"] = root / "tokens_dir"
    paths["tokens_dir"].mkdir()
    (paths["tokens_dir"] / "wiki.valid.tokens").write_text("".join(lines), encoding="utf-8")
    paths["junk_tokenizer"] = root / "junk_tokenizer"
    paths["junk_tokenizer"].mkdir()
    (paths["junk_tokenizer"] / "tokenizer.json").write_bytes(junk)

    rte = data_dir / "glue" / "RTE"
    train = rte.joinpath("train.tsv").read_text(encoding="utf-8").splitlines(True)[:17]
    paths["glue"] = glue_copy(rte, root, "glue", train)
    paths["glue_empty"] = glue_copy(rte, root, "glue_empty", [])
    paths["glue_junk"] = glue_copy(rte, root, "glue_junk", junk)
    paths["glue_latin1"] = glue_copy(rte, root, "glue_latin1", "".join(train).encode() + LATIN1)
    paths["glue_columns"] = glue_copy(rte, root, "glue_columns", [*train[:2], "1\tonly two\n"])
    paths["glue_label"] = glue_copy(rte, root, "glue_label", [*train[:3], "2\tA.\tB.\tmaybe\n"])
    huge_row = f"0\t{'word ' * (HUGE_LINE_BYTES // 5)}\tB.\tentailment"  # no newline either
    paths["glue_huge"] = glue_copy(rte, root, "glue_huge", [train[0], huge_row])

    vocab = len(AutoTokenizer.from_pretrained(tiny_tokenizer_dir))
    torch.manual_seed(0)
    bert = EgbertBertModel(EgbertBertConfig(vocab_size=vocab, **TINY))
    gpt_config = EgbertGPTConfig(vocab_size=vocab, bos_token_id=5, eos_token_id=5, **TINY)
    gpt = EgbertGPTForCausalLM(gpt_config)
    stock = BertModel(BertConfig(vocab_size=vocab, **TINY))
    for name, model in (("bert", bert), ("gpt", gpt), ("stock", stock)):
        paths[name] = write_model(model, tiny_tokenizer_dir, root / name)
        pickled = write_model(
            model, tiny_tokenizer_dir, root / f"{name}_pickle", "pytorch_model.bin"
        )
        paths[f"{name}_pickle"] = pickled
        junk_weights = shutil.copytree(root / name, root / f"{name}_junk_weights")
        (junk_weights / "model.safetensors").write_bytes(junk)
        paths[f"{name}_junk_weights"] = junk_weights
        junk_tokenizer = shutil.copytree(root / name, root / f"{name}_junk_tokenizer")
        (junk_tokenizer / "tokenizer.json").write_bytes(junk)
        paths[f"{name}_junk_tokenizer"] = junk_tokenizer
    paths["junk_weights"] = paths["bert_junk_weights"]
    paths["bert_pt"] = write_model(bert, tiny_tokenizer_dir, root / "bert_pt", "weights.pt")
    small = {**TINY, "vocab_size": 100}
    paths["bert_vocab100"] = write_model(
        EgbertBertModel(EgbertBertConfig(**small)), tiny_tokenizer_dir, root / "bert_vocab100"
    )
    paths["gpt_vocab100"] = write_model(
        EgbertGPTForCausalLM(EgbertGPTConfig(bos_token_id=5, eos_token_id=5, **small)),
        tiny_tokenizer_dir,
        root / "gpt_vocab100",
    )
    odd = {"hidden_size": 30, "num_attention_heads": 4}
    for name, config in (
        ("junk_config", junk),
        ("unknown_type", {"model_type": "not-a-model", "hidden_size": 32}),
        ("odd_heads", {**EgbertBertConfig(**TINY).to_dict(), **odd}),
        ("stock_odd_heads", {**BertConfig(**TINY).to_dict(), **odd}),
    ):
        folder = shutil.copytree(root / ("stock" if "stock" in name else "bert"), root / name)
        text = config if isinstance(config, bytes) else json.dumps(config).encode()
        (folder / "config.json").write_bytes(text)
        paths[name] = folder
    # a folder saved by egbert, but for its model_type: transformers would offer to run its code
    paths["unknown_auto_map"] = shutil.copytree(root / "bert", root / "unknown_auto_map")
    config = json.loads((root / "bert" / "config.json").read_text(encoding="utf-8"))
    assert "auto_map" in config
    config_file = paths["unknown_auto_map"] / "config.json"
    config_file.write_text(json.dumps({**config, "model_type": "my-bert"}), encoding="utf-8")
    paths["unwritable"] = unwritable_folder(root)
    return paths


def unwritable_folder(root: Path) -> Path | None:
    """A folder that takes no new entry: a read-only one, or for root (whom permission bits do
    not stop) /sys, which refuses even root; None where neither does."""
    read_only = root / "read_only"
    read_only.mkdir()
    read_only.chmod(0o555)
    for folder in (read_only, Path("/sys")):
        try:
            os.rmdir(tempfile.mkdtemp(dir=folder))
        except OSError:
            return folder
    return None


# ---------------------------------------------------------------- running the CLI in-process


def run_cli(argv: list[str], capsys) -> tuple[int | str | None, str]:
    """(exit code or message, stderr) of `egbert ARGV` run in this process."""
    capsys.readouterr()
    code: int | str | None = 0
    try:
        cli_main(argv)
    except SystemExit as exit_info:
        code = exit_info.code
    return code, capsys.readouterr().err


def fill(template: str, paths: dict[str, Path], out: Path) -> list[str]:
    return [part.format(**paths, out=out) for part in template.split(" ")]


def files_under(folder: Path) -> list[Path]:
    return sorted(path for path in folder.rglob("*") if path.is_file()) if folder.exists() else []


@pytest.mark.parametrize(
    ("command", "argv", "expected"),
    [pytest.param(c, argv, e, id=f"{c}: {what}") for c, what, argv, e in CASES],
)
def test_bad_input_ends_in_one_clear_line(command, argv, expected, inputs, tmp_path, capsys):
    if "{unwritable}" in argv and inputs["unwritable"] is None:
        pytest.skip("no folder here refuses new files")
    out = tmp_path / "out"
    if command == "embed":
        out.mkdir()  # embed writes a file into an existing folder
    code, stderr = run_cli([command, *fill(argv, inputs, out)], capsys)
    assert code not in (0, None), f"exit {code!r}; stderr:\n{stderr[-2000:]}"
    # an EgbertError reaches us as SystemExit's message; argparse prints its own and exits 2
    message = code if isinstance(code, str) else stderr.strip().splitlines()[-1]
    assert re.match(rf"egbert {command}( \w+)?: error: ", message), message
    assert "\n" not in message and expected in message, message
    assert "Traceback" not in stderr
    assert not re.search(r"Failed to (read|load)", stderr), "a reader's own error line too"
    assert files_under(out) == [], "partial output left behind"


def test_a_tracker_that_cannot_start_ends_in_one_line(inputs, tmp_path, capsys):
    """TensorBoard's folder (OUTPUT_DIR/logs) is a file: one line naming --report-to, not
    TensorBoard's traceback and then Accelerate's AttributeError on closing it."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "logs").write_text("not a folder", encoding="utf-8")
    argv = fill(f"{PRETRAIN} --train-files {{text}}", inputs, out)
    code, stderr = run_cli(["pretrain", *argv], capsys)
    assert isinstance(code, str) and "Traceback" not in stderr, stderr[-2000:]
    expected = "egbert pretrain: error: --report-to tensorboard: a tracker could not start"
    assert code.startswith(expected) and "\n" not in code
    assert sorted(path.name for path in out.iterdir()) == ["logs"]


def test_prepare_stopped_by_sigterm_says_so_and_leaves_no_temporary_folder(
    inputs, tmp_path, capsys, monkeypatch
):
    """SIGTERM while prepare works: one line saying what it left, exit 143, no `.NAME.tmp-PID`
    beside the output; a rerun removes the temporary folder of a process that is gone (kept:
    a running one's) and prepares the folder."""
    load_corpus = prepare_module.load_corpus

    def load_then_terminate(*args, **kwargs):
        documents = load_corpus(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # as `kill PID` from another shell
        return documents

    monkeypatch.setattr(prepare_module, "load_corpus", load_then_terminate)
    target = tmp_path / "prepared"
    argv = ["prepare", "--model", "gpt", "--tokenizer", str(inputs["tokenizer"]), "--seq-len"]
    argv += ["16", "--train-files", str(inputs["text"]), "--output-dir", str(target)]
    code, stderr = run_cli(argv, capsys)
    assert code == 128 + signal.SIGTERM and "Traceback" not in stderr
    said = f"egbert prepare: stopped by SIGTERM; nothing written to {target} (its temporary"
    assert stderr.strip().splitlines()[-1].startswith(said)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    ended = subprocess.Popen(["true"])
    ended.wait()
    stale, running = (tmp_path / f".prepared.tmp-{pid}" for pid in (ended.pid, os.getppid()))
    for folder in (stale, running):
        folder.mkdir()
        (folder / "half-written").write_bytes(b"x")
    assert run_cli(argv, capsys)[0] in (0, None)
    assert sorted(tmp_path.iterdir()) == sorted([running, target])


# ---------------------------------------------------------------- input that is fine


def test_latin1_text_trains_with_the_encoding_option(inputs, tmp_path, capsys):
    out = tmp_path / "tokenizer"
    argv = ["tokenizer", "train", "--files", str(inputs["latin1"]), "--out", str(out)]
    code, stderr = run_cli([*argv, "--encoding", "latin-1", "--vocab-size", "100"], capsys)
    assert code in (0, None), stderr
    assert "é" in AutoTokenizer.from_pretrained(out).get_vocab()


def test_a_1_mb_line_is_embedded_truncated_and_counted_by_stats(inputs, tmp_path, capsys):
    output = tmp_path / "huge.npy"
    argv = ["embed", "--model", str(inputs["bert"]), "--input", str(inputs["long"])]
    code, stderr = run_cli([*argv, "--output", str(output), "--layers", "-1"], capsys)
    assert code in (0, None), stderr
    assert np.load(output).shape == (1, 32)
    assert "1 of 1 inputs were longer than 64 tokens" in stderr
    argv = ["tokenizer", "stats", "--tokenizer", str(inputs["tokenizer"]), "--json"]
    capsys.readouterr()
    cli_main([*argv, "--files", str(inputs["long"])])
    stats = json.loads(capsys.readouterr().out)
    words = len(inputs["long"].read_text(encoding="utf-8").split())
    assert stats["lines"] == 1 and stats["words"] == words > 150_000
    # the whole line is counted, not truncated: every word is one token or more
    assert stats["tokens"] == stats["length_max"] >= words


def test_embed_makes_the_folder_of_its_output(inputs, tmp_path, capsys):
    output = tmp_path / "new" / "deeper" / "vectors.npy"
    argv = ["embed", "--model", str(inputs["bert"]), "--input", str(inputs["custom_dev"])]
    code, stderr = run_cli([*argv, "--layers", "-1", "--output", str(output)], capsys)
    assert code in (0, None), stderr
    assert np.load(output).shape == (3, 32)  # the file's 3 lines, the width of TINY


def test_pretrain_reads_latin1_with_the_encoding_option(inputs, tmp_path, capsys):
    out = tmp_path / "run"
    argv = fill(f"{PRETRAIN} --train-files {{latin1}} --encoding latin-1", inputs, out)
    code, stderr = run_cli(["pretrain", *argv], capsys)
    assert code in (0, None), stderr
    assert (out / "model" / "model.safetensors").is_file()


# ---------------------------------------------------------------- safety


class Payload:
    """Unpickling this touches a file: a stand-in for code a stranger's checkpoint would run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_pickles_load_only_with_allow_pickle_and_as_weights_only(inputs, tmp_path, capsys):
    reference = load_file(inputs["bert"] / "model.safetensors")
    for name in ("bert_pickle", "bert_pt"):  # transformers' pytorch_model.bin; any *.pt
        with pytest.raises(CheckpointError, match="holds a pickle checkpoint.*--allow-pickle"):
            load_model(inputs[name])
        model, _ = load_model(inputs[name], "cpu", allow_pickle=True)
        for key, tensor in model.state_dict().items():
            assert torch.equal(tensor, reference[key]), key

    marker = tmp_path / "code-ran"
    for name, target in (("pytorch_model.bin", "bert_pickle"), ("weights.pt", "bert_pt")):
        folder = shutil.copytree(inputs[target], tmp_path / target)
        torch.save({"embeddings.word_embeddings.weight": Payload(marker)}, folder / name)
        argv = ["embed", "--model", str(folder), "--input", str(inputs["text"]), "--output"]
        code, _ = run_cli([*argv, str(tmp_path / "e.npy"), "--allow-pickle"], capsys)
        assert isinstance(code, str) and code.startswith("egbert embed: error: cannot load"), code
        assert not marker.exists(), "unpickling ran code"

    out = tmp_path / "converted"
    argv = ["convert", "--from", str(inputs["stock_pickle"]), "--to", str(out), "--allow-pickle"]
    assert run_cli(argv, capsys)[0] in (0, None)
    assert (out / "model.safetensors").is_file() and not list(out.glob("*.bin"))


def calls_in_source() -> Iterator[tuple[str, ast.Call]]:
    """Every call written in egbert and its scripts, with its file and line."""
    for folder in ("egbert", "scripts"):
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call):
                    yield f"{path.relative_to(REPO)}:{node.lineno}", node


def test_no_trust_remote_code_anywhere():
    """egbert never lets a folder it loads run the folder's own code: no call in egbert or its
    scripts passes trust_remote_code (saved folders carry such code for people without egbert,
    who opt in themselves)."""
    offenders = [
        place
        for place, node in calls_in_source()
        if any(keyword.arg in ("trust_remote_code", None) for keyword in node.keywords)
        and "trust_remote_code" in ast.unparse(node)
    ]
    assert offenders == []


def test_no_parser_takes_a_prefix_of_an_option():
    """argparse's prefix matching (`allow_abbrev`) is off in every parser of egbert and its
    scripts: `--train-file` must not quietly mean --train-files (CASES runs such prefixes
    through the commands)."""
    offenders = [
        place
        for place, node in calls_in_source()
        if ast.unparse(node.func) == "argparse.ArgumentParser"
        and not any(
            keyword.arg == "allow_abbrev" and ast.unparse(keyword.value) == "False"
            for keyword in node.keywords
        )
    ]
    assert offenders == []
    assert ArgumentParser("egbert x").allow_abbrev is False  # every command's parser
