"""`egbert finetune` end to end with a tiny BERT on slices of the real GLUE files."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from option_coverage import proves
from safetensors.torch import load_file
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BertConfig,
    BertModel,
)

from egbert.commands.finetune import main
from egbert.errors import CheckpointError, ConfigError
from egbert.finetune.run import tokenize
from egbert.finetune.tasks import GLUE_TASKS, read_glue_split
from egbert.models.bert import EgbertBertConfig, EgbertBertModel
from egbert.tokenizer import load_tokenizer

TINY = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
}
SLICE = {"train.tsv": 32, "dev.tsv": 24, "test.tsv": 20}  # data rows kept per file
FAST = ["--epochs", "2", "--batch-size", "8", "--max-seq-length", "48", "--lr", "1e-3"]


@pytest.fixture(scope="module")
def glue_slice(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """RTE and STS-B in the GLUE layout, cut to a few dozen rows per file."""
    root = tmp_path_factory.mktemp("glue")
    for task in ("RTE", "STS-B"):
        (root / task).mkdir()
        for name, rows in SLICE.items():
            with (data_dir / "glue" / task / name).open(encoding="utf-8") as handle:
                lines = [next(handle) for _ in range(rows + 1)]  # the header, then data rows
            (root / task / name).write_text("".join(lines), encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def tiny_bert_dir(tiny_tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised egbert BERT saved with the shared tiny tokenizer."""
    out = tmp_path_factory.mktemp("tiny-bert")
    tokenizer = load_tokenizer(tiny_tokenizer_dir)
    torch.manual_seed(0)
    EgbertBertModel(EgbertBertConfig(vocab_size=len(tokenizer), **TINY)).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def test_a_tokenized_split_is_named_by_its_text_tokenizer_and_length(
    glue_slice: Path, tiny_tokenizer_dir: Path, minilm_dir: Path
) -> None:
    """Our fingerprint replaces datasets' pickling of the tokenizer: stable across calls (the
    backend's truncation state changes with each call), different when the encoding differs."""
    task = GLUE_TASKS["rte"]
    train = read_glue_split(task, "train", glue_slice)
    tiny = load_tokenizer(tiny_tokenizer_dir)
    first, again = (tokenize(train, task, tiny, 48, "train")._fingerprint for _ in range(2))
    assert first == again
    others = {
        tokenize(train, task, tiny, 32, "train")._fingerprint,
        tokenize(train, task, load_tokenizer(minilm_dir), 48, "train")._fingerprint,
        tokenize(
            read_glue_split(task, "validation", glue_slice), task, tiny, 48, "dev"
        )._fingerprint,
    }
    assert first not in others and len(others) == 3


def read_predictions(path: Path) -> list[list[str]]:
    return [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines()]


def dev_scores(model_dir: Path, dev_file: Path) -> tuple[float, float]:
    """A saved RTE classifier's accuracy (scikit-learn's) and mean cross entropy (torch's) on a
    GLUE dev file, tokenized as its tokenizer pairs sentences (cut to FAST's 48 tokens)."""
    with dev_file.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    first, second = [row["sentence1"] for row in rows], [row["sentence2"] for row in rows]
    inputs = tokenizer(first, second, truncation=True, max_length=48, padding=True,
                       return_tensors="pt")  # fmt: skip
    labels = torch.tensor([model.config.label2id[row["label"]] for row in rows])
    with torch.no_grad():
        logits = model(**inputs).logits
    accuracy = accuracy_score(labels.tolist(), logits.argmax(-1).tolist())
    return accuracy, F.cross_entropy(logits, labels).item()


@pytest.mark.parametrize("features", ["cls", "last4-concat"])
@pytest.mark.parametrize("freeze", [False, True])
def test_rte_end_to_end(
    glue_slice: Path, tiny_bert_dir: Path, tmp_path: Path, features: str, freeze: bool
) -> None:
    out = tmp_path / "rte"
    args = ["--task", "rte", "--model", str(tiny_bert_dir), "--data-dir", str(glue_slice)]
    args += ["--output-dir", str(out), "--features", features, *FAST]
    main(args + (["--freeze"] if freeze else []))

    results = json.loads((out / "eval_results.json").read_text())
    accuracy = results["metrics"]["validation"]["accuracy"]
    assert 0.0 <= accuracy <= 1.0
    assert results["score"] == pytest.approx(accuracy)
    assert results["train_examples"] == SLICE["train.tsv"]
    assert [entry["epoch"] for entry in results["history"]] == [1, 2]
    best = max(results["history"], key=lambda entry: entry["score"])
    assert results["score"] == pytest.approx(best["score"])
    # the best epoch is the one kept: the saved model's own dev accuracy, scored by scikit-learn
    accuracy, _ = dev_scores(out / "model", glue_slice / "RTE" / "dev.tsv")
    assert accuracy == pytest.approx(best["score"])
    assert results["options"]["features"] == features

    rows = read_predictions(out / "predictions" / "RTE.tsv")
    assert rows[0] == ["index", "prediction"]
    assert [int(index) for index, _ in rows[1:]] == list(range(SLICE["test.tsv"]))
    assert {label for _, label in rows[1:]} <= {"entailment", "not_entailment"}

    model = AutoModelForSequenceClassification.from_pretrained(out / "model")
    assert model.config.classifier_features == features
    assert model.config.id2label == {0: "entailment", 1: "not_entailment"}
    backbone = EgbertBertModel.from_pretrained(tiny_bert_dir).state_dict()
    tuned = model.base_model.state_dict()
    unchanged = all(torch.equal(tuned[name], backbone[name]) for name in backbone)
    assert unchanged == freeze


