"""Each option of pretrain that no other test runs with a non-default value, run here through
the job's Python API, many options to a run, on tiny data. (finetune's, probe's, prompt-eval's,
embed's and generate's options are proved one by one against expectations of their own: see
tests/test_finetune_options.py and each command's test module.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from egbert import run_pretraining

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
    """bert with most of pretrain's and the trainer's options set away from their defaults."""
    out = tmp_path_factory.mktemp("bert-run")
    preset = out.parent / f"{out.name}-preset.yaml"  # a preset file: the tiny one, smaller
    preset.write_text(
        "hidden_size: 64\nnum_hidden_layers: 2\nnum_attention_heads: 2\nintermediate_size: 128\n"
        "max_position_embeddings: 64\n",
        encoding="utf-8",
    )
    result = run_pretraining(
        model="bert", preset=str(preset), tokenizer=str(tiny_tokenizer_dir),
        train_files=[str(corpus["train"])], validation_files=[str(corpus["valid"])],
        max_eval_samples=16, doc_boundary="wikitext", encoding="latin-1",
        encoding_errors="replace", seq_len=32, nsp=False, mlm_probability=0.2,
        whole_word_mask=True, dupe_factor=2, short_seq_prob=0.2, num_proc=1,
        card_datasets=["Salesforce/wikitext"], license="mit", config_overrides=NO_DROPOUT,
        output_dir=str(out), lr=2e-3, weight_decay=0.0, adam_beta1=0.85, adam_beta2=0.99,
        adam_epsilon=1e-6, batch_size=4, grad_accum=2, max_steps=4, schedule="cosine",
        warmup_steps=1, bf16=False, max_grad_norm=0.5, label_smoothing=0.1, eval_every=2,
        save_every=2, keep_checkpoints=1, seed=7, skip_nonfinite=1, log_every=1,
        report_to=["none"], metric_for_best_model="mlm_accuracy", greater_is_better=True,
        num_workers=1, use_cpu=True, ddp_find_unused_parameters=True,
    )  # fmt: skip
    assert result.step == 4 and result.best_step in (2, 4)
    assert [record["step"] for record in records(out, "eval")] == [2, 4]
    card = (out / "model" / "README.md").read_text(encoding="utf-8")
    assert "license: mit" in card and "Salesforce/wikitext" in card
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-4"]  # keep 1
    return out


@pytest.fixture(scope="module")
def gpt_run(corpus, tiny_tokenizer_dir, tmp_path_factory) -> Path:
    """gpt under a budget, epochs and a batch ramp, resumed, then continued from its model."""
    out = tmp_path_factory.mktemp("gpt-run")
    options = dict(
        model="gpt", preset="tiny", tokenizer=str(tiny_tokenizer_dir),
        train_files=[str(corpus["train"])], seq_len=32, output_dir=str(out),
        batch_size=4, batch_ramp_to=8, max_steps=3, epochs=1, budget_minutes=10,
        report_to=["none"], log_every=1, schedule="constant",
    )  # fmt: skip
    run_pretraining(**options)
    resumed = run_pretraining(
        **options | {"max_steps": 4, "resume": True, "seed": 5}, resume_anyway=True
    )
    assert resumed.step == 4
    continued = out.parent / f"{out.name}-continued"
    result = run_pretraining(
        **options | {"output_dir": str(continued), "max_steps": 1},
        init_from=str(out / "model"),
        allow_pickle=True,
    )
    assert result.step == 1
    return out


def test_pretraining_runs_with_every_option(bert_run, gpt_run):
    assert (bert_run / "model" / "model.safetensors").is_file()
    assert len(records(gpt_run, "train")) == 4
