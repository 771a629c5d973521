"""`egbert quickstart` end to end with a micro budget on slices of the shared data: stopped by
SIGTERM while it pretrains, then run again to the end."""

from __future__ import annotations

import json
import math
import re
import signal
import subprocess
import time
from dataclasses import asdict
from pathlib import Path

import pytest
import yaml
from conftest import fresh_accelerate
from option_coverage import proves
from safetensors.torch import load_file
from transformers import AutoTokenizer

import egbert
from egbert.commands.quickstart import main
from egbert.errors import ConfigError, DataError
from egbert.quickstart import budget as planning
from egbert.quickstart import options, report, run
from egbert.quickstart.budget import Budget, Plan
from egbert.quickstart.planner import FinetuneChoice, RunPlan
from egbert.quickstart.replay import replay_arguments
from egbert.quickstart.report import Row
from egbert.quickstart.steps import export_hub_corpus, finetune_options
from egbert.training.runtime import bf16_pays_off

FINETUNED = ["bert", "bert (no pretraining)", "gpt", "elmo"]
# each model beside its twin, which shares its probe's size
PROBED = [name for f in ("bert", "gpt", "elmo") for name in (f, f"{f} (no pretraining)")]
PROBED += ["majority class"]
TASKS = ["rte", "stsb"]
RECIPES = Path(egbert.__file__).parent / "configs" / "recipes"
MICRO = ["--budget-minutes", "0.5", "--vocab-size", "600", "--tasks", *TASKS, "--seed", "7"]
MICRO += ["--heads", "last4-sum-frozen"]  # not the default's cls: the head alone trains
# a preset file smaller than tiny, the same for every family (each takes the fields it knows)
PRESET = {"hidden_size": 48, "num_hidden_layers": 2, "num_attention_heads": 2}
PRESET |= {"intermediate_size": 96, "cell_size": 96, "max_position_embeddings": 128}


def table_rows(table: str) -> list[str]:
    return [row.split("|")[1].strip() for row in table.splitlines()[2:] if row.startswith("|")]


