"""`egbert probe`: frozen features of tiny bert, gpt and elmo models (random weights, saved with
the trained test tokenizer) through a linear probe, on GLUE rows and on synthetic tasks where the
probe must succeed (the label is in the text) or fail (the label is noise)."""

from __future__ import annotations

import csv
import json
import math
import random
import shutil
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from model_calls import assert_bf16_and_device_are_the_options, model_calls
from option_coverage import CONFIG_OPTIONS_HELP, RUN_OPTIONS_HELP, help_text, proves
from safetensors.torch import load_file
from scipy.stats import pearsonr, spearmanr
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression, RidgeCV
from sklearn.metrics import accuracy_score
from sklearn.model_selection import train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from transformers import AutoModel, AutoTokenizer, RobertaConfig, RobertaModel

from egbert.cli import main as cli_main
from egbert.embedding import TruncatedInputsWarning, embed, load_model
from egbert.errors import CheckpointError, ConfigError, DataError
from egbert.evaluation import run_probe
from egbert.evaluation.probe import (
    C_GRID,
    choose_c,
    feature_layers,
    fit_probe,
    logistic_probe,
    probe_table,
    sentence_vectors,
    summary_pools,
    task_vectors,
)
from egbert.finetune.metrics import compute_task_metrics
from egbert.finetune.tasks import GLUE_TASKS, get_task, read_glue_split
from egbert.models.bert import EgbertBertConfig, EgbertBertForPreTraining
from egbert.models.elmo import EgbertElmoConfig, EgbertElmoForBidirectionalLM
from egbert.models.gpt import EgbertGPTConfig, EgbertGPTForCausalLM
from egbert.models.heads import (
    EgbertBertForSequenceClassification,
    EgbertElmoForSequenceClassification,
    EgbertGPTForSequenceClassification,
)
from egbert.tokenizer import train_tokenizer

TRANSFORMER = {
    "hidden_size": 32,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 128,
}
TINY_MODELS = {
    "bert": (EgbertBertConfig, EgbertBertForPreTraining, TRANSFORMER),
    "gpt": (EgbertGPTConfig, EgbertGPTForCausalLM, TRANSFORMER),
    "elmo": (EgbertElmoConfig, EgbertElmoForBidirectionalLM, {"hidden_size": 16, "cell_size": 32}),
}
FAMILIES = list(TINY_MODELS)
HEADS = {
    "bert": EgbertBertForSequenceClassification,
    "gpt": EgbertGPTForSequenceClassification,
    "elmo": EgbertElmoForSequenceClassification,
}
TEXTS = [
    "The castle was rebuilt in the twelfth century.",
    "Rain.",
    ("Who rebuilt the castle?", "The king's engineers rebuilt it after the siege."),
]
FILLER = ("the", "a", "river", "castle", "king", "rain", "city", "old", "new", "north", "war")

pytestmark = pytest.mark.usefixtures("one_thread_and_fresh_accelerate")


