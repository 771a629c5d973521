"""`egbert generate`: streams a gpt model's continuation; refuses models that cannot generate.

The sampling options are checked on a model whose next-token distribution is fixed and known
(the same at every position): what --top-k, --top-p and --temperature leave of it is computed
here from their definitions, and the tokens drawn must come from that."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from model_calls import model_calls
from option_coverage import proves
from transformers import AutoTokenizer

from egbert.cli import main as cli
from egbert.errors import ConfigError
from egbert.generate import check_room, generate_text
from egbert.models.bert import EgbertBertConfig, EgbertBertModel
from egbert.models.gpt import EgbertGPTConfig, EgbertGPTForCausalLM

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def gpt_dir(tiny_gpt2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny egbert gpt model with the GPT-2 tokenizer beside it."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_gpt2_dir)
    config = EgbertGPTConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("gpt")
    EgbertGPTForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


# The fixed distribution: four words with these probabilities, the rest of the vocabulary
# sharing what is left evenly, end-of-text never drawn.
WORDS = {" cat": 0.2, " dog": 0.15, " bird": 0.1, " fish": 0.05}


@pytest.fixture(scope="module")
def fixed_dir(tiny_gpt2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-layer gpt whose logits are log(WORDS) at every position, whatever the input: its
    final LayerNorm outputs the unit vector e0 (weight 0, bias e0), and column 0 of the tied
    output embedding holds the logits."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_gpt2_dir)
    config = EgbertGPTConfig(
        vocab_size=len(tokenizer), hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=16, max_position_embeddings=256, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    model = EgbertGPTForCausalLM(config)
    with torch.no_grad():
        model.gpt.final_norm.weight.zero_()
        model.gpt.final_norm.bias.zero_()
        model.gpt.final_norm.bias[0] = 1.0
        model.lm_head.weight[:, 0] = fixed_logits(tokenizer)
    path = tmp_path_factory.mktemp("fixed-gpt")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def word_ids(tokenizer) -> dict[str, int]:
    ids = {word: tokenizer.encode(word) for word in WORDS}
    assert all(len(token) == 1 for token in ids.values()), ids  # one token each
    return {word: token[0] for word, token in ids.items()}


def fixed_logits(tokenizer) -> torch.Tensor:
    rest = 1.0 - sum(WORDS.values())
    probabilities = torch.full((len(tokenizer),), rest / (len(tokenizer) - len(WORDS) - 1))
    for word, token in word_ids(tokenizer).items():
        probabilities[token] = WORDS[word]
    logits = probabilities.log()
    logits[tokenizer.eos_token_id] = -1e4
    return logits


def drawn(capsys, model: Path, *options: str) -> list[str]:
    """The words `egbert generate` draws after a prompt, with OPTIONS."""
    out = run_cli(capsys, "--model", str(model), "--prompt", "Pets:", *options)
    return [f" {word}" for word in out.split()]


def run_cli(capsys: pytest.CaptureFixture, *args: str) -> str:
    capsys.readouterr()
    cli(["generate", *args])
    return capsys.readouterr().out


@pytest.mark.parametrize(
    "option, message",
    [
        (dict(prompt="bad \udcff byte"), "--prompt holds bytes that are not valid text"),
        (dict(max_new_tokens=0), "--max-new-tokens must be at least 1, got 0"),
        (dict(temperature=-1.0), "--temperature must be >= 0 (0 = greedy), got -1.0"),
        (dict(top_k=0), "--top-k must be at least 1, got 0"),
        (dict(top_p=1.5), "--top-p must be in (0, 1], got 1.5"),
    ],
)
def test_the_python_api_refuses_the_options_the_command_refuses(
    gpt_dir: Path, option: dict, message: str
) -> None:
    """generate_text checks each option itself, before loading the model."""
    arguments = dict(prompt=PROMPT, max_new_tokens=4, temperature=1.0, top_k=5, top_p=0.9)
    with pytest.raises(ConfigError, match=re.escape(message)):
        generate_text(gpt_dir, **{**arguments, **option})


@proves("generate", "--model", "--prompt", "--max-new-tokens")
def test_cli_streams_the_greedy_continuation(gpt_dir: Path, capsys) -> None:
    out = run_cli(capsys, "--model", str(gpt_dir), "--prompt", PROMPT, "--max-new-tokens", "8")
    tokenizer = AutoTokenizer.from_pretrained(gpt_dir)
    model = EgbertGPTForCausalLM.from_pretrained(gpt_dir).eval()
    ids = tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    expected = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8)
    continuation = tokenizer.decode(expected[0, ids.shape[1] :], skip_special_tokens=True)
    assert continuation.strip()
    assert out.strip() == continuation.strip()
    assert PROMPT not in out  # only the continuation is printed


@proves("generate", "--bf16", "--fp16")
def test_cli_generates_under_the_autocast_given(gpt_dir: Path, capsys) -> None:
    """Every forward of the generation under bf16 (fp16) autocast, and the text that of the
    model's own generate under torch.autocast by hand."""
    tokenizer = AutoTokenizer.from_pretrained(gpt_dir)
    model = EgbertGPTForCausalLM.from_pretrained(gpt_dir).eval()
    ids = tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    for flag, dtype in (("--bf16", torch.bfloat16), ("--fp16", torch.float16)):
        with model_calls() as calls:
            out = run_cli(capsys, "--model", str(gpt_dir), "--prompt", PROMPT, "--max-new-tokens",
                          "3", flag)  # fmt: skip
        assert len(calls) == 3 and {call.dtype for call in calls} == {dtype}
        with torch.autocast("cpu", dtype=dtype):
            expected = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3)
        continuation = tokenizer.decode(expected[0, ids.shape[1] :], skip_special_tokens=True)
        assert out.strip() == continuation.strip()
    with model_calls() as calls:
        run_cli(capsys, "--model", str(gpt_dir), "--prompt", PROMPT, "--max-new-tokens", "2")
    assert {call.autocast for call in calls} == {False}


