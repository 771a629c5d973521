"""`egbert reward` with a tiny BERT: TRL's RewardTrainer learns to score the chosen text of a
pair above the rejected one, the folder it saves is a one-output sequence classifier, pairs come
from every kind of source (and from a task's labels), and each option reaches what it names."""

from __future__ import annotations

import csv
import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from option_coverage import proves
from safetensors.torch import load_file, save_file
from transformers import AutoModelForSequenceClassification

from egbert.alignment.pairs import load_pairs, pairs_from_task
from egbert.alignment.reward import (
    RewardArguments,
    pair_accuracy,
    reward_config,
    reward_trainer,
    training_pairs,
)
from egbert.commands.reward import main
from egbert.errors import CheckpointError, ConfigError, DataError
from egbert.tokenizer import load_tokenizer

GPT_SIZES = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2}
WORDS = ["the", "army", "of", "a", "city", "was", "in", "his", "first", "and", "new", "to"]
# Each pair: a random prompt, a chosen answer from one pool and a rejected one from the other
# (the untrained scorer below ranks the rejected pool higher: training has to turn it round).
CHOSEN = [" of the city fell", " the city fell in war", " their city fell"]
REJECTED = [" and the army won", " the new army won", " his army won at one time"]
FAST = ["--batch-size", "8", "--lr", "2e-3", "--warmup-steps", "0"]


@pytest.fixture(scope="module")
def scorer_start(tiny_egbert_bert_dir: Path) -> Path:
    """What the scorer starts from: conftest's randomly initialised tiny egbert BERT."""
    return tiny_egbert_bert_dir


def toy_pairs(count: int, seed: int) -> list[dict[str, str]]:
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(count):
        prompt = " ".join(rng.choice(WORDS, size=rng.integers(3, 8)))
        answers = {"chosen": rng.choice(CHOSEN), "rejected": rng.choice(REJECTED)}
        pairs.append({"prompt": prompt, **answers})
    return pairs


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def pair_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("pairs")
    return (
        write_jsonl(root / "train.jsonl", toy_pairs(64, seed=0)),
        write_jsonl(root / "dev.jsonl", toy_pairs(40, seed=1)),
    )


def sentences_by_label(path: Path) -> dict[str, set[str]]:
    """The TSV's sentences under each label, read with the csv module."""
    found: dict[str, set[str]] = {}
    with path.open(encoding="utf-8", newline="") as handle:
        for row in csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE):
            found.setdefault(row["label"], set()).add(row["sentence"])
    return found


def scores_of(model_dir: Path, texts: list[str]) -> np.ndarray:
    """The saved folder's one logit for each text, read as transformers users read it."""
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    tokenizer = load_tokenizer(model_dir)
    with torch.no_grad():
        logits = model(**tokenizer(texts, padding=True, return_tensors="pt")).logits
    assert logits.shape == (len(texts), 1)  # one output: the reward
    return logits[:, 0].numpy()


@proves("reward", "--model", "--pairs", "--validation-pairs", "--output-dir", "--max-steps")
def test_training_scores_the_chosen_text_above_the_rejected(
    scorer_start: Path, pair_files: tuple[Path, Path], tmp_path: Path
) -> None:
    """Before training the scorer ranks most held-out pairs the wrong way round; after 40 steps
    nearly all the right way, as the saved folder (one output, loaded by the Auto class) scores
    them, and reward_results.json's accuracy is the share that folder gets right."""
    train, dev = pair_files
    start = reward_trainer(RewardArguments(str(scorer_start), str(tmp_path / "start"), str(train)))
    before = pair_accuracy(start.trainer.model, start.tokenizer, load_pairs(str(dev)), 64, 0)
    assert before["accuracy"] < 0.5
    dev_pairs = [json.loads(line) for line in dev.read_text().splitlines()]
    chosen = [p["prompt"] + p["chosen"] for p in dev_pairs]
    rejected = [p["prompt"] + p["rejected"] for p in dev_pairs]
    out = tmp_path / "reward"
    main(["--model", str(scorer_start), "--pairs", str(train), "--validation-pairs", str(dev)]
         + ["--output-dir", str(out), "--max-steps", "40", *FAST])  # fmt: skip
    results = json.loads((out / "reward_results.json").read_text())
    model_dir = out / "model"
    right = scores_of(model_dir, chosen) > scores_of(model_dir, rejected)
    assert right.mean() >= 0.9
    accuracy = results["pairwise_accuracy"]
    assert accuracy["accuracy"] == pytest.approx(right.mean(), abs=1e-4)
    assert accuracy["pairs"] == len(dev_pairs) and results["steps"] == 40
    assert accuracy["low"] <= accuracy["accuracy"] <= accuracy["high"]
    assert results["train_pairs"] == 64