@pytest.fixture(scope="module")
def family_dirs(tiny_tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Each family's pretraining model (random weights; 4 layers, so last4 is not all of them)
    saved with the tokenizer, as a pretraining run leaves it."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    dirs = {}
    for family, (config_class, model_class, sizes) in TINY_MODELS.items():
        config = config_class(
            vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, num_hidden_layers=4,
            **sizes,
        )  # fmt: skip
        torch.manual_seed(0)
        dirs[family] = tmp_path_factory.mktemp(f"probe-{family}")
        model_class(config).save_pretrained(dirs[family])
        tokenizer.save_pretrained(dirs[family])
    return dirs


def error_line(argv: list[str], capsys) -> str:
    """The one line `egbert ARGV` exits with: an EgbertError's message, or argparse's own."""
    with pytest.raises(SystemExit) as exit_info:
        cli_main(argv)
    code = exit_info.value.code
    return code if isinstance(code, str) else capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("family", FAMILIES)
def test_scores_of_a_classification_task_and_stsb_are_in_range(family, family_dirs, micro_data):
    results = run_probe(
        family_dirs[family], ["rte", "stsb"], micro_data / "glue", features="last4-concat",
        pool="cls",
    )  # fmt: skip
    rte, stsb = results["tasks"]["rte"], results["tasks"]["stsb"]
    assert (rte["n_train"], rte["n_dev"], stsb["n_train"], stsb["n_dev"]) == (24, 16, 24, 16)
    assert 0 <= rte["metrics"]["validation"]["accuracy"] <= 1
    assert rte["score"] == rte["metrics"]["validation"]["accuracy"]
    assert rte["majority_score"] == 10 / 16  # a 12/12 tie in train goes to label 0: 10 in dev
    assert rte["majority_label"] == 0
    dev = read_glue_split(GLUE_TASKS["rte"], "validation", micro_data / "glue")
    written = rte["dev_predictions"]["validation"]
    assert written["references"] == list(dev["label"])
    accuracy = accuracy_score(written["references"], written["predictions"])
    assert accuracy == rte["score"]
    written = stsb["dev_predictions"]["validation"]
    correlations = [pearsonr(written["predictions"], written["references"])[0],
                    spearmanr(written["predictions"], written["references"])[0]]  # fmt: skip
    assert np.mean(correlations) == pytest.approx(stsb["score"], abs=1e-12)
    for name in ("pearson", "spearmanr"):
        assert -1 <= stsb["metrics"]["validation"][name] <= 1
    assert math.isfinite(stsb["score"]) and stsb["majority_score"] is None
    assert set(rte["regularization"]) == {"C"} and set(stsb["regularization"]) == {"alpha"}
    average = (rte["score"] + stsb["score"]) / 2
    assert results["glue_average"] == {"score": average, "tasks": ["rte", "stsb"]}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("pool", ["cls", "mean"])
@pytest.mark.parametrize("features", ["last4-concat", "last4-sum"])
def test_vectors_are_the_fine_tuning_heads_features(family, pool, features, family_dirs):
    """The probe pools what the family's classification head pools (heads.sentence_features)."""
    model, tokenizer = load_model(family_dirs[family], "cpu")
    probed = sentence_vectors(model, tokenizer, TEXTS, features, pool, batch_size=2)
    head = (
        HEADS[family]
        .from_pretrained(
            family_dirs[family], num_labels=2, classifier_features=features, classifier_pool=pool
        )
        .eval()
    )
    for vector, text in zip(probed, TEXTS, strict=True):
        inputs = tokenizer(*([text] if isinstance(text, str) else text), return_tensors="pt")
        with torch.no_grad():
            outputs = head.base_model(**inputs, output_hidden_states=True)
            expected = head.sentence_features(outputs, inputs["attention_mask"])[0]
        torch.testing.assert_close(torch.from_numpy(vector), expected, atol=1e-5, rtol=1e-4)


def test_a_sentence_longer_than_the_model_is_cut_without_embed_s_warning(family_dirs):
    """The probe cuts a long sentence to the model's length, as fine-tuning does; embed's
    warning about it advises --stride, which the probe does not have."""
    model, tokenizer = load_model(family_dirs["bert"], "cpu")
    long_text = " ".join(["the river valley and its villages"] * 100)  # beyond the positions
    with pytest.warns(TruncatedInputsWarning, match="1 of 2 inputs were longer"):
        embed(model, [long_text, "short"], layers=(-1,), tokenizer=tokenizer)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        vectors = sentence_vectors(model, tokenizer, [long_text, "short"], "last", "mean", 2)
    assert vectors.shape[0] == 2
    assert [str(warning.message) for warning in caught] == []


def test_all_mean_averages_every_layer_and_last_takes_the_top(family_dirs):
    model, tokenizer = load_model(family_dirs["bert"], "cpu")
    inputs = tokenizer(TEXTS[0], return_tensors="pt")
    with torch.no_grad():
        states = model(**inputs, output_hidden_states=True).hidden_states  # 5 entries
    all_mean = sentence_vectors(model, tokenizer, TEXTS[:1], "all-mean", "mean", 4)[0]
    last = sentence_vectors(model, tokenizer, TEXTS[:1], "last", "cls", 4)[0]
    torch.testing.assert_close(torch.from_numpy(all_mean), torch.stack(states).mean((0, 2))[0])
    torch.testing.assert_close(torch.from_numpy(last), states[-1][0, 0])


def test_a_pair_is_senteval_features_of_its_sentences_encoded_apart(family_dirs):
    model, tokenizer = load_model(family_dirs["bert"], "cpu")
    pairs = {"sentence1": [TEXTS[0], TEXTS[1]], "sentence2": [TEXTS[1], TEXTS[0]]}
    vectors = task_vectors(get_task("stsb"), pairs, model, tokenizer, "last", "mean", 2)
    u = sentence_vectors(model, tokenizer, pairs["sentence1"], "last", "mean", 2)
    v = sentence_vectors(model, tokenizer, pairs["sentence2"], "last", "mean", 2)
    np.testing.assert_allclose(vectors, np.concatenate([u, v, np.abs(u - v), u * v], axis=1))
    # swapped sentences: the same |u - v| and u * v
    size = u.shape[1]
    np.testing.assert_allclose(vectors[0, 2 * size :], vectors[1, 2 * size :], rtol=1e-6)


def test_the_layers_each_feature_takes():
    """last4 is the top four entries of hidden_states, top first, or all of a model with fewer
    (two layers and the embeddings: three); all-mean is every entry, embeddings first."""
    assert feature_layers("last", 6) == ([-1], "none")
    assert feature_layers("last4-concat", 6) == ([-1, -2, -3, -4], "concat")
    assert feature_layers("last4-sum", 2) == ([-1, -2, -3], "sum")
    assert feature_layers("last4-concat", 3) == ([-1, -2, -3, -4], "concat")
    assert feature_layers("all-mean", 2) == ([0, 1, 2], "mean")


def test_pool_cls_of_a_model_type_of_no_family_is_refused_naming_the_known_ones():
    config = EgbertBertConfig()
    config.model_type = "t5"
    with pytest.raises(ConfigError) as error:
        summary_pools(config)
    assert str(error.value) == (
        "--pool cls: egbert knows no summary position for model_type 't5' (it knows "
        "egbert-bert, bert, egbert-gpt, gpt2, egbert-elmo); use --pool mean"
    )


def test_the_vectors_come_from_the_tokenizer_given(family_dirs, wikitext_slice, tmp_path):
    """A tokenizer other than the one saved with the model (a 500-piece vocabulary): the
    vectors, of single sentences and of pairs, are the model's states of its token ids."""
    model, _ = load_model(family_dirs["bert"], "cpu")
    train_tokenizer([wikitext_slice], kind="wordpiece", vocab_size=500, out_dir=tmp_path)
    smaller = AutoTokenizer.from_pretrained(tmp_path)
    expected = []
    for text in TEXTS[:2]:
        with torch.no_grad():
            states = model(**smaller(text, return_tensors="pt"), output_hidden_states=True)
        expected.append(states.hidden_states[-1][0].mean(0))
    vectors = sentence_vectors(model, smaller, TEXTS[:2], "last", "mean", 2)
    torch.testing.assert_close(torch.from_numpy(vectors), torch.stack(expected))
    pair = {"sentence1": [TEXTS[0]], "sentence2": [TEXTS[1]]}
    pair_vector = task_vectors(get_task("stsb"), pair, model, smaller, "last", "mean", 2)[0]
    torch.testing.assert_close(torch.from_numpy(pair_vector[:64]), torch.cat(expected))


def test_too_few_examples_of_a_label_are_refused_with_the_counts_and_two_suffice():
    task, vectors = get_task("sst2"), np.random.default_rng(0).normal(size=(6, 3))
    with pytest.raises(DataError) as error:
        choose_c(task, vectors[:4], np.array([0, 1, 1, 1]), seed=0)
    assert str(error.value) == (
        "sst2: the probe needs two training examples of every label; the 4 drawn hold "
        "{'negative': 1, 'positive': 3}; raise --max-train-samples"
    )
    assert choose_c(task, vectors, np.array([0, 0, 1, 1, 1, 1]), seed=0) in C_GRID


def held_out_choice(vectors: np.ndarray, labels: np.ndarray, seed: int) -> float:
    """The C the docstring promises, by scikit-learn: of 1e-4 ... 100, the first with the best
    accuracy on a stratified fifth held out with the seed, fitted by Newton-CG on the rest."""
    fit_x, held_x, fit_y, held_y = train_test_split(
        vectors, labels, test_size=len(labels) // 5, stratify=labels, random_state=seed
    )
    grid, accuracies = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0), []
    for c in grid:
        probe = make_pipeline(StandardScaler(), LogisticRegression(C=c, solver="newton-cg"))
        accuracies.append(accuracy_score(held_y, probe.fit(fit_x, fit_y).predict(held_x)))
    return grid[int(np.argmax(accuracies))]