@pytest.fixture(scope="module")
def finished_run(micro_data: Path, tmp_path_factory, subprocess_env, warm_python) -> Path:
    """A run stopped by SIGTERM while bert pretrains (it must say so in one line and exit 0),
    then run again to the end; what the two printed is in OUTPUT (next to the run)."""
    out = tmp_path_factory.mktemp("quickstart") / "run"
    preset = out.parent / "preset.yaml"
    preset.write_text(yaml.safe_dump(PRESET), encoding="utf-8")
    MICRO.extend(["--preset", str(preset)])  # the other tests' runs share it
    argv = ["--data", str(micro_data), "--output-dir", str(out), *MICRO]
    command = [warm_python(subprocess_env), "-m", "egbert.cli", "quickstart", *argv]
    process = subprocess.Popen(
        command, env=subprocess_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    seen = []
    for line in process.stdout:  # the first family's training has begun: stop it
        seen.append(line)
        if line.startswith("egbert: training on"):
            process.send_signal(signal.SIGTERM)
            break
    output = "".join(seen) + process.communicate(timeout=120)[0]
    assert process.returncode == 0, output[-3000:]
    assert "Traceback" not in output
    assert output.rstrip().splitlines()[-1].startswith("egbert quickstart: stopped;"), output
    assert (out / "pretrain" / "bert" / "checkpoints").is_dir()
    assert not (out / "results.json").exists()
    rest = subprocess.run(
        command, env=subprocess_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert rest.returncode == 0, rest.stdout[-3000:]
    (out.parent / OUTPUT).write_text(output + rest.stdout, encoding="utf-8")
    return out


# A line of a Python warning ("...: UserWarning: ..."), of a logger's ("[transformers] ...",
# "WARNING:..."), or of scikit-learn's advice after its ConvergenceWarning
WARNING_LINE = re.compile(r"Warning\b|^WARNING|^\[transformers\]|max_iter|lbfgs|not sharded")
OUTPUT = "quickstart-output.txt"


def test_the_run_prints_no_warning_lines(finished_run: Path):
    output = (finished_run.parent / OUTPUT).read_text(encoding="utf-8")
    assert "probe: elmo-random" in output  # the whole run, the twins' probe included
    assert [line for line in output.splitlines() if WARNING_LINE.search(line)] == []


@pytest.mark.slow
@proves("quickstart", "--data", "--output-dir", "--tasks")
def test_every_table_has_a_number_for_every_model_and_task(finished_run: Path):
    report = json.loads((finished_run / "results.json").read_text())
    assert report["tasks"] == TASKS
    # the plan fine-tunes the first of these its time allows: bert and its twin at least
    planned = report["plan"]["run_plan"]["finetuning"]["models"]
    assert planned[:2] == ["bert", "bert"]
    assert list(report["scores"]) == FINETUNED[: len(planned)]
    for scores in (*report["scores"].values(), *report["probe"].values()):
        assert list(scores) == TASKS
        assert all(isinstance(v, float) and math.isfinite(v) for v in scores.values())
    assert list(report["probe"]) == PROBED[:-1]
    assert set(report["prompting"]) == {f"{m}, {k}-shot" for m in ("gpt", "gpt (no pretraining)")
                                        for k in options.PROMPT_SHOTS}  # fmt: skip
    assert list(report["evaluation_sizes"]["probe"]) == PROBED[:-1]
    assert set(report["evaluation_sizes"]["prompting"]) == {"gpt", "gpt (no pretraining)"}
    tables = report["tables"]
    assert table_rows(tables["fine-tuning"]) == FINETUNED[: len(planned)]
    assert table_rows(tables["probe"]) == PROBED
    assert (
        tables["fine-tuning"]
        .splitlines()[0]
        .startswith("| model | rte (acc) | stsb (Pearson/Spearman) | average |")
    )
    for row in tables["fine-tuning"].splitlines()[2:]:
        numbers = [float(cell) for cell in row.strip("|").split("|")[1:4]]
        assert numbers[-1] == pytest.approx(sum(numbers[:-1]) / len(TASKS), abs=0.06)
    markdown = (finished_run / "results.md").read_text()
    for name, table in tables.items():
        assert f"## {name}\n\n{table}" in markdown
    assert "Training examples per task (at most): bert 200, bert (no pretraining) 200" in markdown
    assert (finished_run / "results.png").stat().st_size > 1000
    # every family pretrained for its share of the budget; bf16 only where it pays off here
    assert set(report["pretraining"]) == {"bert", "gpt", "elmo"}
    assert all(summary["steps"] >= 1 for summary in report["pretraining"].values())
    assert "perplexity" in report["pretraining"]["elmo"]["eval"]
    assert "mlm_accuracy" in report["pretraining"]["bert"]["eval"]
    assert report["plan"]["bf16"] == bf16_pays_off("cpu")
    # quickstart's choices for bert, from its recipe file: pretraining (the twin is the same
    # model class at its initial weights)
    recipe = yaml.safe_load((RECIPES / "bert.yaml").read_text())
    pretrain_args = json.loads((finished_run / "pretrain/bert/pretrain_args.json").read_text())
    assert pretrain_args["pretrain"]["nsp"] == recipe["quickstart-pretrain"]["nsp"] is False
    twin = json.loads((finished_run / "pretrain/bert-random/model/config.json").read_text())
    assert twin["architectures"] == ["EgbertBertForMaskedLM"]
    assert set(report["margins_over_twin"]) == {
        "fine-tuning, bert", "probe, bert", "probe, gpt", "probe, elmo"
    }  # fmt: skip
    # every margin with its interval, its point the difference of the tables' averages (the
    # intervals are scored from the dev predictions the runs wrote, the tables from their scores)
    twin = report["intervals"]["twin"]
    assert set(twin) == set(report["margins_over_twin"]) | {
        f"prompting, gpt, {k}-shot" for k in options.PROMPT_SHOTS
    }
    for name, margin in report["margins_over_twin"].items():
        average = twin[name]["average"]
        assert average["points"] == pytest.approx(margin, abs=0.01)
        assert average["low"] <= average["points"] <= average["high"]
        assert average["real"] == (average["low"] > 0 or average["high"] < 0)
        assert list(twin[name]) == [*TASKS, "average"]
    assert len(report["summary"]) == len(twin)
    assert all(
        " beats its twin on " in line and "within noise" in line for line in report["summary"]
    )
    majority = report["intervals"]["majority_class"]
    assert set(majority) == set(PROBED[:-1]) | set(report["prompting"])
    for label, scores in report["probe"].items():  # stsb has no majority class
        assert majority[label]["rte"]["points"] == pytest.approx(
            100 * (scores["rte"] - report["probe_majority"]["rte"]), abs=0.01
        )
    assert "## pretrained against its twin" in markdown and "vs majority class" in markdown


@proves("quickstart", "--budget-minutes", "--vocab-size", "--seed", "--heads", "--preset")
def test_the_run_has_the_budget_vocabulary_seed_heads_and_size_asked(finished_run: Path):
    report = json.loads((finished_run / "results.json").read_text())
    planned = report["plan"]["run_plan"]["seconds"]
    # the evaluation's share of half a minute (too little for the rest: each pretraining run
    # takes its measured start-up cost beyond its share)
    assert planned["evaluation"] == pytest.approx(options.EVALUATION_SHARE * 30)
    assert len(AutoTokenizer.from_pretrained(finished_run / "tokenizer")) == 600
    pretrain = json.loads((finished_run / "pretrain/bert/pretrain_args.json").read_text())
    assert pretrain["training"]["seed"] == 7
    run = finished_run / "finetune/bert/last4-sum-frozen/rte-seed7"
    head = json.loads((run / "model/config.json").read_text())
    assert head["classifier_features"] == "last4-sum"
    # frozen: the encoder's weights are the pretrained bert's
    pretrained = load_file(finished_run / "pretrain/bert/model/model.safetensors")
    tuned = load_file(run / "model/model.safetensors")
    name = "bert.layers.0.attention.qkv.weight"
    assert tuned[name].equal(pretrained[name])
    for family in ("bert", "gpt", "elmo"):  # the preset file's size, pretrained and twin
        for model in (family, f"{family}-random"):
            config = json.loads((finished_run / f"pretrain/{model}/model/config.json").read_text())
            assert config["hidden_size"] == PRESET["hidden_size"], model
    # quickstart's summary-vector head for bert is its recipe's (the last four layers
    # mean-pooled); the other heads read what their names say
    bert_cls = finetune_options(finished_run / "pretrain/bert", "rte", "cls", 7, None, False)
    recipe = yaml.safe_load((RECIPES / "bert.yaml").read_text())["quickstart-finetune"]
    assert (
        (bert_cls["features"], bert_cls["pool"])
        == ("last4-concat", "mean")
        == (recipe["features"], recipe["pool"])
    )
    assert bert_cls["lr"] == recipe["lr"]


def test_a_rerun_reuses_every_finished_step(
    finished_run: Path, micro_data: Path, capsys: pytest.CaptureFixture
):
    before = json.loads((finished_run / "results.json").read_text())
    weights = finished_run / "pretrain" / "bert" / "model" / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    capsys.readouterr()
    main(["--data", str(micro_data), "--output-dir", str(finished_run), *MICRO])
    printed = capsys.readouterr().out
    assert "reusing" in printed and "training WordPiece" not in printed
    assert "reusing the plan" in printed and "measured" not in printed  # nor measured again
    assert "egbert: training on" not in printed  # nothing trained again
    assert weights.stat().st_mtime_ns == stamp
    after = json.loads((finished_run / "results.json").read_text())
    assert after["tables"] == before["tables"]


@pytest.mark.slow
@proves("quickstart", "--replay")
def test_a_replay_gives_the_scores_of_the_run_it_replays(finished_run: Path, tmp_path: Path):
    """The finished run (stopped by SIGTERM while bert pretrained, then run again) replayed in
    this process: the clock decides nothing, so every score is the run's own, bit for bit."""
    replay = tmp_path / "replay"
    fresh_accelerate()
    main(["--replay", str(finished_run), "--output-dir", str(replay)])
    original = json.loads((finished_run / "results.json").read_text())
    again = json.loads((replay / "results.json").read_text())
    for part in ("scores", "probe", "prompting", "evaluation_sizes", "margins_over_twin"):
        assert again[part] == original[part], part
    for family, summary in original["pretraining"].items():
        for name in ("steps", "tokens", "eval"):
            assert again["pretraining"][family][name] == summary[name], (family, name)
    assert sorted(p.relative_to(replay) for p in replay.rglob("eval_results.json")) == sorted(
        p.relative_to(finished_run) for p in finished_run.rglob("eval_results.json")
    )  # the same fine-tuning runs, every seed


def test_a_replay_is_refused_in_one_line_where_it_cannot_replay(finished_run: Path, tmp_path: Path):
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "plan.json").write_text((finished_run / "plan.json").read_text())
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("mine")
    refusals = {
        ("--replay", str(unfinished)): "the run is not finished (no results.json)",
        ("--replay", str(tmp_path)): "no plan.json there",
        ("--replay", str(finished_run), "--seed", "3"): "leave out --seed",
        ("--replay", str(finished_run)): "is not empty; a replay goes into a new, empty folder",
    }
    for argv, expected in refusals.items():
        with pytest.raises(ConfigError, match=re.escape(expected)) as error:
            main([*argv, "--output-dir", str(full)])
        assert "\n" not in str(error.value)
    assert [path.name for path in full.iterdir()] == ["notes.txt"]
    # a replay of the same run stopped before its end goes on in its folder, with that run's
    # options
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    plan = json.loads((finished_run / "plan.json").read_text())
    plan["options"] |= {"replay": str(finished_run), "output_dir": str(stopped)}
    (stopped / "plan.json").write_text(json.dumps(plan))
    args = options.QuickstartArguments(replay=str(finished_run), output_dir=str(stopped))
    assert asdict(replay_arguments(args)) == plan["options"]


def test_other_options_on_the_same_output_dir_are_refused(finished_run: Path, micro_data: Path):
    changed = [arg if arg != "0.5" else "0.7" for arg in MICRO]
    with pytest.raises(ConfigError, match="budget_minutes 0.5 -> 0.7"):
        main(["--data", str(micro_data), "--output-dir", str(finished_run), *changed])


def test_the_probe_and_the_prompts_start_smaller_below_ten_minutes():
    full = (options.probe_options(None)["max_train_samples"], options.PROMPT_EVAL_SAMPLES)

    def sizes(minutes: float) -> tuple[int, int]:
        return planning.planned_size("probe", minutes), planning.planned_size(
            "prompt-eval", minutes
        )

    assert sizes(30) == sizes(10) == full
    assert sizes(3) == (round(full[0] * 0.3), round(full[1] * 0.3))
    assert sizes(0.5) == (round(full[0] / 10), round(full[1] / 10))


def test_an_evaluation_shrinks_to_its_share_by_the_runs_measured():
    """The planning function alone: no measurement, the planned size; one, a line half fixed;
    two sizes, the least-squares line; too little time, the smallest size for the probe (every
    model gets its row) and None for the prompts (skipped)."""
    assert planning.evaluation_size("probe", 2000, 5.0, []) == 2000
    # one run: 10 s at 2000, taken as 5 s fixed + 5 s for 2000 examples
    assert planning.evaluation_size("probe", 2000, 7.5, [(2000, 10.0)]) == 1000
    assert planning.evaluation_size("probe", 2000, 60.0, [(2000, 10.0)]) == 2000  # never more
    # two sizes: 2 s fixed + 1 ms an example
    measured = [(2000, 4.0), (1000, 3.0)]
    assert planning.cost_line(measured) == pytest.approx((2.0, 0.001))
    assert planning.evaluation_size("probe", 2000, 2.5, measured) == 500
    assert planning.evaluation_size("probe", 2000, 2.1, measured) is None
    assert planning.evaluation_size("probe", 2000, 2.1, measured, required=True) == 200
    assert planning.evaluation_size("prompt-eval", 200, 0.0, []) is None


def test_a_slow_probe_keeps_the_evaluation_within_its_share(tmp_path: Path, monkeypatch):
    """quickstart's evaluation stage on a machine far slower than its planned sizes assume: the
    probe and the prompts (replaced by runs that take 50 ms + 0.3 ms an example, and 100 ms)
    must end within EVALUATION_SHARE of a 15-second budget, every model probed, the later pairs
    smaller, and plan.json holding the sizes (so a rerun keeps them)."""

    features = {}

    def slow_probe(model_dir, tasks, data_dir, *, max_train_samples, **options):
        features[Path(model_dir).name] = (options["features"], options["pool"])
        time.sleep(0.05 + 0.0003 * max_train_samples)
        return {"tasks": {task: {"score": 0.5} for task in tasks}}

    def prompts(model_dir, tasks, data_dir, **_):
        time.sleep(0.1)
        return {"tasks": {}}

    monkeypatch.setattr(run.probe, "run_probe", slow_probe)
    monkeypatch.setattr(run.prompting, "run_prompt_eval", prompts)
    models = {}
    for family in ("bert", "gpt", "elmo"):
        for row, name in ((Row(family), family), (Row(family).twin(), f"{family}-random")):
            models[row] = tmp_path / "pretrain" / name
    budget = Budget(Plan(options={}, bf16=False), tmp_path / "plan.json", minutes=0.25)
    args = options.QuickstartArguments(budget_minutes=10)  # full sizes planned
    start = time.perf_counter()
    probes, prompted, _ = run.evaluate_models(models, ["rte"], tmp_path, args, budget)
    seconds = time.perf_counter() - start
    assert seconds <= 1.2 * options.EVALUATION_SHARE * budget.total, seconds
    assert list(probes) == list(models)
    sizes = [probes[Row(family)].size for family in ("bert", "gpt", "elmo")]
    full = options.probe_options(None)["max_train_samples"]
    assert sizes[0] == full and sizes[1] < sizes[0] and sizes[2] < sizes[0]
    assert list(prompted) == [Row("gpt"), Row("gpt").twin()]  # their share kept for them
    assert all(probes[row.twin()].size == probes[row].size for row in probes if row.pretrained)
    # each family's models probed with the quickstart-probe section of its recipe file
    for family in ("bert", "gpt", "elmo"):
        probe_recipe = yaml.safe_load((RECIPES / "common.yaml").read_text())["quickstart-probe"]
        own = yaml.safe_load((RECIPES / f"{family}.yaml").read_text()).get("quickstart-probe")
        expected = {**probe_recipe, **(own or {})}
        for name in (family, f"{family}-random"):
            assert features[name] == (expected["features"], expected["pool"]), name
    assert features["elmo"] != features["bert"]  # elmo's recipe has its own
    saved = json.loads((tmp_path / "plan.json").read_text())
    assert saved["evaluation_sizes"]["probe/gpt"] == sizes[1]
    assert len(saved["evaluation_runs"]) == len(probes) + len(prompted)


def test_the_budget_allots_each_run_its_share_less_the_measured_costs(tmp_path: Path):
    budget = Budget(Plan(options={}, bf16=False), tmp_path / "plan.json", minutes=10)
    first = options.FIRST_OVERHEAD_SECONDS["finetune"]
    minutes = pytest.approx((60 - first) / 60, abs=1e-4)  # allotments keep 4 decimals
    assert budget.allot("finetune/rte", 60.0, "finetune") == minutes
    for wall, train in ((30.0, 20.0), (50.0, 20.0), (28.0, 20.0)):  # costs 10, 30 and 8 s
        budget.record("finetune", wall, train)
    assert budget.allot("finetune/stsb", 60.0, "finetune") == pytest.approx(50 / 60, abs=1e-4)
    assert budget.allot("finetune/rte", 600.0, "finetune") == minutes
    shortest = pytest.approx(options.MIN_TRAIN_SECONDS / 60, abs=1e-4)
    assert budget.allot("finetune/sst2", 1.0, "finetune") == shortest
    assert not (tmp_path / "plan.json").exists()  # planning writes nothing; saving is a step
    budget.save()
    saved = json.loads((tmp_path / "plan.json").read_text())
    assert saved["allotted_minutes"]["finetune/stsb"] == pytest.approx(50 / 60, abs=1e-4)
    assert 0 <= saved["spent_seconds"] < 60


def test_further_seeds_go_to_the_averaged_tasks_only(tmp_path: Path, monkeypatch):
    """With time for more seeds, bert and its twin run again on the averaged tasks; wnli, shown
    apart, keeps its one seed. (The fine-tuning runs are replaced: the schedule is under test.)"""
    planned = []

    def record_runs(passes, models, glue, args, budget, plan):
        scores = {}
        for task, runs in passes:
            for row, seed in runs:
                planned.append((task, row, seed))
                budget.plan.run_seconds[run.run_key(models[row], "cls", task, seed)] = 1.0
                scores.setdefault(row, {}).setdefault(task, {})[seed] = 0.5
        return scores

    monkeypatch.setattr(run, "run_finetune_pass", record_runs)
    budget = Budget(Plan(options={}, bf16=False), tmp_path / "plan.json", minutes=60)
    bert, twin, gpt = Row("bert"), Row("bert").twin(), Row("gpt")
    models = {bert: tmp_path / "bert", twin: tmp_path / "bert-random", gpt: tmp_path / "gpt"}
    args = options.QuickstartArguments(heads=["cls"])
    finetuning = FinetuneChoice(("bert", "bert", "gpt"), None, 60.0, "all of it")
    run.finetune_models(models, ["rte", "wnli"], None, args, budget, RunPlan({}, finetuning))
    further = {(task, row, seed) for task, row, seed in planned if seed != args.seed}
    assert further == {("rte", row, seed) for row in (bert, twin) for seed in (43, 44)}


def test_each_seed_is_averaged_over_the_tasks_every_seed_ran():
    runs = {"rte": {42: 0.5, 43: 0.7, 44: 0.6}, "stsb": {42: 0.1, 43: 0.3}, "wnli": {42: 0.56}}
    # wnli is not averaged; seed 44 did not run on stsb
    averages = report.seed_averages(runs, ["rte", "stsb", "wnli"])
    assert averages == pytest.approx([0.3, 0.5])


def test_rows_are_labelled_for_the_tables():
    assert Row("bert").label == "bert"
    assert Row("bert", pretrained=False, head="cls-frozen").label == (
        "bert (no pretraining), cls-frozen"
    )
    assert Row("gpt", shots=4).twin().label == "gpt (no pretraining), 4-shot"


def test_missing_data_says_how_to_point_at_it(tmp_path: Path):
    with pytest.raises(DataError, match="point --data"):
        main(["--data", str(tmp_path), "--output-dir", str(tmp_path / "out")])


@proves("quickstart", "--from-hub")
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
