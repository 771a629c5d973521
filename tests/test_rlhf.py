"""`egbert rlhf` with a tiny gpt: TRL's RLOO (or GRPO) loop raises a scorer's reward, the KL to
the start is 0 before any step, the scorer reads prompt and completion with its own special
tokens, the tuned folder loads as the start did, generating between steps leaves training as it
was, and each option reaches what it names."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from option_coverage import proves
from peft import PeftModel
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, pipeline

from egbert.alignment.policy_report import PolicyReport, compare_policies, moving_mean
from egbert.alignment.prompts import load_prompts, prompts_from_task, word_range
from egbert.alignment.rlhf import (
    RLHFArguments,
    ScoringModel,
    load_policy,
    policy_card,
    rlhf_config,
    rlhf_trainer,
    training_prompts,
)
from egbert.commands.rlhf import main
from egbert.errors import ConfigError, DataError
from egbert.generate import generate_text
from egbert.lora import LoraArguments, lora_config
from egbert.models.bert import EgbertBertConfig
from egbert.models.gpt import EgbertGPTConfig, EgbertGPTForCausalLM
from egbert.models.heads import EgbertBertForSequenceClassification
from egbert.tokenizer import load_tokenizer, tokenizer_for_family

SIZES = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2}
SIZES |= {"intermediate_size": 64, "max_position_embeddings": 64}
WORDS = ["the", "city", "of", "a", "army", "was", "in", "his", "first", "and", "new", "to"]
FAST = ["--batch-size", "8", "--group-size", "4", "--max-completion-length", "6"]
FAST += ["--eval-prompts", "8", "--lr", "1e-3"]


@pytest.fixture(scope="module")
def policy_dir(tiny_tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised egbert gpt with the tiny WordPiece tokenizer, as gpt reads it."""
    out = tmp_path_factory.mktemp("policy")
    tokenizer = load_tokenizer(tiny_tokenizer_dir)
    torch.manual_seed(0)
    ends = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    config = EgbertGPTConfig(
        vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **ends, **SIZES
    )
    EgbertGPTForCausalLM(config).save_pretrained(out)
    tokenizer_for_family(tokenizer, "gpt", 64).save_pretrained(out)
    return out