def test_c_is_chosen_by_accuracy_on_a_stratified_fifth_held_out_with_the_seed():
    """60 noisy examples, two thirds of them positive: which C wins depends on the held-out
    fifth, and the probe's choice is scikit-learn's for the same split, seed by seed; the probe
    is then refit with it on every example."""
    rng = np.random.default_rng(3)
    labels = np.array([0] * 20 + [1] * 40)
    vectors = rng.normal(size=(60, 12))
    vectors[:, 0] += 1.2 * labels
    choices = {seed: held_out_choice(vectors, labels, seed) for seed in range(6)}
    assert len(set(choices.values())) > 2, choices  # the split matters here
    task = get_task("sst2")
    assert {seed: choose_c(task, vectors, labels, seed) for seed in choices} == choices
    for seed in (1, 4):
        probe, regularization = fit_probe(task, vectors, labels, seed)
        assert regularization == {"C": choices[seed]}
        refit = LogisticRegression(C=choices[seed], solver="newton-cg")
        refit = make_pipeline(StandardScaler(), refit).fit(vectors, labels)
        np.testing.assert_allclose(probe.predict_proba(vectors), refit.predict_proba(vectors))


def write_sst2_like(folder: Path, labelled_by_word: bool, seed: int) -> Path:
    """A GLUE folder with an SST-2 of filler sentences; the label is either said by one word
    ("excellent" or "terrible") in the sentence or drawn independently of it."""
    rng = random.Random(seed)
    for split, count in (("train", 200), ("dev", 150)):
        lines = ["sentence\tlabel"]
        for _ in range(count):
            label = rng.randrange(2)
            word_label = label if labelled_by_word else rng.randrange(2)
            words = rng.choices(FILLER, k=8)
            words.insert(rng.randrange(9), ("terrible", "excellent")[word_label])
            lines.append(f"{' '.join(words)}\t{label}")
        (folder / "SST-2").mkdir(parents=True, exist_ok=True)
        (folder / "SST-2" / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


@pytest.mark.parametrize("family", FAMILIES)
def test_the_probe_finds_a_label_in_the_text_and_nothing_in_noise(family, family_dirs, tmp_path):
    signal = write_sst2_like(tmp_path / "signal", labelled_by_word=True, seed=0)
    noise = write_sst2_like(tmp_path / "noise", labelled_by_word=False, seed=0)
    found = run_probe(family_dirs[family], "sst2", signal, features="last4-concat")
    chance = run_probe(family_dirs[family], "sst2", noise, features="last4-concat")
    assert found["tasks"]["sst2"]["score"] > 0.9
    assert abs(chance["tasks"]["sst2"]["score"] - 0.5) < 0.13  # 150 dev examples: sd 0.04


def test_run_probe_s_defaults_probe_every_task_in_the_folder_with_the_last_layer_s_mean(
    family_dirs, tmp_path
):
    """The defaults the docstring gives (features last, pool mean, at most 4,000 training
    examples, seed 0, fp16 off); "all" finds the folder's one task; seconds is the task's wall
    time, to the hundredth."""
    folder = write_sst2_like(tmp_path / "glue", labelled_by_word=True, seed=0)
    start = time.perf_counter()
    results = run_probe(family_dirs["gpt"], "all", folder)
    elapsed = time.perf_counter() - start
    assert results["model"] == str(family_dirs["gpt"])
    options = {name: value for name, value in results["options"].items() if name != "bf16"}
    assert options == {
        "features": "last",
        "pool": "mean",
        "max_train_samples": 4000,
        "seed": 0,
        "classifier": "logistic regression (C by held-out GLUE score) / ridge (alpha by LOO)",
        "fp16": False,
    }
    assert list(results["tasks"]) == ["sst2"]
    sst2 = results["tasks"]["sst2"]
    assert (sst2["n_train"], sst2["n_dev"], sst2["feature_size"]) == (200, 150, 32)
    assert isinstance(sst2["seconds"], float) and 0 < sst2["seconds"] <= elapsed
    assert sst2["seconds"] == round(sst2["seconds"], 2)


def test_the_seed_draws_the_training_sample_and_the_held_out_fifth(family_dirs, tmp_path):
    """Labels drawn apart from the text: the C each seed's run reports is scikit-learn's choice
    on that seed's draw of 100 of the 200 training sentences (their mean vectors) and its
    held-out fifth, and the dev predictions are those of that C refit on the 100."""
    folder = write_sst2_like(tmp_path / "glue", labelled_by_word=False, seed=1)
    model, tokenizer = load_model(family_dirs["bert"], "cpu")
    train, dev = (
        read_glue_split(get_task("sst2"), split, folder) for split in ("train", "validation")
    )
    dev_vectors = sentence_vectors(model, tokenizer, dev["sentence"], "last", "mean", 64)
    reported, expected = {}, {}
    for seed in range(3):
        rows = np.sort(np.random.default_rng(seed).choice(200, size=100, replace=False))
        sentences = [train["sentence"][row] for row in rows]
        vectors = sentence_vectors(model, tokenizer, sentences, "last", "mean", 64)
        labels = np.asarray(train["label"])[rows]
        c = held_out_choice(vectors, labels, seed)
        refit = make_pipeline(StandardScaler(), LogisticRegression(C=c, solver="newton-cg"))
        expected[seed] = c, refit.fit(vectors, labels).predict(dev_vectors).tolist()
        result = run_probe(
            family_dirs["bert"], "sst2", folder, max_train_samples=100, seed=seed, bf16=False
        )["tasks"]["sst2"]
        (predicted,) = result["dev_predictions"].values()
        reported[seed] = result["regularization"]["C"], predicted["predictions"]
    assert len({c for c, _ in expected.values()}) > 1, expected
    assert reported == expected


def test_mnli_is_scored_on_both_dev_sets(family_dirs, tmp_path):
    """MNLI's matched (12 rows) and mismatched (10) dev sets: each scored, its predictions
    written; the score is the mean of the two accuracies, the majority's over all 22 rows."""
    folder = tmp_path / "glue" / "MNLI"
    folder.mkdir(parents=True)
    rng = random.Random(0)
    labels = ("entailment", "neutral", "contradiction")
    for name, count in (("train.tsv", 30), ("dev_matched.tsv", 12), ("dev_mismatched.tsv", 10)):
        rows = ["sentence1\tsentence2\tgold_label"]
        for row in range(count):
            words = " ".join(rng.choice(FILLER) for _ in range(6))
            rows.append(f"{words}\tthe {rng.choice(FILLER)}\t{labels[row % 3]}")
        (folder / name).write_text("\n".join(rows) + "\n", encoding="utf-8")
    mnli = run_probe(family_dirs["bert"], "mnli", tmp_path / "glue")["tasks"]["mnli"]
    predicted = mnli["dev_predictions"]
    assert list(predicted) == ["validation_matched", "validation_mismatched"]
    assert [len(split["references"]) for split in predicted.values()] == [12, 10]
    assert mnli["n_dev"] == 22
    accuracies = [accuracy_score(s["references"], s["predictions"]) for s in predicted.values()]
    assert mnli["score"] == pytest.approx(sum(accuracies) / 2)
    # a three-way tie in train goes to entailment: 4 of the 12 and 4 of the 10
    assert mnli["majority_label"] == 0 and mnli["majority_score"] == pytest.approx(8 / 22)


def test_a_pickle_only_model_is_refused_unless_allowed(family_dirs, tmp_path):
    """run_probe's allow_pickle defaults to False (the CLI's --allow-pickle: test_allow_pickle)."""
    pickled = shutil.copytree(family_dirs["gpt"], tmp_path / "pickled")
    torch.save(load_file(pickled / "model.safetensors"), pickled / "pytorch_model.bin")
    (pickled / "model.safetensors").unlink()
    folder = write_sst2_like(tmp_path / "glue", labelled_by_word=True, seed=0)
    with pytest.raises(CheckpointError, match="holds a pickle checkpoint"):
        run_probe(pickled, "sst2", folder)
    allowed = run_probe(pickled, "sst2", folder, allow_pickle=True)
    assert allowed["tasks"]["sst2"]["n_train"] == 200


def test_a_model_of_no_family_is_probed_by_its_mean_and_refused_cls_before_any_work(
    tiny_tokenizer_dir, tmp_path
):
    """A stock RoBERTa: the mean over its tokens needs no family; --pool cls is refused before
    the data is read (a broken train file would otherwise be the error)."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    config = RobertaConfig(
        vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=130, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    RobertaModel(config).save_pretrained(tmp_path / "roberta")
    tokenizer.save_pretrained(tmp_path / "roberta")
    folder = write_sst2_like(tmp_path / "glue", labelled_by_word=True, seed=0)
    mean = run_probe(tmp_path / "roberta", "sst2", folder, max_train_samples=40)
    assert mean["tasks"]["sst2"]["feature_size"] == 16
    (folder / "SST-2" / "train.tsv").write_text("not\ta GLUE file\n")
    with pytest.raises(ConfigError, match="no summary position for model_type 'roberta'"):
        run_probe(tmp_path / "roberta", "sst2", folder, pool="cls")


def test_the_logistic_probe_converges_where_the_features_nearly_separate_the_labels():
    """The grid's weakest penalty on features that nearly separate random labels (400 examples,
    300 columns of decaying scale, 50 of them copies, as elmo's layer 0 is [e; e]): the probe's
    fit converges in a few dozen iterations, without a ConvergenceWarning (lbfgs took 415)."""
    rng = np.random.default_rng(0)
    base = rng.standard_normal((400, 300)) * np.geomspace(1, 1e-2, 300)
    vectors = base @ rng.standard_normal((300, 250))
    vectors = np.concatenate([vectors, vectors[:, :50]], axis=1)
    labels = rng.integers(0, 2, 400)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        fitted = logistic_probe(max(C_GRID)).fit(vectors, labels)
    assert fitted[-1].n_iter_.max() <= 50, fitted[-1].n_iter_
    assert (fitted.predict(vectors) == labels).mean() > 0.95  # nearly separated, as said


def test_of_equally_good_penalties_the_probe_takes_the_strongest():
    """Labels that one column separates by a wide margin: every C of the grid scores the
    held-out fifth perfectly, and the tie goes to the smallest C, the strongest penalty."""
    rng = np.random.default_rng(0)
    labels = np.tile([0, 1], 100)
    vectors = rng.normal(size=(200, 8))
    vectors[:, 0] = 10.0 * (2 * labels - 1)
    probe, regularization = fit_probe(get_task("sst2"), vectors, labels, seed=0)
    assert regularization == {"C": min(C_GRID)}
    assert (probe.predict(vectors) == labels).all()


def test_ridge_follows_a_linear_score_and_not_noise():
    """STS-B's probe is a ridge regression: it recovers a linear score and finds none in noise."""
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(600, 24))
    score = vectors @ rng.normal(size=24)
    task = get_task("stsb")
    for labels, low, high in (
        (score + rng.normal(size=600), 0.9, 1.0),
        (rng.normal(size=600), -0.15, 0.15),
    ):
        probe, regularization = fit_probe(task, vectors[:400], labels[:400], seed=0)
        metrics = compute_task_metrics(task, probe.predict(vectors[400:]), labels[400:])
        assert low < metrics["pearson"] < high, (metrics, regularization)


