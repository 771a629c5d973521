"""Paired bootstrap intervals: the metrics on each draw against sklearn's and scipy's, the
interval against scipy.stats.bootstrap and against hand-counted cases."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from option_coverage import proves
from scipy.stats import bootstrap, pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from egbert.cli import main as cli_main
from egbert.errors import DataError
from egbert.finetune.significance import (
    Difference,
    compare,
    compare_runs,
    constant_predictions,
    drawn_scores,
    summary_line,
)

RNG = np.random.default_rng(7)


def sklearn_score(metric: str, references, predictions) -> float:
    if metric == "accuracy":
        return accuracy_score(references, predictions)
    if metric == "accuracy_f1":
        return (accuracy_score(references, predictions) + f1_score(references, predictions)) / 2
    if metric == "matthews_correlation":
        return matthews_corrcoef(references, predictions)
    return (pearsonr(predictions, references)[0] + spearmanr(predictions, references)[0]) / 2


@pytest.mark.parametrize(
    "metric, classes",
    [("accuracy", 3), ("accuracy_f1", 2), ("matthews_correlation", 2), ("matthews_correlation", 3),
     ("pearson_spearman", None)],
)  # fmt: skip
def test_each_draw_is_scored_as_sklearn_and_scipy_score_it(metric, classes):
    if classes is None:  # scores with ties, as STS-B's are
        references = RNG.integers(0, 11, 60) / 2
        predictions = np.round(references + RNG.normal(0, 1.5, 60), 1)
    else:
        references = RNG.integers(0, classes, 60)
        predictions = np.where(RNG.random(60) < 0.6, references, RNG.integers(0, classes, 60))
    draws = RNG.integers(0, 60, size=(5, 60))
    got = drawn_scores(metric, references[draws], predictions[draws])
    expected = [sklearn_score(metric, references[row], predictions[row]) for row in draws]
    np.testing.assert_allclose(got, expected, atol=1e-12)


def test_undefined_correlations_score_zero_as_the_glue_metric_does():
    references = np.array([[0, 1, 1, 0]])
    assert drawn_scores("matthews_correlation", references, np.zeros((1, 4), int))[0] == 0
    assert drawn_scores("pearson_spearman", references, np.ones((1, 4)))[0] == 0
    # no 1 predicted and none true: sklearn's F1 is 0, accuracy 1
    none = np.zeros((1, 4), int)
    assert drawn_scores("accuracy_f1", none, none)[0] == (1 + f1_score([0] * 4, [0] * 4)) / 2


def test_runs_scored_on_other_dev_examples_or_splits_are_refused():
    a = one_split([1, 0, 1], [1, 0, 1])
    with pytest.raises(DataError, match="rte validation: the runs were scored on different dev"):
        compare({"rte": a}, {"rte": one_split([1, 1, 0], [1, 1, 0])})
    matched = {"validation_matched": a["validation"]}
    with pytest.raises(DataError, match=r"rte: the runs were scored on different dev splits"):
        compare({"rte": a}, {"rte": {**a, **matched}})


def one_split(references, *seeds):
    return {"validation": (list(references), [list(seed) for seed in seeds])}


def test_the_interval_is_scipys_paired_percentile_bootstrap():
    references = RNG.integers(0, 2, 300)
    a = np.where(RNG.random(300) < 0.75, references, 1 - references)
    b = np.where(RNG.random(300) < 0.65, references, 1 - references)
    ours = compare({"rte": one_split(references, a)}, {"rte": one_split(references, b)},
                   samples=20000, seed=1)["rte"]  # fmt: skip
    scipys = bootstrap(
        ((a == references).astype(float), (b == references).astype(float)),
        lambda x, y, axis: x.mean(axis=axis) - y.mean(axis=axis),
        paired=True, n_resamples=20000, method="percentile", vectorized=True, random_state=3,
    ).confidence_interval  # fmt: skip
    expected = 100 * ((a == references).mean() - (b == references).mean())
    assert ours.points == pytest.approx(expected, abs=0.005)
    assert ours.low == pytest.approx(100 * scipys.low, abs=0.5)
    assert ours.high == pytest.approx(100 * scipys.high, abs=0.5)


def test_hand_counted_cases():
    """A right everywhere and B wrong everywhere: +100 on every draw. A right on the first of two
    examples, B on the second: a draw holds each example once (p=1/2, 0), the first twice (1/4,
    +100) or the second twice (1/4, -100): the 95% interval is [-100, +100], not real."""
    sure = compare(
        {"rte": one_split([1, 0, 1], [1, 0, 1])}, {"rte": one_split([1, 0, 1], [0, 1, 0])}
    )
    assert sure["rte"] == Difference(100.0, 100.0, 100.0) and sure["rte"].real
    even = compare({"rte": one_split([1, 1], [1, 0])}, {"rte": one_split([1, 1], [0, 1])},
                   samples=4000)["rte"]  # fmt: skip
    assert (even.points, even.low, even.high, even.real) == (0.0, -100.0, 100.0, False)


def test_seeds_pool_and_the_average_takes_each_draws_task_differences():
    """Two seeds of A (right on 2 and on 4 of 4 examples: 75 on average) against B's one seed
    (right on 1 of 4): +50; with a task that A and B score the same, the average is +25."""
    references = [1, 0, 1, 0]
    a = one_split(references, [1, 0, 0, 1], [1, 0, 1, 0])
    b = one_split(references, [0, 1, 1, 1])
    level = one_split(references, [1, 1, 1, 1])
    found = compare({"rte": a, "sst2": level}, {"rte": b, "sst2": level}, averaged=["rte", "sst2"])
    assert found["rte"].points == 50.0 and found["sst2"] == Difference(0.0, 0.0, 0.0)
    assert found["average"].points == 25.0
    assert found["average"].low == pytest.approx(found["rte"].low / 2)


def test_the_majority_class_is_a_run_that_answers_one_label():
    majority = constant_predictions(one_split([1, 0, 1]), 1)
    assert majority == {"validation": ([1, 0, 1], [[1, 1, 1]])}


def test_the_summary_line_counts_real_wins_and_losses():
    differences = {
        "rte": Difference(5.0, 1.0, 9.0),
        "sst2": Difference(2.0, -1.0, 5.0),
        "cola": Difference(-4.0, -7.0, -1.0),
        "average": Difference(1.0, 0.5, 1.5),
    }
    line = summary_line("bert", "its twin", differences)
    assert line == "bert beats its twin on 1 of 3 tasks, loses on 1; 1 within noise"


def rte_predictions(right: int, count: int = 40) -> dict:
    """rte dev predictions right on the first `right` of `count` examples (labels 1, 0, ...)."""
    references = [1 - i % 2 for i in range(count)]
    predictions = [label if i < right else 1 - label for i, label in enumerate(references)]
    return {"validation": {"references": references, "predictions": predictions}}


def results_folder(path: Path, name: str, report: dict) -> Path:
    path.mkdir()
    (path / name).write_text(json.dumps(report), encoding="utf-8")
    return path


def probe_folder(path: Path, right: int) -> Path:
    """A probe run's results folder, its rte predictions right on `right` of 40."""
    report = {"tasks": {"rte": {"score": right / 40, "dev_predictions": rte_predictions(right)}}}
    return results_folder(path, "probe_results.json", report)


