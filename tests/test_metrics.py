"""GLUE metrics equal scikit-learn/scipy on fixed inputs; task scores and the GLUE score."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from egbert.errors import ConfigError
from egbert.finetune.metrics import (
    GlueAverage,
    compute_task_metrics,
    format_metrics,
    glue_average,
    glue_score,
    task_score,
)

RNG = np.random.default_rng(0)
GOLD = RNG.integers(0, 2, size=200)
# Predictions that agree with the gold labels about 75% of the time.
PRED = np.where(RNG.random(200) < 0.75, GOLD, 1 - GOLD)
GOLD3 = RNG.integers(0, 3, size=200)
PRED3 = np.where(RNG.random(200) < 0.6, GOLD3, RNG.integers(0, 3, size=200))
SCORES = RNG.uniform(0, 5, size=100)
PREDICTED_SCORES = SCORES + RNG.normal(0, 1.0, size=100)


def test_cola_is_matthews_correlation() -> None:
    result = compute_task_metrics("cola", PRED.tolist(), GOLD.tolist())
    assert result == {"matthews_correlation": pytest.approx(matthews_corrcoef(GOLD, PRED))}


@pytest.mark.parametrize("task", ["mrpc", "qqp"])
def test_paraphrase_tasks_are_accuracy_and_f1(task: str) -> None:
    result = compute_task_metrics(task, PRED.tolist(), GOLD.tolist())
    assert result == {
        "accuracy": pytest.approx(accuracy_score(GOLD, PRED)),
        "f1": pytest.approx(f1_score(GOLD, PRED)),
    }


def test_stsb_is_pearson_and_spearman() -> None:
    result = compute_task_metrics("stsb", PREDICTED_SCORES.tolist(), SCORES.tolist())
    assert result["pearson"] == pytest.approx(pearsonr(PREDICTED_SCORES, SCORES)[0], abs=1e-6)
    assert result["spearmanr"] == pytest.approx(spearmanr(PREDICTED_SCORES, SCORES)[0], abs=1e-6)


def test_a_constant_prediction_correlates_zero_not_nan() -> None:
    """scipy returns nan for a constant input; a model that predicts one score gets 0."""
    result = compute_task_metrics("stsb", [2.5] * len(SCORES), SCORES)
    assert result == {"pearson": 0.0, "spearmanr": 0.0}


@pytest.mark.parametrize("task", ["sst2", "mnli", "qnli", "rte", "wnli", "ax"])
def test_other_tasks_are_accuracy(task: str) -> None:
    result = compute_task_metrics(task, PRED3.tolist(), GOLD3.tolist())
    assert result == {"accuracy": pytest.approx(accuracy_score(GOLD3, PRED3))}


def test_numpy_inputs_work_too() -> None:
    result = compute_task_metrics("mrpc", PRED, GOLD)
    assert result["f1"] == pytest.approx(f1_score(GOLD, PRED))


def test_task_score_averages_metrics_then_dev_sets() -> None:
    assert task_score({"validation": {"accuracy": 0.8, "f1": 0.9}}) == pytest.approx(0.85)
    mnli = {"validation_matched": {"accuracy": 0.84}, "validation_mismatched": {"accuracy": 0.83}}
    assert task_score(mnli) == pytest.approx(0.835)


def test_glue_score_reproduces_bert_base_on_the_leaderboard() -> None:
    # BERT-base's GLUE test results (Devlin et al. 2019) and its leaderboard score 78.3.
    rows = {
        "cola": {"test": {"mcc": 52.1}},
        "sst2": {"test": {"accuracy": 93.5}},
        "mrpc": {"test": {"f1": 88.9, "accuracy": 84.8}},
        "stsb": {"test": {"pearson": 87.1, "spearmanr": 85.8}},
        "qqp": {"test": {"f1": 71.2, "accuracy": 89.2}},
        "mnli": {"matched": {"accuracy": 84.6}, "mismatched": {"accuracy": 83.4}},
        "qnli": {"test": {"accuracy": 90.5}},
        "rte": {"test": {"accuracy": 66.4}},
        "wnli": {"test": {"accuracy": 65.1}},
    }
    score = glue_score({task: task_score(metrics) for task, metrics in rows.items()})
    assert round(score, 1) == 78.3


def test_glue_score_rejects_the_diagnostic_set() -> None:
    with pytest.raises(ConfigError, match="not GLUE-scored tasks: \\['ax'\\]"):
        glue_score({"rte": 0.6, "ax": 0.3})


def test_glue_average_skips_custom_and_left_out_tasks_and_names_the_rest() -> None:
    average = glue_average({"rte": 0.6, "my-task": 0.9, "stsb": 0.2, "wnli": 0.5}, ["wnli"])
    assert average == GlueAverage(pytest.approx(0.4), ("rte", "stsb"))
    assert glue_average({"my-task": 0.9}) is None


def test_format_metrics_shortens_names_and_tags_other_dev_sets() -> None:
    assert format_metrics({"validation": {"accuracy": 0.8, "f1": 0.85}}) == "acc 80.00 / f1 85.00"
    mnli = {"validation_matched": {"accuracy": 0.841}, "validation_mismatched": {"accuracy": 0.834}}
    assert format_metrics(mnli) == "matched acc 84.10; mismatched acc 83.40"


def test_unequal_lengths_and_nothing_to_score_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"^3 predictions for 2 references$"):
        compute_task_metrics("rte", [0, 1, 0], [0, 1])
    with pytest.raises(ValueError, match="^no metrics to score$"):
        task_score({})
    with pytest.raises(ValueError, match="^no task scores to average$"):
        glue_score({})