def save_scorer(tokenizer_dir: Path, out: Path, labels: tuple[str, ...]) -> Path:
    """A randomly initialised egbert bert classifier: one output, or the labels named."""
    tokenizer = load_tokenizer(tokenizer_dir)
    names = {"id2label": dict(enumerate(labels))} if labels else {}
    config = EgbertBertConfig(
        vocab_size=len(tokenizer), num_labels=len(labels) or 1, **SIZES, **names
    )
    torch.manual_seed(1)
    EgbertBertForSequenceClassification(config).save_pretrained(out)
    tokenizer_for_family(tokenizer, "bert", 64).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def scorer_dir(tiny_tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_scorer(tiny_tokenizer_dir, tmp_path_factory.mktemp("scorer"), ())


@pytest.fixture(scope="module")
def labelled_scorer_dir(tiny_tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_scorer(
        tiny_tokenizer_dir, tmp_path_factory.mktemp("labelled"), ("negative", "positive")
    )


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(0)
    lines = [" ".join(rng.choice(WORDS, size=rng.integers(2, 6))) for _ in range(72)]
    path = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def even_share(prompts: list[str], completions: list[str], completion_ids=None, **_) -> list[float]:
    """A toy scorer: the share of a completion's tokens whose id is even (about 0.5 at random)."""
    return [float(np.mean([i % 2 == 0 for i in ids])) if ids else 0.0 for ids in completion_ids]


def arguments(policy: Path, scorer: Path, prompts: Path, out: Path, **options) -> RLHFArguments:
    fast = {"batch_size": 8, "group_size": 4, "max_completion_length": 6, "eval_prompts": 8}
    return RLHFArguments(str(policy), str(scorer), str(out), prompts=str(prompts), **fast | options)


@proves("rlhf", "--kl-coef", "--group-size", "--max-completion-length")
def test_rl_steps_raise_a_toy_scorers_reward_and_the_kl_starts_at_0(
    policy_dir: Path, scorer_dir: Path, prompt_file: Path, tmp_path: Path
) -> None:
    """40 RLOO steps raise the share of even token ids in held-out completions (sampled with
    the same seeds before and after), the interval of the change above 0; the first step's KL
    to the start is 0 and grows; every completion is at most the length asked, grouped by 4."""
    args = arguments(policy_dir, scorer_dir, prompt_file, tmp_path, lr=2e-2, max_steps=40,
                     batch_size=32, eval_prompts=32, max_completion_length=8)  # fmt: skip
    run = rlhf_trainer(args, reward=even_share)
    run.trainer.train()
    kls = [entry["kl"] for entry in run.trainer.state.log_history if "kl" in entry]
    assert kls[0] == pytest.approx(0.0, abs=1e-6) and max(kls) > 1e-3
    starting, tokenizer = load_policy(str(policy_dir))
    report = PolicyReport(list(run.held_out["prompt"]), max_new_tokens=8, seed=0)
    results = compare_policies(starting, run.trainer.model, tokenizer, even_share, report)
    reward = results["reward"]
    assert reward["change_low"] > 0 and reward["after"] > reward["before"] + 0.1
    assert results["kl_per_token"] > 0
    same = compare_policies(
        starting, load_policy(str(policy_dir))[0], tokenizer, even_share, report
    )
    assert same["kl_per_token"] == 0.0 and same["reward"]["change"] == 0.0
    assert run.trainer.args.num_generations == 4 and run.trainer.beta == 0.1
    lengths = [
        e["completions/max_length"]
        for e in run.trainer.state.log_history
        if "completions/max_length" in e
    ]
    assert max(lengths) <= 8


@proves("rlhf", "--model", "--reward-model", "--prompts", "--output-dir", "--max-steps",
        "--validation-text", "--eval-prompts", "--batch-size", "--lr")  # fmt: skip
def test_the_command_writes_a_policy_that_loads_as_the_start_did(
    policy_dir: Path, scorer_dir: Path, prompt_file: Path, wikitext_slice: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture,
) -> None:  # fmt: skip
    """model/ loads with AutoModelForCausalLM, pipeline("text-generation") and egbert generate;
    rlhf_results.json holds what the command printed; reward_kl.png is there; the weights moved;
    the progress bar shows the reward and the KL; the model card says how the reward moved."""
    out = tmp_path / "rlhf"
    main(["--model", str(policy_dir), "--reward-model", str(scorer_dir), "--prompts",
          str(prompt_file), "--output-dir", str(out), "--max-steps", "3",
          "--validation-text", str(wikitext_slice), *FAST])  # fmt: skip
    printed, progress = capsys.readouterr()
    # the progress bar shows the reward and the KL; TRL's logs of twenty numbers are not printed
    assert "reward=" in progress and "kl=" in progress
    assert "completions/mean_length" not in printed + progress
    results = json.loads((out / "rlhf_results.json").read_text())
    assert results["steps"] == 3 and results["held_out_prompts"] == 8
    assert results["train_prompts"] == 72 - 8 and (out / "reward_kl.png").stat().st_size > 0
    assert f"{results['reward']['before']:.3f} -> {results['reward']['after']:.3f}" in printed
    perplexity = results["validation_perplexity"]
    assert 100 < perplexity["before"] < 5000 and perplexity["after"] != perplexity["before"]
    card = (out / "model" / "README.md").read_text()
    assert "pipeline_tag: text-generation" in card
    assert f"from {results['reward']['before']:.3f} to {results['reward']['after']:.3f}" in card
    assert f"| validation_perplexity | {perplexity['after']:.4f} |" in card
    tuned = AutoModelForCausalLM.from_pretrained(out / "model")
    assert isinstance(tuned, EgbertGPTForCausalLM)
    start = load_file(policy_dir / "model.safetensors")
    moved = load_file(out / "model" / "model.safetensors")
    assert not torch.equal(
        start["gpt.layers.0.attention.qkv.weight"], moved["gpt.layers.0.attention.qkv.weight"]
    )
    generator = pipeline("text-generation", model=str(out / "model"), device="cpu")
    assert generator("the city", max_new_tokens=3, do_sample=False)[0]["generated_text"].startswith(
        "the city"
    )
    assert isinstance(generate_text(str(out / "model"), "the city", max_new_tokens=3), str)
    first = results["completions"][0]
    assert first["text_before"].startswith(first["prompt"]) and set(first) >= {
        "reward_before",
        "reward_after",
    }


def test_the_model_card_gives_the_held_out_comparison_and_the_training(policy_dir: Path) -> None:
    """The card's numbers are the results' (written out here by hand: in the command's 3-step
    test run the reward hardly moves, so before and after print alike)."""
    results = {
        "model": "runs/gpt", "algorithm": "rloo", "reward_model": "runs/scorer",
        "held_out_prompts": 200, "kl_per_token": 0.33341, "steps": 1366, "train_prompts": 66349,
        "train_seconds": 1202.0, "options": {"lr": 0.0001},
        "reward": {"before": 0.4641, "after": 0.6129, "change": 0.1488, "change_low": 0.1112,
                   "change_high": 0.1861},
        "validation_perplexity": {"before": 68.21, "after": 89.74},
    }  # fmt: skip
    card = str(policy_card(AutoModelForCausalLM.from_pretrained(policy_dir), results))
    assert "`runs/gpt` tuned with egbert rlhf (TRL's RLOO) against the scoring model" in card
    assert (
        "On 200 held-out prompts its mean reward went from 0.464 to 0.613 (change +0.149, 95% "
        "paired bootstrap interval [+0.111, +0.186]), at a KL to the start of 0.3334 per "
        "completion token." in card
    )
    assert "| reward | 0.6129 |" in card and "| validation_perplexity | 89.7400 |" in card
    assert "1,366 steps on 66,349 prompts, 20.0 minutes." in card and '"lr": 0.0001' in card


def test_the_scorer_reads_each_text_with_its_own_special_tokens(
    scorer_dir: Path, policy_dir: Path
) -> None:
    """The scorer's one logit for prompt + completion equals the classifier's on the text its
    tokenizer encodes with [CLS] ... [SEP]; the text is the policy's tokens decoded together."""
    policy_tokenizer = load_tokenizer(policy_dir)
    scorer = ScoringModel(str(scorer_dir), policy_tokenizer=policy_tokenizer)
    prompt_ids = policy_tokenizer(["the city"])["input_ids"]
    completion = policy_tokenizer(["of the army"])["input_ids"]
    texts = scorer.scored_texts(["the city"], ["of the army"], completion)
    assert texts == ["the city of the army"]
    assert prompt_ids[0] + completion[0] == policy_tokenizer(texts)["input_ids"][0]
    encoded = scorer.tokenizer(texts, return_tensors="pt")
    ids = encoded["input_ids"][0].tolist()
    assert ids[0] == scorer.tokenizer.cls_token_id and ids[-1] == scorer.tokenizer.sep_token_id
    with torch.no_grad():
        expected = scorer.model(**encoded).logits[0, 0].item()
    decoded = policy_tokenizer.batch_decode(completion, skip_special_tokens=True)  # as TRL does
    assert decoded == ["of the army"]  # no space before it: joined end to end, "cityof"
    assert scorer(["the city"], decoded, completion) == [pytest.approx(expected, abs=1e-6)]
    without = scorer.model(input_ids=encoded["input_ids"][:, 1:-1]).logits[0, 0].item()
    assert without != pytest.approx(expected, abs=1e-4)  # the specials change the score
    with pytest.raises(ConfigError, match="has one output, the reward; drop --reward-label"):
        ScoringModel(str(scorer_dir), "positive")
    assert ScoringModel(str(scorer_dir), "0").label == 0


@proves("rlhf", "--reward-label", "--reward-score")
def test_a_labelled_scorer_scores_by_the_labels_probability_or_logit(
    labelled_scorer_dir: Path,
) -> None:
    scorer = ScoringModel(str(labelled_scorer_dir), "positive")
    texts = ["the city was new", "his army of the first"]
    with torch.no_grad():
        logits = scorer.model(**scorer.tokenizer(texts, padding=True, return_tensors="pt")).logits
    probability = scorer(texts, ["", ""])
    assert probability == pytest.approx(logits.softmax(-1)[:, 1].tolist(), abs=1e-6)
    negative = ScoringModel(str(labelled_scorer_dir), "0")(texts, ["", ""])
    assert negative == pytest.approx(logits.softmax(-1)[:, 0].tolist(), abs=1e-6)
    logit = ScoringModel(str(labelled_scorer_dir), "positive", "logit")(texts, ["", ""])
    assert logit == pytest.approx(logits[:, 1].tolist(), abs=1e-5)
    with pytest.raises(
        ConfigError, match="has 2 labels \\(negative, positive\\); pass --reward-label"
    ):
        ScoringModel(str(labelled_scorer_dir))
    with pytest.raises(
        ConfigError, match="'happy' is not a label of .*; use one of negative, positive"
    ):
        ScoringModel(str(labelled_scorer_dir), "happy")


@proves("rlhf", "--prompts-from-task", "--data-dir", "--prompt-words", "--seed", "--max-prompts")
def test_prompts_from_a_task_are_the_first_words_of_its_sentences(
    sst2_slice: Path, policy_dir: Path, scorer_dir: Path, tmp_path: Path
) -> None:
    common = {
        "model": str(policy_dir),
        "reward_model": str(scorer_dir),
        "output_dir": str(tmp_path),
    }
    task = {"prompts_from_task": "sst2", "data_dir": str(sst2_slice), "eval_prompts": 10}
    train, held_out = training_prompts(RLHFArguments(**common, **task))
    for prompts, split in ((train, "train.tsv"), (held_out, "dev.tsv")):
        lines = (sst2_slice / "SST-2" / split).read_text(encoding="utf-8").splitlines()[1:]
        sentences = [line.rsplit("\t", 1)[0] for line in lines]
        for prompt in prompts["prompt"]:
            assert len(prompt.split()) <= 8  # fewer for a sentence shorter than the draw
            assert any(s.startswith(prompt + " ") for s in sentences), prompt
    lines = (sst2_slice / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]
    assert len(train) == sum(len(line.split("\t")[0].split()) > 1 for line in lines)
    assert len(held_out) == 10
    assert min(len(p.split()) for p in train["prompt"]) == 1  # a two-word sentence's first
    assert max(len(p.split()) for p in train["prompt"]) == 8
    short, _ = training_prompts(RLHFArguments(**common, **task, prompt_words="3", max_prompts=5))
    assert len(short) == 5 and all(len(p.split()) <= 3 for p in short["prompt"])
    assert any(len(p.split()) == 3 for p in short["prompt"])
    other, _ = training_prompts(RLHFArguments(**common, **task, seed=7))
    assert list(other["prompt"]) != list(train["prompt"])
    with pytest.raises(ConfigError, match="--prompt-words '8-2'"):
        word_range("8-2")
    with pytest.raises(ConfigError, match="sentence pairs"):
        prompts_from_task("rte", "train", str(sst2_slice), (2, 8), 0)


@proves("rlhf", "--validation-prompts")
def test_prompts_come_from_every_kind_of_source(tmp_path: Path, prompt_file: Path) -> None:
    rows = [{"prompt": "the city"}, {"prompt": "his army was"}]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "p.txt").write_text("the city\n\nhis army was\n")
    import datasets

    datasets.Dataset.from_list(rows).to_parquet(tmp_path / "p.parquet")
    for name in ("p.jsonl", "p.txt", "p.parquet"):
        assert list(load_prompts(str(tmp_path / name))["prompt"]) == ["the city", "his army was"]
    args = RLHFArguments("m", "s", str(tmp_path / "o"), prompts=str(prompt_file),
                         validation_prompts=str(tmp_path / "p.txt"))  # fmt: skip
    train, held_out = training_prompts(args)
    assert len(train) == 72 and list(held_out["prompt"]) == ["the city", "his army was"]


def test_bad_input_is_one_line_before_any_training(
    policy_dir: Path, scorer_dir: Path, labelled_scorer_dir: Path, tiny_egbert_bert_dir: Path,
    prompt_file: Path, tmp_path: Path,
) -> None:  # fmt: skip
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    no_column = tmp_path / "rows.jsonl"
    no_column.write_text('{"text": "a"}\n')
    common = {
        "model": str(policy_dir),
        "reward_model": str(scorer_dir),
        "prompts": str(prompt_file),
        "batch_size": 8,
        "group_size": 4,
    }
    cases = [
        (DataError, {"prompts": str(empty)}, f"{empty}: no prompts"),
        (DataError, {"prompts": str(no_column)}, f"{no_column}: no 'prompt' column (it has text)"),
        (ConfigError, {"reward_model": str(labelled_scorer_dir)}, "has 2 labels"),
        (ConfigError, {"model": str(tiny_egbert_bert_dir)}, "not a causal language model"),
        (ConfigError, {"batch_size": 6}, "must be a multiple of --group-size (4)"),
        (ConfigError, {"group_size": 1}, "--group-size must be >= 2"),
        (ConfigError, {"prompts_from_task": "sst2"}, "give one of --prompts FILE and"),
        (ConfigError, {"prompts": None}, "give the prompts"),
        (ConfigError, {"kl_coef": -1.0}, "--kl-coef must be >= 0"),
    ]
    for number, (error, change, message) in enumerate(cases):
        out = tmp_path / f"out{number}"
        with pytest.raises(error) as raised:
            rlhf_trainer(RLHFArguments(**(common | change), output_dir=str(out)))
        assert message in str(raised.value) and "\n" not in str(raised.value), change
        assert not (out / "checkpoints").exists()


@proves("rlhf", "--algorithm", "--gradient-checkpointing", "--bf16")
def test_grpo_and_trls_own_defaults_train_egberts_gpt(
    policy_dir: Path, scorer_dir: Path, prompt_file: Path, tmp_path: Path
) -> None:
    """GRPOTrainer instead of RLOO, with gradient checkpointing and bf16 as TRL's configs set
    them by default: two steps move the weights and leave them finite."""
    for algorithm in ("grpo", "rloo"):
        options = {"algorithm": algorithm, "gradient_checkpointing": True, "bf16": True}
        out = tmp_path / algorithm
        args = arguments(policy_dir, scorer_dir, prompt_file, out, max_steps=2, lr=1e-2, **options)
        run = rlhf_trainer(args, reward=even_share)
        assert (
            type(run.trainer).__name__ == {"grpo": "GRPOTrainer", "rloo": "RLOOTrainer"}[algorithm]
        )
        before = {n: p.detach().clone() for n, p in run.trainer.model.named_parameters()}
        run.trainer.train()
        assert run.trainer.args.activation_checkpointing and run.trainer.args.bf16
        assert run.trainer.model.is_activation_checkpointing
        after = dict(run.trainer.model.named_parameters())
        assert all(torch.isfinite(p).all() for p in after.values())
        assert not torch.equal(
            before["gpt.layers.0.attention.qkv.weight"], after["gpt.layers.0.attention.qkv.weight"]
        )


@proves("rlhf", "--grad-accum", "--temperature", "--top-k", "--epochs", "--warmup-steps",
        "--max-grad-norm", "--save-every")  # fmt: skip
def test_the_training_options_reach_trls_configuration(tmp_path: Path) -> None:
    options = {"grad_accum": 2, "temperature": 0.7, "top_k": 40, "epochs": 3.0,
               "warmup_steps": 0.2, "max_grad_norm": 0.5, "kl_coef": 0.2, "seed": 3}  # fmt: skip
    args = RLHFArguments("m", "s", str(tmp_path), prompts="p", bf16=False, **options)
    config = rlhf_config(args, tmp_path / "checkpoints")
    assert (config.gradient_accumulation_steps, config.temperature, config.top_k) == (2, 0.7, 40)
    assert (config.num_train_epochs, config.warmup_steps, config.max_grad_norm) == (3.0, 0.2, 0.5)
    assert (config.beta, config.seed, config.bf16) == (0.2, 3, False)
    assert config.save_strategy == "epoch" and config.generation_batch_size == 32
    every = rlhf_config(RLHFArguments("m", "s", "o", prompts="p", save_every=5), tmp_path)
    assert (every.save_strategy, every.save_steps) == ("steps", 5)


def test_generating_between_steps_leaves_training_as_it_was(policy_dir: Path) -> None:
    """Three AdamW steps of the policy, once with a one-row generate between each backward and
    its step (what lays the CPU weights out transposed for decoding, lay_out_for_decoding) and
    once without: the gradients, the weights and the optimizer state end bitwise equal."""

    def train(generate: bool) -> tuple[dict, dict, dict]:
        torch.manual_seed(0)  # the same dropout masks
        model = AutoModelForCausalLM.from_pretrained(policy_dir)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        batch = torch.randint(5, 1000, (4, 12), generator=torch.Generator().manual_seed(0))
        transposed = []
        for _ in range(3):
            model.train()
            model(input_ids=batch, labels=batch).loss.backward()
            if generate:
                model.eval()
                model.generate(input_ids=batch[:1, :4], max_new_tokens=4, do_sample=False)
                transposed.append(any(not p.is_contiguous() for p in model.parameters()))
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
            optimizer.step()
            optimizer.zero_grad()
        if generate:
            assert all(transposed)  # the decoding layout was in place at each step
        state = {
            n: {k: v.clone() for k, v in optimizer.state[p].items()}
            for n, p in model.named_parameters()
        }
        return grads, dict(model.named_parameters()), state

    plain, with_generation = train(False), train(True)
    for name in plain[0]:
        assert torch.equal(plain[0][name], with_generation[0][name]), name
        assert torch.equal(plain[1][name], with_generation[1][name]), name
        for key, value in plain[2][name].items():
            assert torch.equal(value, with_generation[2][name][key]), (name, key)


@proves("rlhf", "--resume", "--budget-minutes")
def test_sigterm_leaves_a_checkpoint_and_resume_goes_on_from_it(
    policy_dir: Path, scorer_dir: Path, prompt_file: Path, tmp_path: Path, subprocess_env,
    warm_python,
) -> None:  # fmt: skip
    """Stopped by SIGTERM after its step-2 checkpoint: exit 143, a checkpoint, no model, and
    the same command without --resume refused; resumed from a checkpoint whose embedding was
    zeroed by hand, it ends at the steps asked with that embedding near zero: it went on from
    the checkpoint. A budget ends a run after its first step."""
    argv = ["--model", str(policy_dir), "--reward-model", str(scorer_dir), "--prompts",
            str(prompt_file), "--max-steps", "12", "--save-every", "2", *FAST]  # fmt: skip
    out = tmp_path / "stopped"
    command = [warm_python(subprocess_env), "-m", "egbert.cli", "rlhf", *argv]
    process = subprocess.Popen([*command, "--output-dir", str(out)], env=subprocess_env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    deadline = time.monotonic() + 120
    while not (out / "checkpoints" / "checkpoint-2").is_dir():
        assert process.poll() is None, process.stdout.read().decode()[-2000:]
        assert time.monotonic() < deadline, "no checkpoint-2 after 120 s"
        time.sleep(0.01)
    process.send_signal(signal.SIGTERM)
    said = process.communicate(timeout=120)[0].decode()
    assert process.returncode == 128 + signal.SIGTERM, said[-2000:]
    stopped = max(int(p.name.split("-")[1]) for p in (out / "checkpoints").glob("checkpoint-*"))
    assert 2 <= stopped < 12 and f"stopped at step {stopped}" in said
    assert not (out / "model").exists()
    with pytest.raises(ConfigError, match="holds an earlier run; pass --resume"):
        main([*argv, "--output-dir", str(out)])
    weights = out / "checkpoints" / f"checkpoint-{stopped}" / "model.safetensors"
    state = load_file(weights)
    name = "gpt.embeddings.word_embeddings.weight"
    start_size = state[name].abs().mean()
    save_file({**state, name: torch.zeros_like(state[name])}, weights)
    main([*argv, "--output-dir", str(out), "--resume"])
    assert json.loads((out / "rlhf_results.json").read_text())["steps"] == 12
    assert load_file(out / "model" / "model.safetensors")[name].abs().mean() < start_size / 2
    budget = tmp_path / "budget"
    main([*argv, "--output-dir", str(budget), "--budget-minutes", "1e-6"])
    assert json.loads((budget / "rlhf_results.json").read_text())["steps"] == 1


@proves("rlhf", "--lora", "--lora-rank", "--lora-alpha", "--lora-dropout", "--lora-target-modules")
def test_lora_trains_adapters_against_the_base_with_them_disabled(
    policy_dir: Path, scorer_dir: Path, prompt_file: Path, tmp_path: Path
) -> None:
    """With --lora only the adapters train (rank 4 on qkv and up: 2 x 4 x (32 + 96) + ...), no
    second model is kept for the KL (TRL disables the adapters instead) and its first step's KL
    is 0; adapter/ loads with PeftModel.from_pretrained onto the start its config names, and
    gives the logits of model/, the adapters merged in."""
    out = tmp_path / "lora"
    main(["--model", str(policy_dir), "--reward-model", str(scorer_dir), "--prompts",
          str(prompt_file), "--output-dir", str(out), "--max-steps", "3", *FAST, "--lora",
          "--lora-rank", "4", "--lora-alpha", "12", "--lora-dropout", "0.1",
          "--lora-target-modules", "qkv", "up"])  # fmt: skip
    results = json.loads((out / "rlhf_results.json").read_text())
    # per layer: qkv 4 x (32 + 96), up 4 x (32 + 64); two layers
    assert results["trainable_parameters"] == 2 * (4 * (32 + 96) + 4 * (32 + 64))
    adapter_config = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert adapter_config["base_model_name_or_path"] == str(policy_dir)
    # alpha 12: neither egbert's default (16) nor PEFT's (8), so the option reached the adapter
    assert (adapter_config["r"], adapter_config["lora_alpha"]) == (4, 12)
    assert adapter_config["task_type"] == "CAUSAL_LM"
    assert adapter_config["lora_dropout"] == 0.1
    assert sorted(adapter_config["target_modules"]) == ["qkv", "up"]
    base = AutoModelForCausalLM.from_pretrained(policy_dir)
    adapted = PeftModel.from_pretrained(base, out / "adapter").eval()
    merged = AutoModelForCausalLM.from_pretrained(out / "model").eval()
    ids = torch.randint(5, 1000, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        adapter_logits = adapted(input_ids=ids).logits
        torch.testing.assert_close(merged(input_ids=ids).logits, adapter_logits, atol=1e-5, rtol=0)
        with adapted.disable_adapter():
            start_logits = adapted(input_ids=ids).logits
    assert not torch.allclose(start_logits, adapter_logits, atol=1e-4)  # the adapters learned
    args = arguments(policy_dir, scorer_dir, prompt_file, tmp_path / "run", max_steps=2, lr=1e-2)
    run = rlhf_trainer(args, LoraArguments(lora=True), reward=even_share)
    run.trainer.train()
    assert run.trainer.ref_model is None and isinstance(run.trainer.model, PeftModel)
    kls = [entry["kl"] for entry in run.trainer.state.log_history if "kl" in entry]
    assert kls[0] == 0.0


def test_lora_refuses_elmo_and_a_model_it_has_no_layers_for() -> None:
    class Config:
        model_type = "egbert-elmo"

    with pytest.raises(ConfigError, match="nn.LSTM, which PEFT does not adapt"):
        lora_config(LoraArguments(lora=True), Config(), "SEQ_CLS")
    Config.model_type = "llama"
    with pytest.raises(ConfigError, match="name them with --lora-target-modules"):
        lora_config(LoraArguments(lora=True), Config(), "CAUSAL_LM")
    named = lora_config(
        LoraArguments(lora=True, lora_target_modules=["q_proj"]), Config(), "CAUSAL_LM"
    )
    assert named.target_modules == {"q_proj"}
    assert lora_config(LoraArguments(), Config(), "CAUSAL_LM") is None
    with pytest.raises(ConfigError, match=r"^--lora-rank must be >= 1, got 0$"):
        LoraArguments(lora=True, lora_rank=0)
    with pytest.raises(ConfigError, match=r"^--lora-dropout must be in \[0, 1\), got 1.0$"):
        LoraArguments(lora=True, lora_dropout=1.0)
    LoraArguments(lora=True, lora_rank=1, lora_dropout=0.0)  # the bounds themselves are allowed


def test_the_plots_moving_mean_averages_a_twentieth_of_the_steps() -> None:
    """40 steps: a window of 2, so each point is the mean of its step and the one before (the
    first its own); 10 steps: a window of 1, the values themselves."""
    assert moving_mean(list(range(40))).tolist() == [0.0] + [i - 0.5 for i in range(1, 40)]
    assert moving_mean([3.0, 1.0, 2.0]).tolist() == [3.0, 1.0, 2.0]
