"""`egbert prompt-eval`: k-shot prompting of a tiny egbert gpt (random weights, GPT-2's tokenizer)
and of the real tiny GPT-2 checkpoint, as it is and converted with `egbert convert`, on the first
rows of the shared GLUE files. Scores are checked against the model's own logits."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from model_calls import assert_bf16_and_device_are_the_options, model_calls
from option_coverage import CONFIG_OPTIONS_HELP, RUN_OPTIONS_HELP, help_text, proves
from sklearn.metrics import accuracy_score
from transformers import AutoModelForCausalLM, AutoTokenizer

from egbert.arguments import parse_args
from egbert.cli import main as cli_main
from egbert.errors import CheckpointError, ConfigError, DataError
from egbert.evaluation import run_prompt_eval
from egbert.evaluation.prompting import (
    PROMPTS,
    EncodedPrompts,
    PromptEvalArguments,
    PromptFormat,
    calibrated_scores,
    check_prompt_options,
    draw_demonstrations,
    encode,
    encode_prompts,
    encode_verbalisers,
    fitted_context,
    joined,
    label_log_likelihoods,
    load_causal_model,
    prompt_table,
    scored_and_demonstrations,
    shot_scores,
)
from egbert.finetune.tasks import get_task
from egbert.models.bert import EgbertBertConfig, EgbertBertModel
from egbert.models.convert import convert_checkpoint
from egbert.models.gpt import EgbertGPTConfig, EgbertGPTForCausalLM

# (task folder, file, rows kept after the header; CoLA's files have no header)
ROWS = [
    ("SST-2", "train.tsv", 40), ("SST-2", "dev.tsv", 24), ("CoLA", "train.tsv", 40),
    ("CoLA", "dev.tsv", 24), ("MRPC", "train.tsv", 40), ("MRPC", "dev.tsv", 24),
    ("RTE", "train.tsv", 24), ("RTE", "dev.tsv", 16), ("QNLI", "dev.tsv", 30),
]  # fmt: skip
SENTENCES = [
    {"sentence": "a gripping, funny and moving film"},
    {"sentence": "dull"},
    {"sentence": "the plot goes nowhere and the actors seem to know it"},
]

pytestmark = pytest.mark.usefixtures("one_thread_and_fresh_accelerate")


@pytest.fixture(scope="module")
def glue_dir(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first rows of the five prompt tasks' files (QNLI: dev only, as in the shared data)."""
    root = tmp_path_factory.mktemp("prompt-glue")
    for folder, name, rows in ROWS:
        (root / folder).mkdir(exist_ok=True)
        header = 0 if folder == "CoLA" else 1
        with (data_dir / "glue" / folder / name).open(encoding="utf-8") as handle:
            lines = [next(handle) for _ in range(rows + header)]
        (root / folder / name).write_text("".join(lines), encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def gpt_dir(tiny_gpt2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny egbert gpt (random weights) saved with GPT-2's byte-level BPE tokenizer."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_gpt2_dir)
    config = EgbertGPTConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=512,
    )  # fmt: skip
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("prompt-gpt")
    EgbertGPTForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def gpt(gpt_dir: Path):
    return load_causal_model(gpt_dir, "cpu", allow_pickle=False)


def exit_message(argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        cli_main(argv)
    return exit_info.value.code


def by_hand(model, context: list[int], verbaliser: list[int]) -> float:
    """log p(verbaliser | context) from the full model's logits, one sequence, no padding."""
    with torch.no_grad():
        logits = model(torch.tensor([context + verbaliser])).logits[0]
    log_probs = logits.log_softmax(dim=-1)
    first = len(context)
    return sum(log_probs[first - 1 + j, token].item() for j, token in enumerate(verbaliser))


def sentiment_prompts(tokenizer, prompt: PromptFormat):
    """SENTENCES as queries after two labelled demonstrations (pool indices 7 and 3)."""
    demonstrations = {7: ({"sentence": "a triumph"}, 1), 3: ({"sentence": "a mess"}, 0)}
    return encode_prompts(tokenizer, prompt, ["sentence"], SENTENCES, demonstrations)


def test_a_label_score_is_the_sum_of_its_tokens_log_probabilities(gpt):
    model, tokenizer = gpt
    prompt = PromptFormat("Review: {sentence}\nSentiment:", (" not good at all", " very good"))
    prompts = sentiment_prompts(tokenizer, prompt)
    assert [len(ids) for ids in prompts.verbalisers] == [4, 2]
    contexts = [
        fitted_context([prompts.demonstrations[i] for i in (7, 3)], q, 500)[0]
        for q in prompts.queries
    ]
    # 6 candidates in batches of 4: rows of different lengths padded together
    scores = label_log_likelihoods(model, contexts, prompts.verbalisers, batch_size=4)
    assert scores.shape == (3, 2)
    for i, context in enumerate(contexts):
        for label, verbaliser in enumerate(prompts.verbalisers):
            assert scores[i, label] == pytest.approx(by_hand(model, context, verbaliser), abs=1e-4)


def test_calibration_divides_by_the_content_free_probabilities(gpt):
    p, p_free = np.array([[0.6, 0.4]]), np.array([[0.9, 0.1]])
    # unnormalized log-likelihoods: only the ratios between labels matter
    calibrated = calibrated_scores(np.log(p) - 3.0, np.log(p_free) + 1.0)
    np.testing.assert_allclose(calibrated, np.log(p / p_free))
    assert calibrated.argmax() == 1 and p.argmax() == 0

    model, tokenizer = gpt
    prompts = sentiment_prompts(tokenizer, PROMPTS["sst2"])
    run = shot_scores(model, prompts, [7, 3], calibrate=True, batch_size=8)
    demonstrations = [prompts.demonstrations[i] for i in (7, 3)]
    contexts = [joined(demonstrations, query, 500) for query in prompts.queries]
    scores = label_log_likelihoods(model, contexts, prompts.verbalisers)
    free = label_log_likelihoods(
        model, [joined(demonstrations, prompts.content_free, 500)], prompts.verbalisers
    )
    p = np.exp(scores) / np.exp(scores).sum(1, keepdims=True)
    p_free = np.exp(free) / np.exp(free).sum(1, keepdims=True)
    np.testing.assert_allclose(run["scores"], scores)
    np.testing.assert_allclose(run["calibrated"], np.log(p / p_free), rtol=1e-6)
    assert run["kept"] == [2, 2, 2]


def test_demonstrations_are_balanced_seeded_and_dropped_whole():
    labels = np.array([0, 1] * 10)
    draw = draw_demonstrations(labels, 5, num_labels=2, seed=3)
    assert len(set(draw)) == 5 and sorted(np.bincount(labels[draw])) == [2, 3]
    assert draw == draw_demonstrations(labels, 5, num_labels=2, seed=3)
    assert draw != draw_demonstrations(labels, 5, num_labels=2, seed=4)
    with pytest.raises(DataError, match="need 2 examples of label 1"):
        draw_demonstrations(np.array([0, 0, 0, 1]), 4, num_labels=2, seed=0)

    demonstrations = [[1, 2, 3], [4, 5], [6]]
    assert fitted_context(demonstrations, [7, 8], 10) == ([1, 2, 3, 4, 5, 6, 7, 8], 3)
    assert fitted_context(demonstrations, [7, 8], 6) == ([4, 5, 6, 7, 8], 2)
    assert fitted_context(demonstrations, [7, 8], 4) == ([6, 7, 8], 1)
    assert fitted_context(demonstrations, [7, 8], 1) == ([8], 0)  # the query's end stays


@proves("prompt-eval", "--shots")
def test_all_five_tasks_with_0_and_k_shots(gpt_dir, glue_dir, tmp_path, capsys):
    argv = ["prompt-eval", "--model", str(gpt_dir), "--task", "all", "--shots", "0", "2"]
    argv += ["--calibrate", "--max-eval-samples", "10", "--data-dir", str(glue_dir)]
    cli_main([*argv, "--output-dir", str(tmp_path)])
    out = capsys.readouterr().out
    results = json.loads((tmp_path / "prompt_eval_results.json").read_text())
    assert list(results["tasks"]) == ["sst2", "cola", "mrpc", "rte", "qnli"]
    metric_names = {"cola": {"matthews_correlation"}, "mrpc": {"accuracy", "f1"}}
    for name, task in results["tasks"].items():
        assert task["n_eval"] == 10 and set(task["shots"]) == {"0", "2"}
        assert task["shots"]["0"]["mean_demonstrations"] == 0
        assert task["shots"]["2"]["mean_demonstrations"] == 2
        for entry in task["shots"].values():
            written = entry["dev_predictions"]["validation"]
            assert len(written["references"]) == len(written["predictions"]) == 10
            if name != "cola":
                accuracy = accuracy_score(written["references"], written["predictions"])
                assert entry["metrics"]["validation"]["accuracy"] == accuracy
            for scores in (entry, entry["calibrated"]):
                metrics = scores["metrics"]["validation"]
                assert set(metrics) == metric_names.get(name, {"accuracy"})
                assert -1 <= scores["score"] <= 1
        assert f"| {name} | 2, calibrated | 2.0 |" in out
    assert results["tasks"]["qnli"]["demonstrations_from"] == "validation"
    assert "qnli: no qnli train file" in out


def test_qnli_never_scores_the_dev_examples_it_shows(glue_dir):
    task = get_task("qnli")
    dev, pool, draws, pool_split = scored_and_demonstrations(task, glue_dir, [4, 8], None, seed=0)
    shown = {pool[i]["idx"] for draw in draws.values() for i in draw}
    assert pool_split == "validation" and len(pool) == 30 and 4 <= len(shown) <= 12
    assert set(dev["idx"]) == set(range(30)) - shown


def test_stock_tiny_gpt2_scores_the_same_as_its_conversion(tiny_gpt2_dir, glue_dir, tmp_path):
    converted = tmp_path / "egbert"
    convert_checkpoint(tiny_gpt2_dir, converted)
    assert json.loads((converted / "config.json").read_text())["model_type"] == "egbert-gpt"
    options = dict(shots=[0, 3], calibrate=True, max_eval_samples=6, batch_size=5)
    stock = run_prompt_eval(tiny_gpt2_dir, ["rte"], glue_dir, **options)["tasks"]["rte"]
    ours = run_prompt_eval(converted, ["rte"], glue_dir, **options)["tasks"]["rte"]
    for k in ("0", "3"):
        stock["shots"][k].pop("seconds"), ours["shots"][k].pop("seconds")
    assert ours == stock
    stock_model, tokenizer = load_causal_model(tiny_gpt2_dir, "cpu", False)
    our_model, _ = load_causal_model(converted, "cpu", False)
    contexts = [tokenizer("The rain stopped.\nAnswer:")["input_ids"]]
    verbalisers = [tokenizer(" True")["input_ids"], tokenizer(" False")["input_ids"]]
    np.testing.assert_allclose(
        label_log_likelihoods(our_model, contexts, verbalisers),
        label_log_likelihoods(stock_model, contexts, verbalisers),
        atol=1e-5,
    )


@pytest.fixture
def bert_dir(tiny_gpt2_dir: Path, tmp_path: Path) -> Path:
    config = EgbertBertConfig(
        vocab_size=50257, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=16, max_position_embeddings=32,
    )  # fmt: skip
    EgbertBertModel(config).save_pretrained(tmp_path / "bert")
    AutoTokenizer.from_pretrained(tiny_gpt2_dir).save_pretrained(tmp_path / "bert")
    return tmp_path / "bert"


@pytest.mark.parametrize(
    ("model", "args", "expected"),
    [
        ("bert", ["--task", "sst2"], "holds a 'egbert-bert' model; prompt-eval scores a left"),
        ("gpt", ["--task", "stsb"], "no prompt format for stsb; choose from sst2"),
        ("gpt", ["--task", "nope"], "unknown task 'nope'"),
        ("gpt", ["--task", "sst2", "--shots", "-1"], "--shots must be >= 0"),
        ("gpt", ["--task", "sst2", "--shots", "80"], "80 balanced demonstrations need 40"),
        ("gpt", ["--task", "sst2", "--max-eval-samples", "0"], "--max-eval-samples must be at"),
    ],
)
def test_bad_input_ends_in_one_line(model, args, expected, gpt_dir, bert_dir, glue_dir):
    path = {"bert": bert_dir, "gpt": gpt_dir}[model]
    message = exit_message(
        ["prompt-eval", "--model", str(path), "--data-dir", str(glue_dir), *args]
    )
    assert message.startswith("egbert prompt-eval: error: ") and expected in message, message
    assert "\n" not in message


# ---------------------------------------------------------------- the command's options

RTE_FORMAT = "{sentence1}\nQuestion: {sentence2} True or False?\nAnswer:"  # GPT-3's RTE prompt
RTE_ANSWERS = (" True", " False")  # entailment, not_entailment


def zero_shot_predictions(model_dir: Path, rows: list[dict[str, str]]) -> dict[str, np.ndarray]:
    """Each row's answer with the larger log-likelihood, raw and calibrated against the
    content-free "N/A" prompt (log p - log p_cf, both normalized over the answers), by hand."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    answers = [tokenizer.encode(answer) for answer in RTE_ANSWERS]

    def scores(example: dict[str, str]) -> np.ndarray:
        context = tokenizer.encode(RTE_FORMAT.format(**example))
        return np.array([by_hand(model, context, answer) for answer in answers])

    def normalized(log_likelihoods: np.ndarray) -> np.ndarray:
        return log_likelihoods - np.logaddexp.reduce(log_likelihoods, axis=-1, keepdims=True)

    raw = np.stack([scores(row) for row in rows])
    free = scores({"sentence1": "N/A", "sentence2": "N/A"})
    calibrated = normalized(raw) - normalized(free)
    return {"raw": raw.argmax(1), "calibrated": calibrated.argmax(1)}


@proves(
    "prompt-eval", "--model", "--task", "--data-dir", "--calibrate", "--max-eval-samples",
    "--seed", "--batch-size", "--output-dir",
)  # fmt: skip
def test_zero_shot_scores_are_the_models_own_likeliest_answers(gpt_dir, glue_dir, tmp_path):
    """8 dev rows drawn with numpy's generator seeded 4, each answered by the likelier of
    " True" and " False" after the prompt (and after calibration): scikit-learn's accuracy of
    those answers is what the command reports."""
    out = tmp_path / "prompts"
    argv = ["prompt-eval", "--model", str(gpt_dir), "--task", "rte", "--data-dir", str(glue_dir)]
    argv += ["--shots", "0", "--calibrate", "--max-eval-samples", "8", "--seed", "4"]
    with model_calls() as calls:
        cli_main([*argv, "--batch-size", "3", "--no-bf16", "--output-dir", str(out)])
    rte = json.loads((out / "prompt_eval_results.json").read_text())["tasks"]["rte"]
    with (glue_dir / "RTE" / "dev.tsv").open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    predictions = zero_shot_predictions(gpt_dir, rows)
    labels = np.array([0 if row["label"] == "entailment" else 1 for row in rows])
    accuracy = {}
    for seed in (4, 0):  # 0: the default, which a seed ignored would draw with
        drawn = np.sort(np.random.default_rng(seed).choice(len(rows), size=8, replace=False))
        accuracy[seed] = {
            kind: accuracy_score(labels[drawn], found[drawn]) for kind, found in predictions.items()
        }
    # the draws and the calibration differ here, so an option ignored would show
    assert accuracy[4]["raw"] != accuracy[4]["calibrated"]
    assert all(accuracy[4][kind] != accuracy[0][kind] for kind in predictions)
    entry = rte["shots"]["0"]
    assert rte["n_eval"] == 8
    assert entry["metrics"]["validation"]["accuracy"] == accuracy[4]["raw"]
    assert entry["calibrated"]["metrics"]["validation"]["accuracy"] == accuracy[4]["calibrated"]
    # 8 examples x 2 answers, then the content-free prompt's 2, in forwards of 3 sequences
    assert [call.batch_size for call in calls] == [3, 3, 3, 3, 3, 1, 2]


@proves("prompt-eval", "--device", "--bf16", "--fp16")
def test_the_model_runs_on_the_device_and_precision_given(gpt_dir, glue_dir):
    """bf16 or fp16 autocast on or off as asked, and on the device named: moved to the meta
    device, the model's weights are where autocast refuses to go (only the model's own device
    is asked)."""
    argv = ["prompt-eval", "--model", str(gpt_dir), "--task", "rte", "--data-dir", str(glue_dir)]
    argv += ["--max-eval-samples", "2"]
    assert_bf16_and_device_are_the_options(argv)


# ---------------------------------------------------------------- breaks mutation testing found
# (docs/testing.md, evaluation/prompting): expectations from the data files, written out, or
# the command's documented words.

# `egbert prompt-eval --help` at 100 columns, as a user reads it: every option, its default and
# the words around them (a change here is a change of the command's documentation)
PROMPT_EVAL_HELP = (
    "usage: egbert prompt-eval [options]\n"
    "\n"
    "k-shot prompting of a gpt model: each dev example follows k demonstrations from the "
    "training split, and the label whose answer words the model finds likeliest is the "
    "prediction. Scored with GLUE's metric; nothing is trained.\n"
    "\n"
    "options:\n"
    + CONFIG_OPTIONS_HELP
    + (
        "  --model DIR           the model directory, with its tokenizer\n"
        "  --task TASK [TASK ...]\n"
        "                        task(s) with a prompt format (sst2, cola, mrpc, rte, qnli), "
        "or all\n"
        "  --data-dir DIR        the GLUE folder (DIR/SST-2/train.tsv, ...)\n"
        "  --shots SHOTS [SHOTS ...]\n"
        "                        numbers of demonstrations, each scored separately (default: "
        "0)\n"
        "  --calibrate, --no-calibrate\n"
        '                        also report scores calibrated against a content-free "N/A" '
        "input (default:\n"
        "                        False)\n"
        "  --max-eval-samples MAX_EVAL_SAMPLES\n"
        "                        score a seeded random sample of this many dev examples "
        "(default: all)\n"
        "  --batch-size BATCH_SIZE\n"
        "                        sequences per forward (default: 16)\n"
        "  --seed SEED           random seed (default: 0)\n"
        "  --output-dir OUTPUT_DIR\n"
        "                        write prompt_eval_results.json here (default: print only)\n"
    )
    + RUN_OPTIONS_HELP
    + (
        "\n"
        "For each k, one draw of demonstrations (balanced over the labels, seeded) serves "
        "every example; whole demonstrations are dropped from the front when the prompt "
        "would not fit the model's positions (the table's 'demonstrations kept' column). "
        "QNLI has no train split in the shared data: its demonstrations come from dev and "
        "are not scored. --calibrate divides each example's label probabilities by those the "
        'same demonstrations give a content-free "N/A" example (Zhao et al. 2021). Example: '
        "egbert prompt-eval --model runs/gpt-mini --task sst2 rte --shots 0 4 16 --calibrate "
        "--max-eval-samples 500 --data-dir data/glue\n"
    )
)


def test_the_help_says_what_the_command_does(monkeypatch, capsys):
    assert help_text("prompt-eval", monkeypatch, capsys) == PROMPT_EVAL_HELP


def tsv_labels(path: Path) -> list[str]:
    with path.open(encoding="utf-8") as file:
        return [
            row["label"] for row in csv.DictReader(file, delimiter="\t", quoting=csv.QUOTE_NONE)
        ]


def test_the_results_say_how_they_were_made(gpt_dir, glue_dir, tmp_path):
    found = run_prompt_eval(
        gpt_dir, ["rte", "qnli"], glue_dir, shots=[0, 2], max_eval_samples=6, seed=3,
        output_dir=tmp_path,
    )  # fmt: skip
    assert found["model"] == str(gpt_dir)
    options = {k: found["options"][k] for k in ("shots", "calibrate", "max_eval_samples", "seed")}
    assert options == {"shots": [0, 2], "calibrate": False, "max_eval_samples": 6, "seed": 3}
    assert found["options"]["demonstrations"] == (
        "balanced over the labels, one seeded draw per k for every example"
    )
    rte, qnli = found["tasks"]["rte"], found["tasks"]["qnli"]
    assert rte["template"] == "{sentence1}\nQuestion: {sentence2} True or False?\nAnswer:"
    assert rte["verbalisers"] == [" True", " False"]
    # the train file's most frequent label as an id (entailment 0, not_entailment 1), a tie
    # going to the smaller id
    ids = [["entailment", "not_entailment"].index(label) for label in tsv_labels(
        glue_dir / "RTE" / "train.tsv"
    )]  # fmt: skip
    most = max(ids.count(0), ids.count(1))
    assert rte["majority_label"] == min(i for i in (0, 1) if ids.count(i) == most)
    assert rte["demonstrations_from"] == "train" and "note" not in rte
    assert qnli["demonstrations_from"] == "validation" and "no qnli train file" in qnli["note"]
    for entry in (*rte["shots"].values(), *qnli["shots"].values()):
        seconds = entry["seconds"]
        assert isinstance(seconds, float) and 0 <= seconds < 120 and seconds == round(seconds, 2)
    table = prompt_table(found)
    assert table.count("| rte | 0 |") == 1
    row = next(line for line in table.splitlines() if line.startswith("| rte | 0 |"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    majority = 100 * rte["majority_score"]
    assert cells[4:] == [f"{100 * rte['shots']['0']['score']:.2f}", f"{majority:.2f}", "6"]


def test_rte_draws_its_demonstrations_from_its_train_file(glue_dir):
    dev, pool, draws, pool_split = scored_and_demonstrations(
        get_task("rte"), glue_dir, [4], None, 0
    )
    assert pool_split == "train"
    assert len(pool) == len(tsv_labels(glue_dir / "RTE" / "train.tsv"))
    assert len(dev) == len(tsv_labels(glue_dir / "RTE" / "dev.tsv"))  # none left out


def test_demonstrations_are_drawn_without_replacement():
    # every example of a pool of four, two of each label: a permutation of them
    for seed in range(20):
        assert sorted(draw_demonstrations(np.array([0, 0, 1, 1]), 4, 2, seed)) == [0, 1, 2, 3]
    # two of three labels: never the same label twice
    labels = np.array([0, 0, 1, 1, 2, 2])
    for seed in range(20):
        picked = draw_demonstrations(labels, 2, 3, seed)
        assert len(set(labels[picked])) == 2


def test_a_context_that_fills_the_room_exactly_keeps_every_demonstration():
    assert fitted_context([[1, 2], [3]], [4], 4) == ([1, 2, 3, 4], 2)


def test_prompts_carry_no_special_tokens_and_demonstrations_their_answers(bert_dir, gpt_dir):
    tokenizer = AutoTokenizer.from_pretrained(bert_dir)
    ids = encode(tokenizer, ["good film"])[0]
    assert tokenizer.cls_token_id not in ids and tokenizer.sep_token_id not in ids
    gpt_tokenizer = AutoTokenizer.from_pretrained(gpt_dir)
    sst2 = PROMPTS["sst2"]
    examples = [{"sentence": "a fine film"}]
    demonstrations = {7: ({"sentence": "dull"}, 0), 9: ({"sentence": "great"}, 1)}
    prompts = encode_prompts(gpt_tokenizer, sst2, ["sentence"], examples, demonstrations)
    texts = {i: gpt_tokenizer.decode(ids) for i, ids in prompts.demonstrations.items()}
    assert texts == {
        7: "Review: dull\nSentiment: negative\n\n",
        9: "Review: great\nSentiment: positive\n\n",
    }


def test_answers_that_encode_alike_are_refused_whole(gpt_dir):
    tokenizer = AutoTokenizer.from_pretrained(gpt_dir)
    same = PromptFormat("{sentence}", (" good", " good"))
    ids = tokenizer(" good", add_special_tokens=False)["input_ids"]
    with pytest.raises(CheckpointError) as raised:
        encode_verbalisers(tokenizer, same)
    assert str(raised.value) == (
        f"the model's tokenizer encodes the answers [' good', ' good'] as {[ids, ids]}: each "
        "needs its own, non-empty tokens"
    )


def test_option_checks_name_the_option():
    with pytest.raises(ConfigError) as raised:
        check_prompt_options([], None, 1)
    assert str(raised.value) == (
        "--shots is empty; give one or more numbers of demonstrations, e.g. 0 4"
    )
    with pytest.raises(ConfigError) as raised:
        check_prompt_options([0], None, 0)
    assert str(raised.value) == "--batch-size must be at least 1, got 0"


def test_run_prompt_eval_checks_its_batch_and_output_folder(gpt_dir, glue_dir, tmp_path):
    with pytest.raises(ConfigError, match="--batch-size must be at least 1, got 0"):
        run_prompt_eval(gpt_dir, ["rte"], glue_dir, batch_size=0)
    taken = tmp_path / "a-file"
    taken.write_text("")
    with pytest.raises(Exception, match="--output-dir"):
        run_prompt_eval(gpt_dir, ["rte"], glue_dir, output_dir=taken)


def test_contexts_are_cut_to_the_models_positions_less_the_longest_answer(gpt):
    model, _ = gpt
    positions = model.config.max_position_embeddings  # 512
    # two demonstrations of 250 and a query of 13: 513 > 511 room with one-token answers
    prompts = EncodedPrompts(
        verbalisers=[[5], [6]], queries=[[3] * 13], content_free=[4],
        demonstrations={0: [1] * 250, 1: [2] * 250},
    )  # fmt: skip
    assert positions == 512
    assert shot_scores(model, prompts, [0, 1], False, 4)["kept"] == [1]


def test_a_wordpiece_tokenizer_adds_no_special_tokens_to_prompts(tiny_tokenizer_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    assert tokenizer("good film")["input_ids"][0] == tokenizer.cls_token_id  # it would add them
    ids = encode(tokenizer, ["good film"])[0]
    assert tokenizer.cls_token_id not in ids and tokenizer.sep_token_id not in ids


def test_models_that_cannot_prompt_are_refused_whole(bert_dir, gpt_dir, tmp_path):
    with pytest.raises(CheckpointError) as raised:
        load_causal_model(bert_dir, "cpu", allow_pickle=False)
    assert str(raised.value).endswith(
        "prompt-eval scores a left-to-right language model's next-token probabilities: pass a "
        "gpt model (egbert-gpt, gpt2)"
    )
    small = tmp_path / "small-vocab"
    config = EgbertGPTConfig(
        vocab_size=100, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=16, max_position_embeddings=32,
    )  # fmt: skip
    EgbertGPTForCausalLM(config).save_pretrained(small)
    AutoTokenizer.from_pretrained(gpt_dir).save_pretrained(small)
    with pytest.raises(CheckpointError) as raised:
        load_causal_model(small, "cpu", allow_pickle=False)
    tokens = len(AutoTokenizer.from_pretrained(gpt_dir))
    assert str(raised.value) == (
        f"the tokenizer has {tokens} tokens but the model in {small} has vocab_size 100; use the "
        "tokenizer the model was trained with"
    )


def test_allow_pickle_reaches_the_loader(gpt_dir, glue_dir, tmp_path):
    pickled = tmp_path / "pickled"
    model, tokenizer = load_causal_model(gpt_dir, "cpu", allow_pickle=False)
    model.config.save_pretrained(pickled)
    torch.save(model.state_dict(), pickled / "pytorch_model.bin")  # no safetensors beside it
    tokenizer.save_pretrained(pickled)
    with pytest.raises(CheckpointError, match="pass --allow-pickle"):
        run_prompt_eval(pickled, ["rte"], glue_dir, max_eval_samples=2)
    found = run_prompt_eval(pickled, ["rte"], glue_dir, max_eval_samples=2, allow_pickle=True)
    assert found["tasks"]["rte"]["n_eval"] == 2


def test_the_python_api_runs_with_the_commands_defaults(gpt_dir, glue_dir):
    import inspect

    (parsed,) = parse_args(
        (PromptEvalArguments,),
        ["--model", str(gpt_dir), "--task", "rte", "--data-dir", str(glue_dir)],
        "egbert prompt-eval",
        "",
    )
    defaults = inspect.signature(run_prompt_eval).parameters
    for name in ("calibrate", "batch_size", "seed", "fp16", "allow_pickle", "max_eval_samples"):
        assert defaults[name].default == getattr(parsed, name), name
    # and the values --help documents
    assert (parsed.batch_size, parsed.seed, parsed.fp16, parsed.allow_pickle) == (
        16,
        0,
        False,
        False,
    )


def test_an_output_dir_that_is_a_file_is_refused_by_name(gpt_dir, glue_dir, tmp_path):
    taken = tmp_path / "a-file"
    taken.write_text("")
    with pytest.raises(ConfigError) as raised:
        run_prompt_eval(gpt_dir, ["rte"], glue_dir, output_dir=taken)
    assert str(raised.value) == (
        f"--output-dir {taken}: {taken} is a file, not a folder; choose another --output-dir"
    )