@proves(
    "reward",
    "--epochs",
    "--lr",
    "--batch-size",
    "--grad-accum",
    "--weight-decay",
    "--warmup-steps",
    "--center-rewards-coefficient",
    "--bf16",
    "--save-every",
)
def test_the_training_options_reach_trls_configuration(tmp_path: Path) -> None:
    options = {
        "epochs": 3.0,
        "lr": 3e-4,
        "batch_size": 5,
        "grad_accum": 2,
        "weight_decay": 0.07,
        "warmup_steps": 0.25,
        "center_rewards_coefficient": 0.01,
        "seed": 9,
    }
    args = RewardArguments("m", str(tmp_path), pairs="p.jsonl", bf16=False, **options)
    config = reward_config(args, tmp_path / "checkpoints")
    assert (config.num_train_epochs, config.learning_rate) == (3.0, 3e-4)
    assert (config.per_device_train_batch_size, config.gradient_accumulation_steps) == (5, 2)
    assert (config.weight_decay, config.warmup_steps) == (0.07, 0.25)
    assert (config.center_rewards_coefficient, config.seed) == (0.01, 9)
    assert config.bf16 is False and config.save_strategy == "epoch"
    assert config.max_steps == -1 and config.output_dir == str(tmp_path / "checkpoints")
    every = reward_config(RewardArguments("m", "o", pairs="p", bf16=True, save_every=7), tmp_path)
    assert every.bf16 is True and (every.save_strategy, every.save_steps) == ("steps", 7)


@proves("reward", "--pairs-from-task", "--data-dir", "--chosen-label", "--seed")
def test_pairs_from_a_tasks_labels_put_a_sentence_of_the_label_over_another(
    sst2_slice: Path, scorer_start: Path, tmp_path: Path
) -> None:
    """Each training pair: a positive sentence (the default) over a negative one, each used
    once, as many as the smaller side has; held-out pairs from dev; --chosen-label negative
    turns them round, --seed draws another pairing."""
    train_tsv = sentences_by_label(sst2_slice / "SST-2" / "train.tsv")
    dev_tsv = sentences_by_label(sst2_slice / "SST-2" / "dev.tsv")
    common = {"model": str(scorer_start), "output_dir": str(tmp_path)}
    task = {"pairs_from_task": "sst2", "data_dir": str(sst2_slice)}
    train, held_out = training_pairs(RewardArguments(**common, **task))
    for pairs, by_label in ((train, train_tsv), (held_out, dev_tsv)):
        assert len(pairs) == min(len(by_label["0"]), len(by_label["1"]))
        assert set(pairs["chosen"]) <= by_label["1"] and set(pairs["rejected"]) <= by_label["0"]
        assert len(set(pairs["chosen"])) == len(pairs) == len(set(pairs["rejected"]))
    turned, _ = training_pairs(RewardArguments(**common, **task, chosen_label="negative"))
    assert set(turned["chosen"]) <= train_tsv["0"] and set(turned["rejected"]) <= train_tsv["1"]
    other, _ = training_pairs(RewardArguments(**common, **task, seed=7))
    assert sorted(other["chosen"]) == sorted(train["chosen"])
    assert list(other["chosen"]) != list(train["chosen"])
    by_files_label = pairs_from_task("sst2", "train", str(sst2_slice), "1", seed=42)
    assert list(by_files_label["chosen"]) == list(train["chosen"])