def test_the_best_model_by_loss_is_the_epoch_of_the_lowest_dev_loss(
    glue_slice: Path, tiny_bert_dir: Path, tmp_path: Path
) -> None:
    """--metric-for-best-model loss: the model kept has the lowest of the epochs' dev losses,
    its dev loss computed again here from its logits. The dev labels are flipped: what the model
    learns of the training rows raises its dev loss, so the lowest is not the last epoch's."""
    glue = shutil.copytree(glue_slice, tmp_path / "glue")
    flip = {"entailment": "not_entailment", "not_entailment": "entailment"}
    header, *rows = (glue / "RTE" / "dev.tsv").read_text(encoding="utf-8").splitlines()
    flipped = [row.rsplit("\t", 1)[0] + "\t" + flip[row.rsplit("\t", 1)[1]] for row in rows]
    (glue / "RTE" / "dev.tsv").write_text("\n".join([header, *flipped]) + "\n", encoding="utf-8")
    out = tmp_path / "rte"
    args = ["--task", "rte", "--model", str(tiny_bert_dir), "--data-dir", str(glue)]
    main([*args, "--output-dir", str(out), *FAST, "--epochs", "3", "--no-predict",
          "--metric-for-best-model", "loss"])  # fmt: skip
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [record["loss"] for record in records if record["split"] == "eval"]
    assert len(losses) == 3 and min(losses) < losses[-1]
    _, kept = dev_scores(out / "model", glue / "RTE" / "dev.tsv")
    assert kept == pytest.approx(min(losses), rel=1e-4)