def test_cli_prints_a_table_and_writes_the_results_on_sst2(family_dirs, data_dir, tmp_path, capsys):
    argv = ["probe", "--model", str(family_dirs["gpt"]), "--task", "sst2", "--data-dir"]
    argv += [str(data_dir / "glue"), "--max-train-samples", "200", "--output-dir", str(tmp_path)]
    cli_main([*argv, "--pool", "cls", "--features", "all-mean"])
    out = capsys.readouterr().out
    results = json.loads((tmp_path / "probe_results.json").read_text())
    sst2 = results["tasks"]["sst2"]
    assert (sst2["n_train"], sst2["n_dev"]) == (200, 872)
    assert 0 <= sst2["score"] <= 1 and sst2["feature_size"] == 32
    assert results["options"]["features"] == "all-mean" and results["options"]["pool"] == "cls"
    assert f"| sst2 | acc {100 * sst2['score']:.2f} |" in out


def test_the_table_has_a_row_per_task_and_the_average():
    """Each column from its field (percentages to the hundredth, seconds to the tenth, a
    regression's majority left empty), and the average of the two scores: (56.25 + 30) / 2."""
    rte = {"metrics": {"validation": {"accuracy": 0.5625}}, "score": 0.5625}
    rte |= {"majority_score": 0.625, "n_train": 24, "regularization": {"C": 0.01}, "seconds": 1.234}
    stsb = {"metrics": {"validation": {"pearson": 0.31, "spearmanr": 0.29}}, "score": 0.30}
    stsb |= {"majority_score": None, "n_train": 3000, "regularization": {"alpha": 1000.0}}
    stsb |= {"seconds": 12.06}
    assert probe_table({"tasks": {"rte": rte, "stsb": stsb}}).splitlines() == [
        "| task | dev metrics | score | majority | train examples | regularization | seconds |",
        "|---|---|---:|---:|---:|---|---:|",
        "| rte | acc 56.25 | 56.25 | 62.50 | 24 | C 0.01 | 1.2 |",
        "| stsb | pearson 31.00 / spearman 29.00 | 30.00 |  | 3000 | alpha 1e+03 | 12.1 |",
        "| average (rte, stsb) | | 43.12 | | | | |",
    ]