@proves("reward", "--validation-share", "--max-train-pairs")
def test_a_share_of_the_pairs_is_held_out_and_training_takes_the_first_n(
    scorer_start: Path, pair_files: tuple[Path, Path], tmp_path: Path
) -> None:
    train_file, _ = pair_files
    common = {"model": str(scorer_start), "output_dir": str(tmp_path), "pairs": str(train_file)}
    train, held_out = training_pairs(RewardArguments(**common, validation_share=0.25))
    assert (len(train), len(held_out)) == (48, 16)
    assert sorted([*train["prompt"], *held_out["prompt"]]) == sorted(
        load_pairs(str(train_file))["prompt"]
    )
    first, _ = training_pairs(RewardArguments(**common, validation_share=0.25, max_train_pairs=5))
    assert list(first["prompt"]) == list(train["prompt"])[:5]


@proves("reward", "--max-seq-length")
def test_each_text_is_cut_to_the_sequence_length(
    scorer_start: Path, pair_files: tuple[Path, Path], tmp_path: Path
) -> None:
    common = {"model": str(scorer_start), "pairs": str(pair_files[0])}
    lengths = {}
    for limit in (None, 8):
        run = reward_trainer(RewardArguments(**common, output_dir=str(tmp_path / str(limit)),
                                             max_seq_length=limit))  # fmt: skip
        tokenized = run.trainer.train_dataset
        ids = [*tokenized["chosen_ids"], *tokenized["rejected_ids"]]
        lengths[limit] = max(map(len, ids))
    assert lengths[8] == 8 < lengths[None]


@proves("reward", "--budget-minutes")
def test_the_budget_ends_training_at_the_first_step_past_it(
    scorer_start: Path, pair_files: tuple[Path, Path], tmp_path: Path
) -> None:
    argv = ["--model", str(scorer_start), "--pairs", str(pair_files[0]), *FAST]
    main(
        [
            *argv,
            "--output-dir",
            str(tmp_path / "a"),
            "--max-steps",
            "30",
            "--budget-minutes",
            "1e-6",
        ]
    )
    assert json.loads((tmp_path / "a" / "reward_results.json").read_text())["steps"] == 1