def test_all_tasks_regression_and_table(
    glue_slice: Path, tiny_bert_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "all"
    args = ["--task", "all", "--model", str(tiny_bert_dir), "--data-dir", str(glue_slice)]
    main([*args, "--output-dir", str(out), *FAST, "--epochs", "1"])

    table = capsys.readouterr().out
    assert "| rte | acc " in table and "| stsb | pearson " in table
    assert "| GLUE average (stsb, rte) |" in table
    summary = json.loads((out / "eval_results.json").read_text())
    assert set(summary["tasks"]) == {"rte", "stsb"}
    assert summary["glue_average"] == pytest.approx(
        (summary["tasks"]["rte"]["score"] + summary["tasks"]["stsb"]["score"]) / 2
    )
    rows = read_predictions(out / "predictions" / "STS-B.tsv")
    assert len(rows) == SLICE["test.tsv"] + 1
    labels = torch.tensor(read_glue_split(GLUE_TASKS["stsb"], "train", glue_slice)["label"])
    config = json.loads((out / "stsb" / "model" / "config.json").read_text())
    assert config["regression_target_mean"] == pytest.approx(labels.mean().item())
    assert config["regression_target_std"] == pytest.approx(labels.std(unbiased=False).item())
    rte_config = json.loads((out / "rte" / "model" / "config.json").read_text())
    assert "regression_target_mean" not in rte_config
    assert all(float(score) == float(score) for _, score in rows[1:])  # numbers, not NaN
    # each dev example's prediction, written by the kept model: they give its score again
    rte = summary["tasks"]["rte"]["dev_predictions"]["validation"]
    dev = read_glue_split(GLUE_TASKS["rte"], "validation", glue_slice)
    assert rte["references"] == list(dev["label"])
    accuracy = accuracy_score(rte["references"], rte["predictions"])
    assert accuracy == summary["tasks"]["rte"]["score"]
    stsb = summary["tasks"]["stsb"]["dev_predictions"]["validation"]
    correlations = [pearsonr(stsb["predictions"], stsb["references"])[0],
                    spearmanr(stsb["predictions"], stsb["references"])[0]]  # fmt: skip
    # an undefined correlation (constant predictions of a tiny model) scores 0, as GLUE's metric
    expected = np.mean(np.nan_to_num(correlations))
    assert expected == pytest.approx(summary["tasks"]["stsb"]["score"], abs=1e-6)
    assert (out / "predictions" / "RTE.tsv").is_file()


def test_no_predict_skips_the_test_sets(glue_slice: Path, tiny_bert_dir: Path, tmp_path: Path):
    out = tmp_path / "rte"
    args = ["--task", "rte", "--model", str(tiny_bert_dir), "--data-dir", str(glue_slice)]
    main([*args, "--output-dir", str(out), *FAST, "--epochs", "1", "--no-predict"])

    results = json.loads((out / "eval_results.json").read_text())
    assert 0.0 <= results["metrics"]["validation"]["accuracy"] <= 1.0
    assert results["predictions"] == {}
    assert not (out / "predictions").exists()


def test_stock_bert_checkpoint_and_custom_jsonl_task(
    tiny_tokenizer_dir: Path, tmp_path: Path
) -> None:
    tokenizer = load_tokenizer(tiny_tokenizer_dir)
    stock_dir = tmp_path / "stock-bert"
    config = BertConfig(vocab_size=len(tokenizer), **TINY)
    BertModel(config).save_pretrained(stock_dir)
    tokenizer.save_pretrained(stock_dir)

    def write(name: str, rows: list[tuple[str, str]]) -> Path:
        lines = [json.dumps({"text": text, "mood": mood}) for text, mood in rows]
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
        return tmp_path / name

    rows = [("what a lovely day", "happy"), ("this is awful", "sad")] * 8
    args = ["--model", str(stock_dir), "--output-dir", str(tmp_path / "out"), *FAST]
    args += ["--train-file", str(write("train.jsonl", rows))]
    args += ["--validation-file", str(write("dev.jsonl", rows[:4]))]
    args += ["--test-file", str(write("test.jsonl", rows[:3]))]
    # A random model's [CLS] vectors hardly differ between inputs (fine-tuning through them
    # takes many steps); the mean of its last layers separates two sentences in a few.
    args += ["--features", "last4-concat", "--pool", "mean"]
    # four epochs: in two, one random start in two (seeds 0..3 tried) had not separated them yet
    main([*args, "--text-columns", "text", "--label-column", "mood", "--epochs", "4"])

    results = json.loads((tmp_path / "out" / "eval_results.json").read_text())
    # two sentences, one a label each: a model that learns anything separates them
    assert results["metrics"]["validation"] == {"accuracy": 1.0}
    predictions = read_predictions(tmp_path / "out" / "predictions" / "custom.tsv")
    assert [row[0] for row in predictions[1:]] == ["0", "1", "2"]
    assert [row[1] for row in predictions[1:]] == ["happy", "sad", "happy"]
    saved = json.loads((tmp_path / "out" / "model" / "config.json").read_text())
    assert saved["model_type"] == "egbert-bert"  # converted from the stock checkpoint


def test_bad_options_are_one_line_errors(glue_slice: Path, tiny_bert_dir: Path) -> None:
    common = ["--data-dir", str(glue_slice), "--output-dir", "unused"]
    with pytest.raises(ConfigError, match="unknown task 'rtee'; choose from cola, sst2"):
        main(["--task", "rtee", "--model", str(tiny_bert_dir), *common])
    with pytest.raises(ConfigError, match="predictions come from the mnli model"):
        main(["--task", "ax", "--model", str(tiny_bert_dir), *common])
    with pytest.raises(CheckpointError, match="no such model directory"):
        main(["--task", "rte", "--model", str(glue_slice / "nope"), *common])
    with pytest.raises(ConfigError, match="custom task needs"):
        main(["--train-file", "x.csv", "--model", str(tiny_bert_dir), *common])


@proves("finetune", "--resume-from-checkpoint", "--overwrite-output-dir")
def test_a_run_goes_on_from_the_checkpoint_named_or_starts_over(
    glue_slice: Path, tiny_bert_dir: Path, tmp_path: Path
) -> None:
    """Two epochs of four steps, a checkpoint at each end: resumed from the first, the run ends
    with the same model (the second's checkpoint, of the branch trained again, removed); with
    --overwrite-output-dir a run starts over and says which checkpoints it removed."""
    out = tmp_path / "rte"
    argv = ["--task", "rte", "--model", str(tiny_bert_dir), "--data-dir", str(glue_slice)]
    argv += ["--output-dir", str(out), *FAST, "--keep-checkpoints", "2", "--no-predict"]
    argv += ["--report-to", "none"]
    main(argv)
    first = load_file(out / "model/model.safetensors")
    main([*argv, "--resume-from-checkpoint", str(out / "checkpoints/step-4")])
    log = (out / "train.log").read_text().splitlines()
    assert [line for line in log if "resumed" in line] == [
        f"egbert: resumed from {out / 'checkpoints/step-4'} (step 4, epoch 1, batch 0 of the "
        "epoch); removed the later step-8"
    ]
    for name, tensor in load_file(out / "model/model.safetensors").items():
        torch.testing.assert_close(tensor, first[name], atol=1e-6, rtol=0)
    main([*argv, "--overwrite-output-dir", "--epochs", "1"])
    log = (out / "train.log").read_text().splitlines()
    assert [line for line in log if "overwrite" in line] == [
        "egbert: --overwrite-output-dir: removed the earlier run's checkpoints step-4, step-8 "
        f"from {out / 'checkpoints'}"
    ]
    assert [path.name for path in (out / "checkpoints").iterdir()] == ["step-4"]
    assert json.loads((out / "eval_results.json").read_text())["epochs"] == 1