# `egbert probe --help` at 100 columns, as a user reads it: every option, its default and the
# words around them (a change here is a change of the command's documentation)
PROBE_HELP = (
    "usage: egbert probe [options]\n"
    "\n"
    "Probe a frozen model: pool one vector per example from chosen layers, fit a "
    "logistic regression (ridge for STS-B) on the training split's vectors, and score it "
    "on dev with GLUE's metric. Nothing of the model is trained.\n"
    "\n"
    "options:\n"
    + CONFIG_OPTIONS_HELP
    + (
        "  --model DIR           the model directory, with its tokenizer\n"
        "  --task TASK [TASK ...]\n"
        "                        GLUE task(s) (cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, "
        "wnli), or all:\n"
        "                        those with train and dev files in --data-dir\n"
        "  --data-dir DIR        the GLUE folder (DIR/SST-2/train.tsv, ...)\n"
        "  --features {last,last4-concat,last4-sum,all-mean}\n"
        "                        last layer; last four concatenated or summed; all layers "
        "averaged\n"
        "                        (default: last)\n"
        "  --pool {cls,mean}     mean over real tokens, or cls: the family's summary "
        "position (BERT's\n"
        "                        [CLS], GPT's last token, ELMo's two sentence ends) "
        "(default: mean)\n"
        "  --max-train-samples MAX_TRAIN_SAMPLES\n"
        "                        fit on a seeded random draw of this many training examples "
        "(default: 4000)\n"
        "  --batch-size BATCH_SIZE\n"
        "                        examples per forward (default: 64)\n"
        "  --seed SEED           random seed (default: 0)\n"
        "  --output-dir OUTPUT_DIR\n"
        "                        write probe_results.json here (default: print only)\n"
    )
    + RUN_OPTIONS_HELP
    + (
        "\n"
        "The probe's regularization is chosen per task: logistic regression's C from "
        "0.0001..100 by the task's GLUE score on a held-out fifth of the training vectors, "
        "ridge's alpha from 0.01..100000 by leave-one-out error; features are standardized. "
        "The table gives each task's dev metrics, its score, the majority-label score it has "
        "to beat and the chosen regularization. Example: egbert probe --model runs/bert-mini "
        "--task sst2 stsb --data-dir data/glue --features last4-concat --output-dir "
        "runs/bert-mini/probe\n"
    )
)


