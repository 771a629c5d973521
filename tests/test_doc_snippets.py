"""Every ```python block of README.md, docs/ and the model card runs as written.

Each block runs in a fresh working folder of its own (`workdir`), where the paths the blocks
name are tiny real things this module makes once (`examples`):

- `runs/tok`: the tiny WordPiece tokenizer (conftest's `tiny_tokenizer_dir`);
- `runs/bert`, `runs/bert-mini`, `runs/gpt`, `runs/gpt-mini`: run folders whose `model/` holds an
  untrained tiny model of the family (bert: its pretraining model) with its family's tokenizer;
- `wiki.train.tokens`, `wiki.txt`: the first 200 lines of WikiText-2 train; `a.jsonl`,
  `b.parquet`: its paragraphs of 1,500 lines, every other one in each; `sentences.txt`: three
  lines; `glue/`: a few dozen RTE and STS-B rows (conftest's `micro_data`);
- the model card's `"{name}"`: the model folder it describes.

Stand-ins for long training (STAND_INS): a run's budget (`budget_minutes=20`, `max_steps=10_000`,
`max_steps=1000`) becomes two steps, and its model size (`preset="mini"`, or the family's default
size where the block names none) the 16-wide `tiny.yaml` preset. Nothing else of a block changes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from conftest import REPO, fresh_accelerate, torch_threads

from egbert import report
from egbert.models.bert import EgbertBertConfig, EgbertBertForPreTraining
from egbert.models.gpt import EgbertGPTConfig, EgbertGPTForCausalLM
from egbert.tokenizer import load_tokenizer, tokenizer_for_model

DOCUMENTS = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)
TINY = {"hidden_size": 16, "num_hidden_layers": 3, "num_attention_heads": 2}
TINY |= {"intermediate_size": 32, "cell_size": 32, "max_position_embeddings": 128}
TINY_PRESET = 'preset="tiny.yaml"'
# (text in a block, what runs instead): each must occur in some block (checked below)
STAND_INS = [
    ("budget_minutes=20", "max_steps=2"),
    ('preset="mini"', TINY_PRESET),
    (
        'output_dir="runs/gpt", max_steps=10_000',
        f'output_dir="runs/gpt", max_steps=2, {TINY_PRESET}',
    ),
    ('output_dir="runs/gpt", max_steps=1000', f'output_dir="runs/gpt", max_steps=2, {TINY_PRESET}'),
]


def python_blocks(text: str) -> list[str]:
    return PYTHON_BLOCK.findall(text)


def documented_blocks() -> list[tuple[str, str]]:
    """(id, code) of every python block in the documents, the id its file and line."""
    found = []
    for document in DOCUMENTS:
        text = document.read_text(encoding="utf-8")
        for match in PYTHON_BLOCK.finditer(text):
            line = text[: match.start()].count("\n") + 1
            found.append((f"{document.relative_to(REPO)}:{line}", match.group(1)))
    return found


BLOCKS = documented_blocks()


def with_stand_ins(code: str) -> str:
    for written, stand_in in STAND_INS:
        code = code.replace(written, stand_in)
    return code


def save_run_folder(folder: Path, model: torch.nn.Module, tokenizer) -> None:
    model.save_pretrained(folder / "model")
    tokenizer_for_model(tokenizer, model.config).save_pretrained(folder / "model")


@pytest.fixture(scope="module")
def examples(
    tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_dir: Path, micro_data: Path
) -> Path:
    """The things the blocks name, made once (see the module's docstring)."""
    root = tmp_path_factory.mktemp("doc-examples")
    (root / "runs").mkdir()
    os.symlink(tiny_tokenizer_dir, root / "runs" / "tok")
    tokenizer = load_tokenizer(tiny_tokenizer_dir)
    sizes = {**TINY, "vocab_size": len(tokenizer)}
    sizes.pop("cell_size")
    torch.manual_seed(0)
    save_run_folder(
        root / "runs" / "bert", EgbertBertForPreTraining(EgbertBertConfig(**sizes)), tokenizer
    )
    save_run_folder(
        root / "runs" / "gpt", EgbertGPTForCausalLM(EgbertGPTConfig(**sizes)), tokenizer
    )
    os.symlink(root / "runs" / "bert", root / "runs" / "bert-mini")
    os.symlink(root / "runs" / "gpt", root / "runs" / "gpt-mini")
    (root / "tiny.yaml").write_text(yaml.safe_dump(TINY), encoding="utf-8")
    corpus = micro_data / "corpus" / "wikitext-2" / "wiki.train.tokens"
    lines = corpus.read_text(encoding="utf-8").splitlines(keepends=True)
    for name in ("wiki.train.tokens", "wiki.txt"):
        (root / name).write_text("".join(lines[:200]), encoding="utf-8")
    # paragraphs enough that the 1% a block holds out fills a block of gpt's 128 tokens
    texts = [line.strip() for line in lines if len(line.split()) > 20]
    with (root / "a.jsonl").open("w", encoding="utf-8") as file:
        file.writelines(json.dumps({"text": text}) + "\n" for text in texts[::2])
    pq.write_table(pa.table({"text": texts[1::2]}), root / "b.parquet")
    (root / "sentences.txt").write_text("one sentence\nanother one\na third\n", encoding="utf-8")
    os.symlink(micro_data / "glue", root / "glue")
    return root


@pytest.fixture
def workdir(examples: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh folder as the working directory: a copy of the example runs (blocks write into
    runs/), links to the other examples."""
    for entry in examples.iterdir():
        if entry.name == "runs":
            shutil.copytree(entry, tmp_path / "runs")
        else:
            os.symlink(entry, tmp_path / entry.name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(autouse=True)
def one_thread_fresh_accelerate():
    with torch_threads(1):
        fresh_accelerate()
        yield
        fresh_accelerate()


def test_every_stand_in_replaces_something():
    code = "\n".join(code for _, code in BLOCKS)
    for written, _ in STAND_INS:
        assert written in code, f"no block holds {written!r}: drop or fix its stand-in"


@pytest.mark.parametrize("code", [code for _, code in BLOCKS], ids=[name for name, _ in BLOCKS])
def test_a_documented_block_runs(code: str, workdir: Path):
    exec(compile(with_stand_ins(code), "<block>", "exec"), {"__name__": "__main__"})


def test_the_model_card_s_block_runs(examples: Path, workdir: Path):
    model_dir = examples / "runs" / "bert" / "model"
    model = EgbertBertForPreTraining.from_pretrained(model_dir)
    name = "bert-mini"
    card = report.model_card(report.ModelCardInfo(), model, name, {}, "", {})
    (block,) = python_blocks(str(card))
    shutil.rmtree(workdir / "runs")  # `"{name}"` is the model folder the card describes
    os.symlink(model_dir, workdir / name)
    exec(compile(block, "<card>", "exec"), {"__name__": "__main__"})
