"""`egbert generate`: streams a gpt model's continuation; refuses models that cannot generate."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from egbert.cli import main as cli
from egbert.errors import ConfigError
from egbert.generate import generate
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


def run_cli(capsys: pytest.CaptureFixture, *args: str) -> str:
    capsys.readouterr()
    cli(["generate", *args])
    return capsys.readouterr().out


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


def test_sampling_with_a_seed_is_reproducible(gpt_dir: Path, capsys) -> None:
    args = ["--model", str(gpt_dir), "--prompt", PROMPT, "--max-new-tokens", "12"]
    sampling = ["--temperature", "1.5", "--top-k", "50", "--top-p", "0.95"]
    first = run_cli(capsys, *args, *sampling, "--seed", "3")
    second = run_cli(capsys, *args, *sampling, "--seed", "3")
    other = run_cli(capsys, *args, *sampling, "--seed", "4")
    assert first == second
    assert first != other
    greedy = generate(gpt_dir, PROMPT, max_new_tokens=12, stream=False)
    assert generate(gpt_dir, PROMPT, max_new_tokens=12, temperature=0, stream=False) == greedy


def test_a_bert_directory_gets_a_clear_error(tmp_path: Path) -> None:
    config = EgbertBertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2
    )
    EgbertBertModel(config).save_pretrained(tmp_path)
    with pytest.raises(SystemExit, match="needs a gpt model"):
        cli(["generate", "--model", str(tmp_path), "--prompt", "hello"])


def test_a_prompt_longer_than_the_positions_is_refused(gpt_dir: Path) -> None:
    with pytest.raises(ConfigError, match="max-new-tokens"):
        generate(gpt_dir, PROMPT, max_new_tokens=64, stream=False)


@pytest.mark.parametrize(
    "option", [["--max-new-tokens", "0"], ["--top-p", "1.5"], ["--temperature", "-1"]]
)
def test_invalid_options_are_refused(gpt_dir: Path, option: list[str]) -> None:
    with pytest.raises(SystemExit, match=option[0]):
        cli(["generate", "--model", str(gpt_dir), "--prompt", PROMPT, *option])