def test_the_help_says_what_the_command_does(monkeypatch, capsys):
    assert help_text("probe", monkeypatch, capsys) == PROBE_HELP


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--task", "nope"], "unknown task 'nope'"),
        (["--task", "qnli"], "qnli train file not found"),
        (["--task", "ax"], "ax has no training data"),
        (["--task", "rte", "--features", "last5"], "argument --features: invalid choice"),
        (["--task", "rte", "--max-train-samples", "0"], "--max-train-samples must be at least 1"),
        (["--task", "rte", "--max-train-samples", "3"], "the probe needs two training examples"),
    ],
)
def test_bad_input_ends_in_one_line(args, expected, family_dirs, data_dir, tmp_path, capsys):
    argv = ["probe", "--model", str(family_dirs["bert"]), "--data-dir", str(data_dir / "glue")]
    message = error_line([*argv, *args, "--output-dir", str(tmp_path / "out")], capsys)
    assert message.startswith("egbert probe: error: ") and expected in message, message
    assert "\n" not in message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        (
            {"features": "last5"},
            "--features 'last5' is not one of last, last4-concat, last4-sum, all-mean",
        ),
        ({"pool": "first"}, "--pool 'first' is not one of cls, mean"),
        ({"max_train_samples": 0}, "--max-train-samples must be at least 1, got 0"),
        ({"batch_size": -2}, "--batch-size must be at least 1, got -2"),
    ],
)
def test_run_probe_refuses_a_bad_option_in_the_cli_s_words(option, expected, family_dirs, data_dir):
    with pytest.raises(ConfigError) as error:
        run_probe(family_dirs["bert"], "rte", data_dir / "glue", **option)
    assert str(error.value) == expected