@proves("generate", "--seed")
def test_sampling_with_a_seed_is_reproducible(gpt_dir: Path, capsys) -> None:
    """The seed is torch's: transformers' own sampling after torch.manual_seed(3) draws the
    same tokens."""
    args = ["--model", str(gpt_dir), "--prompt", PROMPT, "--max-new-tokens", "12"]
    sampling = ["--temperature", "1.5", "--top-k", "50", "--top-p", "0.95"]
    first = run_cli(capsys, *args, *sampling, "--seed", "3")
    second = run_cli(capsys, *args, *sampling, "--seed", "3")
    other = run_cli(capsys, *args, *sampling, "--seed", "4")
    assert first == second
    assert first != other
    tokenizer = AutoTokenizer.from_pretrained(gpt_dir)
    # on the device the command samples on (the GPU where there is one): its random stream
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = EgbertGPTForCausalLM.from_pretrained(gpt_dir).to(device).eval()
    ids = tokenizer(PROMPT, return_tensors="pt")["input_ids"].to(device)
    torch.manual_seed(3)
    expected = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=True,
        temperature=1.5, top_k=50, top_p=0.95, pad_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    continuation = tokenizer.decode(expected[0, ids.shape[1] :], skip_special_tokens=True)
    assert first.strip() == continuation.strip()
    greedy = generate_text(gpt_dir, PROMPT, max_new_tokens=12, stream=False)
    assert generate_text(gpt_dir, PROMPT, max_new_tokens=12, temperature=0, stream=False) == greedy


def test_a_bert_directory_gets_a_clear_error(tmp_path: Path) -> None:
    config = EgbertBertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2
    )
    EgbertBertModel(config).save_pretrained(tmp_path)
    with pytest.raises(SystemExit, match="needs a gpt model"):
        cli(["generate", "--model", str(tmp_path), "--prompt", "hello"])


def test_a_prompt_longer_than_the_positions_is_refused(gpt_dir: Path) -> None:
    with pytest.raises(ConfigError, match="max-new-tokens"):
        generate_text(gpt_dir, PROMPT, max_new_tokens=64, stream=False)


@pytest.mark.parametrize(
    "option", [["--max-new-tokens", "0"], ["--top-p", "1.5"], ["--temperature", "-1"]]
)
def test_invalid_options_are_refused(gpt_dir: Path, option: list[str]) -> None:
    with pytest.raises(SystemExit, match=option[0]):
        cli(["generate", "--model", str(gpt_dir), "--prompt", PROMPT, *option])


@proves("generate", "--top-k")
def test_top_k_draws_only_the_k_likeliest_tokens(fixed_dir: Path, capsys) -> None:
    words = drawn(capsys, fixed_dir, "--temperature", "1", "--top-k", "2", "--max-new-tokens", "40")
    assert len(words) == 40 and set(words) == {" cat", " dog"}


@proves("generate", "--top-p")
def test_top_p_draws_from_the_smallest_set_with_that_mass(fixed_dir: Path, capsys) -> None:
    """Mass 0.4: cat and dog hold 0.35, so bird (0.1) is in the nucleus and fish is not."""
    ranked = sorted(WORDS, key=WORDS.get, reverse=True)
    mass = [sum(WORDS[word] for word in ranked[: n + 1]) for n in range(len(ranked))]
    nucleus = set(ranked[: next(n for n, total in enumerate(mass) if total >= 0.4) + 1])
    assert nucleus == {" cat", " dog", " bird"}
    options = ["--temperature", "1", "--top-p", "0.4", "--max-new-tokens", "40", "--seed", "1"]
    words = drawn(capsys, fixed_dir, *options)
    assert len(words) == 40 and set(words) == nucleus


@proves("generate", "--temperature")
def test_temperature_sharpens_the_distribution_as_softmax_of_logits_over_t(
    fixed_dir: Path, capsys
) -> None:
    """At T = 0.25 the probabilities are softmax(logits / T): cat's share of 100 draws is
    binomial around it, where T = 1 would give cat 0.2 and the rest of the vocabulary half."""
    tokenizer = AutoTokenizer.from_pretrained(fixed_dir)
    probabilities = (fixed_logits(tokenizer).double() / 0.25).softmax(-1)
    ids = word_ids(tokenizer)
    cat = probabilities[ids[" cat"]].item()
    assert probabilities[list(ids.values())].sum() > 1 - 1e-9  # four words hold it all
    options = ["--temperature", "0.25", "--max-new-tokens", "100", "--seed", "0"]
    words = drawn(capsys, fixed_dir, *options)
    assert len(words) == 100 and set(words) <= set(WORDS)
    spread = 4.5 * (100 * cat * (1 - cat)) ** 0.5
    assert abs(words.count(" cat") - 100 * cat) < spread, (words.count(" cat"), 100 * cat)


def test_a_prompt_and_its_continuation_must_fit_the_position_table():
    """4 prompt tokens and 60 new fill a table of 64 exactly; 5 and 60 are refused in one line."""
    check_room(4, 60, 64)
    with pytest.raises(ConfigError) as refused:
        check_room(5, 60, 64)
    assert str(refused.value) == (
        "prompt (5 tokens) + --max-new-tokens (60) exceeds the model's 64 positions; "
        "shorten one of them"
    )
