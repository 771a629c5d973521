"""Each option of pretrain, finetune, probe, prompt-eval, embed and generate that no other test
runs with a non-default value, run here through its command or the job's Python API, many
options to a run, on tiny data."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from egbert import run_finetuning, run_pretraining
from egbert.cli import main as cli_main

pytestmark = pytest.mark.usefixtures("one_thread_and_fresh_accelerate")

NO_DROPOUT = "hidden_dropout_prob=0,attention_probs_dropout_prob=0"


@pytest.fixture(scope="module")
def corpus(micro_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """200 lines of WikiText-2 train and 50 of valid."""
    wiki, folder = micro_data / "corpus" / "wikitext-2", tmp_path_factory.mktemp("corpus")
    found = {}
    for name, lines in (("train", 200), ("valid", 50)):
        text = (wiki / f"wiki.{name}.tokens").read_text(encoding="utf-8")
        found[name] = folder / f"{name}.tokens"
        found[name].write_text("".join(text.splitlines(keepends=True)[:lines]), encoding="utf-8")
    return found


def records(out: Path, split: str) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [record for record in map(json.loads, lines) if record["split"] == split]


@pytest.fixture(scope="module")
def bert_run(corpus, tiny_tokenizer_dir, tmp_path_factory) -> Path:
    """A small bert masked LM (no NSP, no dropout) for the other commands' runs below; what each
    of pretrain's options does is proved in tests/test_pretrain_options.py,
    test_data_options.py and test_trainer_options.py."""
    out = tmp_path_factory.mktemp("bert-run")
    preset = out.parent / f"{out.name}-preset.yaml"  # a preset file: the tiny one, smaller
    preset.write_text(
        "hidden_size: 64\nnum_hidden_layers: 2\nnum_attention_heads: 2\nintermediate_size: 128\n"
        "max_position_embeddings: 64\n",
        encoding="utf-8",
    )
    result = run_pretraining(
        model="bert", preset=str(preset), tokenizer=str(tiny_tokenizer_dir),
        train_files=[str(corpus["train"])], doc_boundary="wikitext", seq_len=32, nsp=False,
        config_overrides=NO_DROPOUT, output_dir=str(out), batch_size=4, max_steps=4,
        report_to=["none"], use_cpu=True,
    )  # fmt: skip
    assert result.step == 4
    return out


@pytest.fixture(scope="module")
def gpt_run(corpus, tiny_tokenizer_dir, tmp_path_factory) -> Path:
    """A tiny gpt for the other commands' runs below."""
    out = tmp_path_factory.mktemp("gpt-run")
    result = run_pretraining(
        model="gpt", preset="tiny", tokenizer=str(tiny_tokenizer_dir),
        train_files=[str(corpus["train"])], seq_len=32, output_dir=str(out), batch_size=4,
        max_steps=3, report_to=["none"], use_cpu=True,
    )  # fmt: skip
    assert result.step == 3
    return out