def test_an_output_dir_inside_a_file_is_refused_before_any_work(family_dirs, tmp_path):
    (tmp_path / "notes").write_text("a file\n")
    with pytest.raises(ConfigError) as error:
        run_probe(family_dirs["bert"], "rte", tmp_path / "no-glue", output_dir=tmp_path / "notes/p")
    assert str(error.value) == (
        f"--output-dir {tmp_path}/notes/p: {tmp_path}/notes is a file, not a folder; choose "
        "another --output-dir"
    )


def test_a_missing_data_dir_or_model_is_one_line(family_dirs, data_dir, tmp_path, capsys):
    missing = tmp_path / "missing"
    for model, data in ((family_dirs["bert"], missing), (missing, data_dir / "glue")):
        argv = ["probe", "--model", str(model), "--task", "rte", "--data-dir", str(data)]
        message = error_line(argv, capsys)
        assert message.startswith("egbert probe: error: "), message
        assert "no such folder" in message or "model directory" in message, message


# ---------------------------------------------------------------- the command's options


def tsv_rows(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))


def stsb_features(model_dir: Path, rows: list[dict[str, str]]) -> np.ndarray:
    """SentEval's [u, v, |u - v|, u * v] of each pair, u and v the sum of the last four hidden
    states at [CLS], each sentence run alone: --features last4-sum --pool cls, by hand."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir).eval()

    def vector(text: str) -> np.ndarray:
        with torch.no_grad():
            states = model(**tokenizer(text, return_tensors="pt"), output_hidden_states=True)
        return sum(layer[0, 0] for layer in states.hidden_states[-4:]).numpy()

    u = np.stack([vector(row["sentence1"]) for row in rows])
    v = np.stack([vector(row["sentence2"]) for row in rows])
    return np.concatenate([u, v, np.abs(u - v), u * v], axis=1)


@proves(
    "probe", "--model", "--task", "--data-dir", "--features", "--pool", "--max-train-samples",
    "--seed", "--batch-size", "--output-dir",
)  # fmt: skip
def test_the_options_give_scikit_learns_ridge_fit_of_the_vectors_they_name(
    family_dirs, micro_data, tmp_path
):
    """STS-B's probe is a ridge regression on standardized features with alpha chosen by
    leave-one-out error from 0.01..1e5 (the command's help): scikit-learn's RidgeCV on the
    features computed here, fitted on 20 training rows drawn with numpy's generator seeded 3,
    gives scipy's correlations on dev that the command reports."""
    glue, out = micro_data / "glue", tmp_path / "probe"
    argv = ["probe", "--model", str(family_dirs["bert"]), "--task", "stsb", "--data-dir", str(glue)]
    argv += ["--features", "last4-sum", "--pool", "cls", "--max-train-samples", "20"]
    with model_calls() as calls:
        cli_main([*argv, "--seed", "3", "--batch-size", "5", "--no-bf16", "--output-dir", str(out)])
    stsb = json.loads((out / "probe_results.json").read_text())["tasks"]["stsb"]
    train, dev = (tsv_rows(glue / "STS-B" / f"{name}.tsv") for name in ("train", "dev"))
    features = stsb_features(family_dirs["bert"], train + dev)
    dev_x, dev_y = features[len(train) :], [float(row["score"]) for row in dev]
    found = {}
    for seed in (3, 0):  # 0: the default, which a seed ignored would draw with
        drawn = np.sort(np.random.default_rng(seed).choice(len(train), size=20, replace=False))
        ridge = make_pipeline(StandardScaler(), RidgeCV(alphas=np.logspace(-2, 5, 8)))
        ridge.fit(features[drawn], [float(train[i]["score"]) for i in drawn])
        found[seed] = ridge.predict(dev_x)
    metrics = stsb["metrics"]["validation"]
    assert stsb["n_train"] == 20 and stsb["n_dev"] == len(dev)
    assert metrics["pearson"] == pytest.approx(pearsonr(found[3], dev_y)[0], abs=1e-4)
    assert metrics["spearmanr"] == pytest.approx(spearmanr(found[3], dev_y)[0], abs=1e-4)
    assert abs(pearsonr(found[0], dev_y)[0] - pearsonr(found[3], dev_y)[0]) > 1e-3
    assert max(call.batch_size for call in calls) == 5  # 20 + 16 sentences per column


@proves("probe", "--device", "--bf16", "--fp16")
def test_the_model_runs_on_the_device_and_precision_given(family_dirs, micro_data):
    """bf16 or fp16 autocast on or off as asked, and on the device named: moved to the meta
    device, the model's weights are where autocast refuses to go (only the model's own device
    is asked)."""
    argv = ["probe", "--model", str(family_dirs["gpt"]), "--task", "rte", "--data-dir"]
    argv += [str(micro_data / "glue"), "--features", "last"]
    assert_bf16_and_device_are_the_options(argv)
