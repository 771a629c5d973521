"""scripts/recipe_compare.py end to end with a micro budget, and its ablation candidates."""

from __future__ import annotations

import datetime
import importlib.util
import json
import math
import shutil
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import fresh_accelerate

import egbert
from egbert import ConfigError
from egbert.pretrain.run import build_model
from egbert.tokenizer import load_tokenizer

REPO = Path(__file__).resolve().parents[1]
# scripts/ is no package: load the script from its file (registered first: dataclasses need it)
_spec = importlib.util.spec_from_file_location(
    "recipe_compare", REPO / "scripts" / "recipe_compare.py"
)
recipe_compare = sys.modules["recipe_compare"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(recipe_compare)

ROWS = ["stock", "egbert", "scratch"]
TASKS = ["rte", "stsb"]
BUDGET = 0.05  # minutes a pretraining run: a few steps
MICRO = ["--preset", "tiny", "--budget-minutes", str(BUDGET), "--vocab-size", "600"]
MICRO += ["--max-train-samples", "24", "--tasks", *TASKS]


@pytest.fixture(scope="module")
def finished_run(micro_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("recipe-compare") / "run"
    run_micro(micro_data, out)
    return out


def run_micro(micro_data: Path, out: Path, *extra: str) -> None:
    """One thread here and in the stock recipe's process: the machine is shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    # Accelerate's process-wide state must not carry another module's precision in or ours out.
    fresh_accelerate()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("OMP_NUM_THREADS", "1")
            argv = ["--data", str(micro_data), "--output-dir", str(out), *MICRO, *extra]
            recipe_compare.main(argv)
    finally:
        torch.set_num_threads(threads)
        fresh_accelerate()


@pytest.mark.slow
def test_the_table_has_a_finite_number_for_every_model_and_task(finished_run: Path):
    report = json.loads((finished_run / "results.json").read_text())
    assert report["tasks"] == TASKS
    assert list(report["scores"]) == ROWS
    table = (finished_run / "results.md").read_text().strip().splitlines()
    assert table[0] == "| model | rte (acc) | stsb (Pearson/Spearman) | average |"
    rows = table[2:]
    assert [row.split("|")[1].strip() for row in rows] == ROWS
    for row in rows:
        numbers = [float(cell) for cell in row.strip("|").split("|")[1:]]
        assert len(numbers) == len(TASKS) + 1 and all(map(math.isfinite, numbers))
        assert numbers[-1] == pytest.approx(sum(numbers[:-1]) / len(TASKS), abs=0.06)

    # Both recipes trained within the budget, logged a loss curve and were stamped with the day
    # they ran, so a later rerun can tell old runs from new ones.
    today = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    for label in ("stock", "egbert"):
        summary = report["pretraining"][label]
        assert summary["steps"] >= 1 and summary["minutes"] <= BUDGET + 0.05
        assert math.isfinite(summary["final_loss"])
        assert summary["finished_utc"].startswith(today)
    nsp = recipe_compare.recipe_arguments("tiny")[2].nsp
    assert report["pretraining"]["egbert"]["loss"] == ("MLM + NSP" if nsp else "MLM")
    # egbert's model config fields hold while pretraining (the recipe: heads that start on their
    # neighbours, no dropout); fine-tuning gets BERT's dropout back.
    pretrained = json.loads(
        (finished_run / "pretrain" / "egbert" / "model" / "config.json").read_text()
    )
    recipe_model = {
        field: recipe_compare.recipe_value(candidate, "tiny")
        for candidate in recipe_compare.CANDIDATES.values()
        if candidate.in_model_config
        for field in candidate.fields
    }
    assert recipe_model.items() <= pretrained.items()
    assert pretrained["local_attention_init"] and pretrained["hidden_dropout_prob"] == 0.0
    for row in ROWS:
        finetuned = json.loads(
            (finished_run / "finetune" / row / "rte" / "model" / "config.json").read_text()
        )
        assert finetuned["hidden_dropout_prob"] == finetuned["attention_probs_dropout_prob"] == 0.1
    assert (finished_run / "loss_curves.png").stat().st_size > 1000
    stock = finished_run / "pretrain" / "stock"
    config = json.loads((stock / "model" / "config.json").read_text())
    assert config["architectures"] == ["BertForMaskedLM"]
    # Both recipes and the fine-tuning use bf16 only where it is faster than fp32 here.
    bf16 = recipe_compare.use_bf16()
    assert json.loads((stock / "recipe.json").read_text())["bf16"] == bf16
    assert report["egbert_recipe"]["bf16"] == bf16
    assert [recipe["bf16"] for recipe in report["family_recipe"].values()] == [bf16, bf16]


def test_a_rerun_reuses_every_finished_step(
    finished_run: Path, micro_data: Path, capsys: pytest.CaptureFixture
):
    before = json.loads((finished_run / "results.json").read_text())
    weights = [finished_run / "pretrain" / row / "model" / "model.safetensors" for row in ROWS]
    stamps = [path.stat().st_mtime_ns for path in weights]
    capsys.readouterr()
    start = time.perf_counter()
    recipe_compare.main(["--data", str(micro_data), "--output-dir", str(finished_run), *MICRO])
    assert time.perf_counter() - start < 20
    printed = capsys.readouterr().out
    assert printed.count("reusing") == 1 + len(ROWS) + len(ROWS) * len(TASKS)
    assert [path.stat().st_mtime_ns for path in weights] == stamps
    assert json.loads((finished_run / "results.json").read_text())["scores"] == before["scores"]


def test_more_finetuning_seeds_keep_the_first_seeds_runs_and_report_the_mean(
    finished_run: Path, micro_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    first = [out / "finetune" / row / "rte" / "eval_results.json" for row in ROWS]
    stamps = [path.stat().st_mtime_ns for path in first]
    capsys.readouterr()
    run_micro(micro_data, out, "--tasks", "rte", "--finetune-seeds", "42", "7")
    assert capsys.readouterr().out.count("reusing") == 1 + len(ROWS) + len(ROWS)
    assert [path.stat().st_mtime_ns for path in first] == stamps

    report = json.loads((out / "results.json").read_text())
    assert report["finetune_seeds"] == [42, 7]
    for row, kept_results in zip(ROWS, first, strict=True):
        seed7_results = out / "finetune" / row / "rte-seed7" / "eval_results.json"
        second = json.loads(seed7_results.read_text())
        assert second["options"]["seed"] == 7
        kept = json.loads(kept_results.read_text())["score"]
        assert report["seed_scores"][row]["rte"] == [kept, second["score"]]
        assert report["scores"][row]["rte"] == pytest.approx((kept + second["score"]) / 2)
    seed_rows = (out / "results.md").read_text().split("\n\n")[1].splitlines()
    assert seed_rows[0] == "| model | seed 42 | seed 7 | mean | range |"
    for row, line in zip(ROWS, seed_rows[2:], strict=True):
        cells = [float(cell) for cell in line.strip("|").split("|")[1:]]
        assert cells[2] == pytest.approx(100 * report["averages"][row], abs=0.06)
        assert cells[3] == pytest.approx(abs(cells[0] - cells[1]), abs=0.11)


@pytest.mark.slow
def test_families_join_a_finished_folder_next_to_their_twins(finished_run: Path, micro_data: Path):
    before = json.loads((finished_run / "results.json").read_text())["scores"]
    egbert_weights = finished_run / "pretrain" / "egbert" / "model" / "model.safetensors"
    stamp = egbert_weights.stat().st_mtime_ns
    run_micro(micro_data, finished_run, "--families", "elmo")  # gpt's join is the same code

    report = json.loads((finished_run / "results.json").read_text())
    assert list(report["scores"]) == [*ROWS, "elmo", "elmo, scratch"]
    assert {row: report["scores"][row] for row in ROWS} == before
    assert egbert_weights.stat().st_mtime_ns == stamp
    table_rows = (finished_run / "results.md").read_text().splitlines()[2:]
    assert [row.split("|")[1].strip() for row in table_rows] == list(report["scores"])
    family, model_type = "elmo", "egbert-elmo"
    summary = report["pretraining"][family]
    assert summary["steps"] >= 1 and summary["minutes"] <= BUDGET + 0.05
    assert summary["loss"] == recipe_compare.LOSS_NAMES[family]
    assert math.isfinite(summary["final_loss"])
    pretrained, twin = (finished_run / "pretrain" / name for name in (family, f"{family}-scratch"))
    for model_dir in (pretrained, twin):
        config = json.loads((model_dir / "model" / "config.json").read_text())
        assert config["model_type"] == model_type
    assert (pretrained / "model" / "model.safetensors").read_bytes() != (
        twin / "model" / "model.safetensors"
    ).read_bytes()
    # Each family's run used its recipe's block length, its family defaults included.
    pretrain_args = json.loads((pretrained / "pretrain_args.json").read_text())["pretrain"]
    recipe = recipe_compare.recipe_arguments("tiny", family=family)[1]
    assert pretrain_args["seq_len"] == recipe.seq_len
    # The same fine-tuning as bert's: dropout 0.1 on whichever dropout the family has.
    finetuned = json.loads(
        (finished_run / "finetune" / family / "rte" / "model" / "config.json").read_text()
    )
    assert finetuned["hidden_dropout_prob"] == 0.1
    assert finetuned.get("attention_probs_dropout_prob", 0.1) == 0.1
    # elmo's classifier reads ELMo's layer mix over the tokens, each layer normalized, at
    # lr 1e-3 (its twin's too)
    head, lr = ("scalar-mix", "mean", True), 1e-3
    for name in (family, f"{family}-scratch"):
        run_dir = finished_run / "finetune" / name / "rte"
        config = json.loads((run_dir / "model" / "config.json").read_text())
        fields = ("classifier_features", "classifier_pool", "classifier_layer_norm")
        assert tuple(config.get(field, False) for field in fields) == head
        assert json.loads((run_dir / "eval_results.json").read_text())["options"]["lr"] == lr

    # gpt's fine-tuning (the options recipe_compare.finetune passes) reads cls at bert's lr
    gpt = finished_run.parent / "gpt-config"
    (gpt / "model").mkdir(parents=True)
    (gpt / "model" / "config.json").write_text(json.dumps({"model_type": "egbert-gpt"}))
    options = egbert.finetune_options(gpt, "rte", recipe_compare.HEAD, 42, None, False)
    assert (options["features"], options.get("pool", "cls"), options["lr"]) == ("cls", "cls", 1e-4)

    # A fine-tuning made with another head is not reused as elmo's, and is left as it was.
    bert_rte = finished_run / "finetune" / "egbert" / "rte"
    results = (bert_rte / "eval_results.json").read_bytes()
    with pytest.raises(ConfigError, match="fine-tuned with"):
        recipe_compare.finetune(
            finished_run / "pretrain" / "elmo", "rte", bert_rte, micro_data / "glue", 24
        )
    assert (bert_rte / "eval_results.json").read_bytes() == results


def test_a_folder_made_with_another_family_recipe_is_refused_and_kept(tmp_path: Path):
    """Folders written before elmo's blocks changed recorded 128-token blocks for elmo."""
    recipes = {family: recipe_compare.recipe_record(family) for family in ("gpt", "elmo")}
    options = {"preset": "mini", "family_recipe": recipes}
    recipe_compare.check_options(tmp_path, options)
    saved = tmp_path / "options.json"
    older = {
        "preset": "mini",
        "family_recipe": recipes | {"elmo": {**recipes["elmo"], "seq_len": 128}},
    }
    saved.write_text(json.dumps(older))
    with pytest.raises(ConfigError, match="holds runs made with other options"):
        recipe_compare.check_options(tmp_path, options)
    assert json.loads(saved.read_text()) == older


@pytest.mark.parametrize("name", list(recipe_compare.CANDIDATES))
def test_each_ablation_flips_one_choice_of_the_recipe(name: str, tiny_tokenizer_dir: Path):
    candidate = recipe_compare.CANDIDATES[name]
    ablation = recipe_compare.plan_ablation(name, "tiny")
    assert ablation["setting"] != ablation["recipe"]
    assert ablation["label"] == f"egbert, {ablation['setting']}"

    recipe = recipe_compare.recipe_arguments("tiny")
    flipped = recipe_compare.recipe_arguments("tiny", ablation["options"])
    if candidate.in_model_config:
        tokenizer = load_tokenizer(tiny_tokenizer_dir)
        configs = [build_model(args[0], args[2], tokenizer)[0].config for args in (recipe, flipped)]
        values = [[getattr(c, field) for field in candidate.fields] for c in configs]
    else:
        values = [
            [
                getattr(next(part for part in parts if hasattr(part, field)), field)
                for field in candidate.fields
            ]
            for parts in (recipe, flipped)
        ]
    assert values[1] != values[0] and len(set(values[1])) == 1
    assert candidate.label(values[1][0]) == ablation["setting"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ablate", "nsp", "warp-drive"], "--ablate warp-drive: unknown candidate"),
        (["--budget-minutes", "0"], "--budget-minutes must be > 0"),
        (["--finetune-seeds", "42", "42"], "name each seed once"),
        (["--time-to-loss", "gpt", "--ablate", "nsp"], "leave out --ablate and --families"),
        (["--data", "{tmp}"], "wiki.train.tokens: not found; point --data"),
        (["--data", "{data}", "--tasks", "rte", "nosuch"], "unknown task 'nosuch'"),
    ],
)
def test_bad_input_is_one_line_on_stderr(
    argv: list[str],
    message: str,
    micro_data: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
):
    argv = [arg.replace("{tmp}", str(tmp_path)).replace("{data}", str(micro_data)) for arg in argv]
    with pytest.raises(SystemExit) as exit_info:
        recipe_compare.main([*argv, "--output-dir", str(tmp_path / "out")])
    assert exit_info.value.code == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and message in error, error


def test_the_pretraining_table_says_when_budget_runs_come_from_different_days():
    def summary(finished: str | None) -> dict:
        return {"steps": 10, "minutes": 25.0, "loss": "MLM", "final_loss": 6.0,
                "finished_utc": finished, "commit": "abc1234" if finished else None}  # fmt: skip

    one_day = {"stock": summary("2026-11-23 10:00"), "egbert": summary("2026-11-23 11:00")}
    table = recipe_compare.pretraining_table(one_day)
    assert "| stock | 10 | 25.0 | 6.000 (MLM) | 2026-11-23 10:00, abc1234 |" in table
    assert "one sitting" not in table
    for other in (summary("2026-11-22 23:00"), summary(None)):
        table = recipe_compare.pretraining_table(one_day | {"egbert": other})
        assert "did not all finish on one day" in table


# ---------------------------------------------------------------- --time-to-loss


@pytest.mark.slow
def test_time_to_loss_validates_each_run_at_minute_marks_and_tabulates_them(
    micro_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Each family's recipe twice, each --flip option it has alone, the --combine options it
    has together; every run validated on WikiText-2 valid at minute marks (here every 0.3 s)."""
    monkeypatch.setattr(recipe_compare, "EVAL_EVERY_MINUTES", 0.005)
    monkeypatch.setattr(recipe_compare, "VALIDATION_SAMPLES", 12)
    out = tmp_path / "run"
    argv = ["--time-to-loss", "gpt", "elmo", "--flip", "muon", "--combine", "muon", "qk-norm"]
    run_micro(micro_data, out, *argv, "--budget-minutes", "0.04")  # a slow CPU's step takes 1 s
    folder = out / "time-to-loss"
    report = json.loads((folder / "results.json").read_text())
    runs = report["runs"]
    gpt_runs = ["gpt", "gpt, seed 43", "gpt, muon", "gpt, muon + qk-norm"]
    # elmo has no qk-norm: its combination is "elmo, muon", already run
    assert list(runs) == [*gpt_runs, "elmo", "elmo, seed 43", "elmo, muon"]

    def saved(name: str, file: str) -> dict:
        return json.loads((folder / name / file).read_text())

    for name, qk_norm, optim, seed in [
        ("gpt", False, "adamw", 42),
        ("gpt-seed43", False, "adamw", 43),
        ("gpt-muon", False, "muon", 42),
        ("gpt-muon+qk-norm", True, "muon", 42),
    ]:
        assert saved(name, "model/config.json")["qk_norm"] is qk_norm
        parts = saved(name, "pretrain_args.json")
        options = parts["pretrain"] | parts["training"]
        assert (options["optim"], options["seed"]) == (optim, seed)
        assert options["validation_files"] == [str(micro_data / recipe_compare.WIKITEXT_VALID)]
        assert (options["max_eval_samples"], options["eval_every_minutes"]) == (12, 0.005)
    assert saved("elmo-muon", "pretrain_args.json")["training"]["optim"] == "muon"

    lines = (folder / "results.md").read_text().splitlines()
    for family, labels in (("gpt", gpt_runs), ("elmo", list(runs)[4:])):
        target = (runs[family]["final_loss"] + runs[f"{family}, seed 43"]["final_loss"]) / 2
        header = next(line for line in lines if line.startswith(f"| {family} run |"))
        assert f"| minutes to {target:.3f} |" in header
        for label in labels:
            summary = runs[label]
            curve = summary["curve"]
            minutes = [point[0] for point in curve]
            assert len(curve) >= 2 and minutes == sorted(minutes)
            assert curve[-1][1] == summary["final_loss"] and math.isfinite(summary["final_loss"])
            row = next(line for line in lines if line.startswith(f"| {label} |")).split("|")
            assert float(row[4]) == pytest.approx(summary["final_loss"], abs=5e-4)
            assert float(row[5]) == pytest.approx(summary["final_loss"] - target, abs=5e-4)
            reached = recipe_compare.minutes_to_reach(curve, target)
            assert row[6].strip() == ("not reached" if reached is None else f"{reached:.1f}")
    assert (folder / "loss_curves.png").stat().st_size > 1000


FALLING = [(1.0, 5.0), (2.0, 4.0), (3.0, 3.5)]
BUMPY = [(1.0, 5.0), (2.0, 4.4), (3.0, 4.6), (4.0, 3.5)]


@pytest.mark.parametrize(
    ("curve", "target", "minutes"),
    [
        (FALLING, 4.5, 1.5),
        (FALLING, 3.75, 2.5),
        (FALLING, 5.5, 1.0),  # there at the first evaluation
        (FALLING, 3.0, None),
        (BUMPY, 4.45, 1 + 0.55 / 0.6),  # the first crossing, not the later one
    ],
)
def test_minutes_to_reach_interpolate_where_the_curve_first_gets_there(curve, target, minutes):
    reached = recipe_compare.minutes_to_reach(curve, target)
    assert reached == (None if minutes is None else pytest.approx(minutes))


def test_the_time_to_loss_table_measures_each_run_against_the_recipes_seeds():
    def summary(curve, changes=None, steps=100):
        return {"family": "gpt", "changes": changes or {}, "steps": steps,
                "tokens_per_second": 1234.4, "curve": curve,
                "final_loss": curve[-1][1]}  # fmt: skip

    summaries = {
        "gpt": summary([(1.0, 5.0), (3.0, 4.0)]),
        "gpt, seed 43": summary([(1.0, 5.1), (3.0, 4.2)]),
        "gpt, muon": summary([(1.0, 5.0), (2.0, 4.3), (3.0, 3.9)], {"optim": "muon"}, 1500),
        "gpt, rotary": summary([(1.0, 5.0), (3.0, 4.3)], {"config_overrides": "x=1"}),
    }
    table = recipe_compare.time_to_loss_table(summaries, "gpt", 3.0).splitlines()
    assert table[0] == (
        "| gpt run | steps | tokens/s | validation loss at 3 min | vs recipe | minutes to 4.100 "
        "| speed-up |"
    )
    # the target 4.1 is reached at 2 + (4.3 - 4.1) / (4.3 - 3.9) = 2.5 minutes: 3 / 2.5 = 1.2x
    assert table[4] == "| gpt, muon | 1,500 | 1,234 | 3.900 | -0.200 | 2.5 | 1.20x |"
    assert table[5] == "| gpt, rotary | 100 | 1,234 | 4.300 | +0.200 | not reached |  |"
    assert "The recipe's seeds differ by 0.200 at 3 minutes" in table[-1]


@pytest.mark.parametrize(
    ("name", "family"),
    [
        (name, family)
        for name, option in recipe_compare.TIMED_OPTIONS.items()
        for family in option.families
    ],
)
def test_each_timed_option_turns_its_fields_on_over_the_family_recipe(
    name: str, family: str, tiny_tokenizer_dir: Path
):
    option = recipe_compare.TIMED_OPTIONS[name]
    changes = recipe_compare.timed_changes([name], family, "tiny")
    recipe = recipe_compare.recipe_arguments("tiny", family=family)
    flipped = recipe_compare.recipe_arguments("tiny", changes, family=family)
    for field, value in option.options.items():
        assert getattr(flipped[3], field) == value != getattr(recipe[3], field)
    tokenizer = load_tokenizer(tiny_tokenizer_dir)
    configs = [build_model(args[0], args[2], tokenizer)[0].config for args in (recipe, flipped)]
    fields = option.config | (option.bert_config if family == "bert" else {})
    for field, value in fields.items():
        assert getattr(configs[1], field) == value != getattr(configs[0], field)
    # nothing else of the recipe's model changes
    before, after = (config.to_dict() for config in configs)
    assert {f: v for f, v in after.items() if f not in fields} == {
        f: v for f, v in before.items() if f not in fields
    }