def test_compare_reads_a_finetune_run_and_each_prompt_setting(tmp_path):
    """One task's finetune folder (its results at the top of eval_results.json) against a
    probe's; two prompt-eval folders: each k-shot row both hold; a finetune folder and a
    prompt-eval folder hold no row in common."""
    one_task = {"task": "rte", "score": 0.9, "dev_predictions": rte_predictions(36)}
    finetuned = results_folder(tmp_path / "ft", "eval_results.json", one_task)
    shots = {
        "0": {"dev_predictions": rte_predictions(20)},
        "4": {"dev_predictions": rte_predictions(30)},
    }
    prompted = results_folder(
        tmp_path / "pe", "prompt_eval_results.json", {"tasks": {"rte": {"shots": shots}}}
    )
    other = {"tasks": {"rte": {"shots": {"0": shots["4"]}}}}
    both = compare_runs(prompted, results_folder(tmp_path / "o", "prompt_eval_results.json", other))
    assert list(both) == ["rte, 0-shot"] and both["rte, 0-shot"].points == -25.0  # (20 - 30) / 40
    assert compare_runs(finetuned, probe_folder(tmp_path / "p", 20))["rte"].points == 40.0
    with pytest.raises(DataError, match="scored no task in common"):
        compare_runs(finetuned, prompted)


def test_compare_says_which_run_is_ahead_or_that_neither_is(tmp_path, capsys):
    a, b = probe_folder(tmp_path / "a", 36), probe_folder(tmp_path / "b", 20)
    cli_main(["compare", str(b), str(a)])
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| rte"))
    assert row.startswith("| rte | -40.0 |") and row.endswith("| B ahead |")
    cli_main(["compare", str(a), str(probe_folder(tmp_path / "c", 35))])  # 36 against 35 of 40
    out = capsys.readouterr().out
    assert "| within noise |" in out and "A beats B on 0 of 1 tasks; 1 within noise" in out


@proves("compare", "--samples", "--seed")
def test_compare_prints_each_tasks_difference_and_interval(tmp_path, capsys):
    a, b = probe_folder(tmp_path / "a", 36), probe_folder(tmp_path / "b", 20)
    cli_main(["compare", str(a), str(b), "--seed", "1"])
    first = capsys.readouterr().out
    assert "| rte | +40.0 |" in first and "| A ahead |" in first  # (36 - 20) / 40
    assert "A beats B on 1 of 1 tasks; 0 within noise" in first
    few = ["compare", str(a), str(b), "--samples", "20"]  # a coarse interval: seeds show
    outputs = []
    for seed in (1, 1, 2):
        cli_main([*few, "--seed", str(seed)])
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] != outputs[2]
    cli_main(["compare", str(a), str(b), "--samples", "1"])  # one draw: a point, not a span
    low, high = capsys.readouterr().out.split("| rte | +40.0 | [")[1].split("]")[0].split(", ")
    assert low == high


def test_compare_refuses_a_folder_without_dev_predictions_in_one_line(tmp_path, capsys):
    a = probe_folder(tmp_path / "a", 30)
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "probe_results.json").write_text('{"tasks": {"rte": {"score": 0.5}}}')
    for other, message in ((tmp_path / "old", "no per-example dev predictions"),
                           (tmp_path, "no eval_results.json")):  # fmt: skip
        with pytest.raises(SystemExit) as stop:
            cli_main(["compare", str(a), str(other)])
        assert message in str(stop.value) and "\n" not in str(stop.value)