@proves("reward", "--resume")
def test_sigterm_leaves_a_checkpoint_and_resume_ends_where_the_clean_run_ends(
    scorer_start: Path, pair_files: tuple[Path, Path], tmp_path: Path, subprocess_env, warm_python
) -> None:
    """A clean 24-step run; the same run stopped by SIGTERM (after its step-4 checkpoint): exit
    143, a checkpoint of the step it stopped at, no model; resumed, it ends with the clean run's
    weights, and resumed from a checkpoint changed by hand, with others."""
    argv = ["--model", str(scorer_start), "--pairs", str(pair_files[0]), "--max-steps", "24"]
    argv += [*FAST, "--save-every", "4"]
    main([*argv, "--output-dir", str(tmp_path / "clean")])
    out = tmp_path / "stopped"
    command = [warm_python(subprocess_env), "-m", "egbert.cli", "reward", *argv]
    process = subprocess.Popen([*command, "--output-dir", str(out)], env=subprocess_env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    deadline = time.monotonic() + 120
    while not (out / "checkpoints" / "checkpoint-4").is_dir():
        assert process.poll() is None, process.stdout.read().decode()[-2000:]
        assert time.monotonic() < deadline, "no checkpoint-4 after 120 s"
        time.sleep(0.01)
    process.send_signal(signal.SIGTERM)
    said = process.communicate(timeout=120)[0].decode()
    assert process.returncode == 128 + signal.SIGTERM, said[-2000:]
    stopped = max(int(p.name.split("-")[1]) for p in (out / "checkpoints").glob("checkpoint-*"))
    assert 4 <= stopped < 24 and f"stopped at step {stopped}" in said
    assert not (out / "model").exists()
    # a copy whose checkpoint's head is zeroed: what it resumes from, not a fresh start
    altered = tmp_path / "altered"
    shutil.copytree(out, altered)
    weights = altered / "checkpoints" / f"checkpoint-{stopped}" / "model.safetensors"
    state = load_file(weights)
    save_file({**state, "classifier.weight": torch.zeros_like(state["classifier.weight"])}, weights)
    clean = load_file(tmp_path / "clean" / "model" / "model.safetensors")
    main([*argv, "--output-dir", str(out), "--resume"])
    for name, tensor in load_file(out / "model" / "model.safetensors").items():
        torch.testing.assert_close(tensor, clean[name], atol=1e-6, rtol=0)
    main([*argv, "--output-dir", str(altered), "--resume"])
    resumed = load_file(altered / "model" / "model.safetensors")["classifier.weight"]
    assert not torch.allclose(resumed, clean["classifier.weight"], atol=1e-3)


def test_every_kind_of_source_gives_the_same_pairs(tmp_path: Path) -> None:
    rows = toy_pairs(6, seed=3)
    table = datasets.Dataset.from_list(rows)
    write_jsonl(tmp_path / "pairs.jsonl", rows)
    table.to_csv(tmp_path / "pairs.csv", index=False)
    table.to_parquet(tmp_path / "pairs.parquet")
    table.save_to_disk(tmp_path / "saved")
    (tmp_path / "folder").mkdir()
    table.to_parquet(tmp_path / "folder" / "train.parquet")  # a data set folder, as from the Hub
    for source in ("pairs.jsonl", "pairs.csv", "pairs.parquet", "saved", "folder"):
        assert load_pairs(str(tmp_path / source)).to_list() == rows, source


def test_bad_input_is_one_line_before_any_training(
    scorer_start: Path, sst2_slice: Path, pair_files: tuple[Path, Path], tmp_path: Path
) -> None:
    no_rejected = write_jsonl(tmp_path / "half.jsonl", [{"chosen": "a", "answer": "b"}])
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    blank = write_jsonl(tmp_path / "blank.jsonl", [{"chosen": "a", "rejected": ""}])
    cases = {
        "no 'rejected' column (it has chosen, answer)": {"pairs": str(no_rejected)},
        "the file is empty": {"pairs": str(empty)},
        "pair 1 has no chosen or no rejected text": {"pairs": str(blank)},
        "give the pairs: one of --pairs FILE and --pairs-from-task TASK": {},
        "not both": {"pairs": str(pair_files[0]), "pairs_from_task": "sst2"},
        "its examples are sentence pairs": {"pairs_from_task": "rte"},
        "a regression task has no labels": {"pairs_from_task": "stsb"},
        "is not a label of sst2; use one of negative, positive": {
            "pairs_from_task": "sst2", "data_dir": str(sst2_slice), "chosen_label": "happy"
        },
        "--validation-share must be between 0 and 1": {
            "pairs": str(pair_files[0]), "validation_share": 1.0
        },
    }  # fmt: skip
    for message, options in cases.items():
        with pytest.raises((DataError, ConfigError)) as raised:
            args = RewardArguments(str(scorer_start), str(tmp_path / "out"), **options)
            training_pairs(args)
        assert message in str(raised.value) and "\n" not in str(raised.value), message
    assert not (tmp_path / "out").exists()
    argv = ["--model", str(scorer_start), "--pairs", str(pair_files[0])]
    with pytest.raises(CheckpointError, match="--resume: no checkpoint in"):
        main([*argv, "--output-dir", str(tmp_path / "new"), "--resume"])
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "reward_results.json").write_text("{}")
    with pytest.raises(ConfigError, match="holds an earlier run; pass --resume"):
        main([*argv, "--output-dir", str(tmp_path / "used")])
    assert (tmp_path / "used" / "reward_results.json").read_text() == "{}"


