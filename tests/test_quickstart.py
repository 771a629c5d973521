"""`egbert quickstart` end to end with a micro budget on slices of the shared data."""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import pytest
from accelerate.state import AcceleratorState, GradientState

from egbert import quickstart
from egbert.errors import ConfigError, DataError
from egbert.quickstart import export_hub_corpus, main
from egbert.runtime import bf16_pays_off

MODELS = ["bert", "gpt", "elmo", "bert (no pretraining)"]
TASKS = ["rte", "stsb"]
MICRO = ["--budget-minutes", "0.2", "--vocab-size", "600", "--max-train-samples", "24"]
MICRO += ["--epochs", "1", "--tasks", *TASKS]


@pytest.fixture(scope="module")
def finished_run(micro_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("quickstart") / "run"
    # Accelerate's process-wide state may hold an earlier module's precision
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    main(["--data", str(micro_data), "--output-dir", str(out), *MICRO])
    return out


def test_the_table_has_a_number_for_every_model_and_task(finished_run: Path):
    report = json.loads((finished_run / "results.json").read_text())
    assert report["tasks"] == TASKS
    assert list(report["scores"]) == MODELS
    for scores in report["scores"].values():
        assert list(scores) == TASKS
        assert all(isinstance(v, float) and math.isfinite(v) for v in scores.values())

    table = (finished_run / "results.md").read_text().strip().splitlines()
    assert table[0].startswith("| model | rte (acc) | stsb (Pearson/Spearman) | average |")
    rows = table[2:]
    assert [row.split("|")[1].strip() for row in rows] == MODELS
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")[1:]]
        assert len(cells) == len(TASKS) + 1
        numbers = [float(cell) for cell in cells]
        assert numbers[-1] == pytest.approx(sum(numbers[:-1]) / len(TASKS), abs=0.06)
    assert (finished_run / "results.png").stat().st_size > 1000

    # One step count for all three families: the same number of training sequences.
    steps = {f: p["steps"] for f, p in report["pretraining"].items()}
    assert set(steps) == {"bert", "gpt", "elmo"}
    assert len(set(steps.values())) == 1 and report["plan"]["pretrain_steps"] == steps["bert"]
    # bf16 only where this machine runs it faster than fp32.
    assert report["plan"]["bf16"] == bf16_pays_off("cpu")
    assert "perplexity" in report["pretraining"]["elmo"]["eval"]
    assert "mlm_accuracy" in report["pretraining"]["bert"]["eval"]


def test_a_rerun_reuses_every_finished_step(
    finished_run: Path, micro_data: Path, capsys: pytest.CaptureFixture
):
    before = json.loads((finished_run / "results.json").read_text())
    weights = finished_run / "pretrain" / "bert" / "model" / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    capsys.readouterr()
    start = time.perf_counter()
    main(["--data", str(micro_data), "--output-dir", str(finished_run), *MICRO])
    assert time.perf_counter() - start < 30
    printed = capsys.readouterr().out
    assert "reusing" in printed and "training WordPiece" not in printed
    assert weights.stat().st_mtime_ns == stamp
    assert json.loads((finished_run / "results.json").read_text())["scores"] == before["scores"]


def test_other_options_on_the_same_output_dir_are_refused(finished_run: Path, micro_data: Path):
    changed = [arg if arg != "0.2" else "0.5" for arg in MICRO]
    with pytest.raises(ConfigError, match="budget_minutes 0.2 -> 0.5"):
        main(["--data", str(micro_data), "--output-dir", str(finished_run), *changed])


def test_missing_data_says_how_to_point_at_it(tmp_path: Path):
    with pytest.raises(DataError, match="point --data"):
        main(["--data", str(tmp_path), "--output-dir", str(tmp_path / "out")])


def test_from_hub_fails_fast_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(DataError, match="--from-hub"):
        main(["--from-hub", "--output-dir", str(tmp_path / "out")])
    assert time.perf_counter() - start < 5


def test_hub_corpus_export_writes_the_local_layout(tmp_path: Path):
    """The --from-hub corpus path, fed a local data set folder instead of the hub's wikitext."""
    source = tmp_path / "dataset"
    source.mkdir()
    (source / "train.txt").write_text(" = Title = \n\nFirst line .\nSecond line .\n")
    (source / "validation.txt").write_text(" = Other = \n\nA line .\n")
    target = export_hub_corpus(tmp_path / "data", name=str(source), config=None)
    folder = target / "corpus" / "wikitext-2"
    assert (folder / "wiki.train.tokens").read_text().splitlines() == [
        " = Title = ",
        "First line .",
        "Second line .",
    ]
    assert (folder / "wiki.valid.tokens").read_text().splitlines() == [" = Other = ", "A line ."]


def test_help_explains_the_options(capsys: pytest.CaptureFixture):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    assert "--budget-minutes" in capsys.readouterr().out


def test_the_plan_scales_with_the_measured_step_times(monkeypatch: pytest.MonkeyPatch):
    args = argparse.Namespace(
        preset="tiny", budget_minutes=30.0, vocab_size=600, max_train_samples=None, epochs=3, seed=0
    )

    def plan_with_steps_of(seconds: float) -> quickstart.Plan:
        monkeypatch.setattr(quickstart, "seconds_per_step", lambda *_args: seconds)
        return quickstart.make_plan(args, tokenizer=None, n_finetunes=6)

    reference = plan_with_steps_of(quickstart.REFERENCE_STEP_SECONDS / 3)
    slower = plan_with_steps_of(2 * quickstart.REFERENCE_STEP_SECONDS / 3)
    assert reference.finetune_samples == quickstart.SAMPLES_PER_30_MINUTES
    assert slower.finetune_samples == quickstart.SAMPLES_PER_30_MINUTES // 2
    assert abs(slower.pretrain_steps - reference.pretrain_steps / 2) <= 1