def test_finetune_runs_with_every_option(bert_run, micro_data, tmp_path, monkeypatch):
    glue = micro_data / "glue"
    common = {"model": str(bert_run), "max_seq_length": 32, "batch_size": 8, "report_to": ["none"]}
    run_finetuning(
        task="rte", data_dir=str(glue), max_train_samples=16, features="last4-concat",
        pool="mean", layer_norm=True, freeze=True, config_overrides="hidden_dropout_prob=0",
        allow_pickle=True, predict=False, base_model_id="someone/bert-tiny", license="mit",
        output_dir=str(tmp_path / "rte"), max_steps=3, log_every=1, eval_every=3,
        adam_beta1=0.85, adam_beta2=0.99, adam_epsilon=1e-6, weight_decay=0.0, grad_accum=2,
        label_smoothing=0.1, max_grad_norm=0.5, num_workers=1, schedule="cosine",
        skip_nonfinite=1, use_cpu=True, ddp_find_unused_parameters=True, resume=True,
        resume_anyway=True,
        **common,
    )  # fmt: skip
    assert [record["step"] for record in records(tmp_path / "rte", "eval")] == [3]
    card = (tmp_path / "rte" / "model" / "README.md").read_text(encoding="utf-8")
    assert "someone/bert-tiny" in card
    rows = (glue / "STS-B" / "train.tsv").read_text(encoding="utf-8").splitlines()
    header = rows[0].split("\t")
    lines = [dict(zip(header, row.split("\t"), strict=False)) for row in rows[1:]]
    table = tmp_path / "scores.jsonl"
    scored = [{"a": r["sentence1"], "b": r["sentence2"], "s": float(r["score"])} for r in lines]
    table.write_text("".join(json.dumps(row) + "\n" for row in scored), encoding="utf-8")
    compile_module, modes = torch.nn.Module.compile, []

    def compile_eagerly(module, mode=None, **options):  # inductor takes minutes on 2 cores
        modes.append(mode)
        compile_module(module, backend="aot_eager", **options)

    monkeypatch.setattr(torch.nn.Module, "compile", compile_eagerly)
    result = run_finetuning(
        train_file=str(table), validation_file=str(table), test_file=str(table),
        text_columns=["a", "b"], label_column="s", regression=True, compile=True,
        compile_mode="max-autotune-no-cudagraphs", output_dir=str(tmp_path / "custom"), epochs=1,
        **common,
    )  # fmt: skip
    assert modes == ["max-autotune-no-cudagraphs"] and result.results
    assert "pearson" in json.dumps(result.results[0]["metrics"])
    assert (tmp_path / "custom" / "predictions" / "custom.tsv").is_file()


def test_probe_and_prompt_eval_run_with_every_option(bert_run, gpt_run, micro_data, tmp_path):
    glue = str(micro_data / "glue")
    common = ["--data-dir", glue, "--task", "rte", "--batch-size", "8", "--seed", "3"]
    common += ["--device", "cpu", "--no-bf16", "--allow-pickle"]
    cli_main(["probe", "--model", str(bert_run), *common, "--features", "last4-concat", "--pool",
              "cls", "--max-train-samples", "20", "--output-dir", str(tmp_path / "p")])  # fmt: skip
    assert (tmp_path / "p").is_dir() and any((tmp_path / "p").iterdir())
    cli_main(["prompt-eval", "--model", str(gpt_run), *common, "--shots", "0", "1", "--calibrate",
              "--max-eval-samples", "6", "--output-dir", str(tmp_path / "q")])  # fmt: skip
    assert any((tmp_path / "q").iterdir())


def test_embed_and_generate_run_with_every_option(bert_run, gpt_run, tmp_path, capsys):
    pairs = tmp_path / "pairs.jsonl"
    rows = [{"first": "the cat sat", "second": "on the mat"}, {"first": "a dog", "second": "ran"}]
    pairs.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="latin-1")
    common = ["--model", str(bert_run), "--device", "cpu", "--allow-pickle", "--batch-size", "1"]
    common += ["--max-length", "16"]
    vectors = tmp_path / "pooled.npy"
    cli_main(["embed", *common, "--input", str(pairs), "--text-field", "first", "--pair-field",
              "second", "--encoding", "latin-1", "--output", str(vectors), "--layers", "-1,-2",
              "--combine", "mean", "--pool", "cls", "--normalize"])  # fmt: skip
    assert np.allclose(np.linalg.norm(np.load(vectors), axis=1), 1.0, atol=1e-4)
    texts = tmp_path / "texts.txt"
    texts.write_text("the cat sat on the mat and looked at the dog for a while\na dog ran\n")
    words = tmp_path / "words.jsonl"
    cli_main(["embed", *common, "--input", str(texts), "--output", str(words), "--layers", "-1",
              "--combine", "none", "--pool", "none", "--word-level", "--stride", "4"])  # fmt: skip
    assert len(words.read_text(encoding="utf-8").splitlines()) == 2
    cli_main(["generate", "--model", str(gpt_run), "--prompt", "The", "--max-new-tokens", "3",
              "--temperature", "0.8", "--top-k", "5", "--top-p", "0.9", "--seed", "1",
              "--allow-pickle"])  # fmt: skip
    assert capsys.readouterr().out.strip()  # the continuation, streamed