@pytest.fixture(scope="module")
def gpt_start(tmp_path_factory: pytest.TempPathFactory, tiny_gpt2_dir: Path) -> Path:
    """A randomly initialised egbert GPT with the tiny GPT-2 checkpoint's byte-level tokenizer."""
    from egbert.models.gpt import EgbertGPTConfig, EgbertGPTModel

    out = tmp_path_factory.mktemp("tiny-gpt")
    tokenizer = load_tokenizer(tiny_gpt2_dir)
    torch.manual_seed(0)
    config = EgbertGPTConfig(vocab_size=len(tokenizer), max_position_embeddings=64, **GPT_SIZES)
    EgbertGPTModel(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.mark.parametrize("start", ["gpt_start", "tiny_gpt2_dir"])
def test_a_gpt_and_a_stock_gpt2_start_a_scorer_too(
    start: str, request: pytest.FixtureRequest, pair_files: tuple[Path, Path], tmp_path: Path
) -> None:
    """egbert's gpt (scored at its last real token) learns the toy preference as bert does; a
    stock GPT-2 checkpoint is converted to egbert's gpt first (the shared one is 2 wide: too
    narrow to learn it, so only its folder is checked)."""
    train, dev = pair_files
    out = tmp_path / "reward"
    argv = ["--model", str(request.getfixturevalue(start)), "--pairs", str(train)]
    main(
        [
            *argv,
            "--validation-pairs",
            str(dev),
            "--output-dir",
            str(out),
            "--max-steps",
            "40",
            *FAST,
        ]
    )
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["model_type"] == "egbert-gpt"
    accuracy = json.loads((out / "reward_results.json").read_text())["pairwise_accuracy"]
    dev_pairs = [json.loads(line) for line in dev.read_text().splitlines()]
    scores = scores_of(out / "model", [p["prompt"] + p["chosen"] for p in dev_pairs])
    assert len(scores) == accuracy["pairs"] == len(dev_pairs)
    if start == "gpt_start":
        assert accuracy["accuracy"] >= 0.9


def test_an_unreadable_source_is_one_line_naming_it(tmp_path: Path) -> None:
    """Each kind of bad source: the error names it (and the line of a broken JSON line)."""
    text = tmp_path / "pairs.txt"
    text.write_text("chosen\trejected\n")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"chosen": "a", "rejected": "b"}\n{"chosen": \n')
    half = write_jsonl(tmp_path / "half.jsonl", [{"chosen": "a"}])
    splits = datasets.DatasetDict({"test": datasets.Dataset.from_list(toy_pairs(2, seed=0))})
    splits.save_to_disk(tmp_path / "splits")
    cases = {
        text: f"{text}: unknown extension '.txt'; pass .jsonl, .json, .csv or .parquet pairs",
        tmp_path / "missing": f"{tmp_path / 'missing'}: no such file, data set folder or Hub",
        broken: f"{broken}:2: not a JSON object",
        half: f"{half}: no 'rejected' column (it has chosen)",
        tmp_path / "splits": f"{tmp_path / 'splits'}: no split 'train'; it has test",
    }
    for source, message in cases.items():
        with pytest.raises(DataError) as raised:
            load_pairs(str(source))
        assert str(raised.value).startswith(message) and "\n" not in str(raised.value), source
    assert len(load_pairs(str(tmp_path / "splits"), split="test")) == 2


def test_a_split_of_one_label_makes_no_pairs(sst2_slice: Path, tmp_path: Path) -> None:
    (tmp_path / "SST-2").mkdir()
    rows = (sst2_slice / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines()
    negative = [rows[0], *(row for row in rows[1:] if row.endswith("\t0"))]
    (tmp_path / "SST-2" / "train.tsv").write_text("\n".join(negative) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match="sst2 train: no pairs, its sentences are all of one side"):
        pairs_from_task("sst2", "train", str(tmp_path), None, seed=0)
    one = [rows[0], negative[1], next(row for row in rows[1:] if row.endswith("\t1"))]
    (tmp_path / "SST-2" / "train.tsv").write_text("\n".join(one) + "\n", encoding="utf-8")
    assert len(pairs_from_task("sst2", "train", str(tmp_path), None, seed=0)) == 1
