"""`egbert push`: which files of a model folder or run directory would go to the Hub, the
one-line refusals of folders that are not a model, and the one-line failure when the Hub cannot
be reached (offline mode, or no network), before anything is uploaded. Nothing here contacts
the Hub."""

from __future__ import annotations

from pathlib import Path

import pytest
from huggingface_hub import constants

from egbert.cli import main as cli
from egbert.errors import ConfigError
from egbert.models.gpt import EgbertGPTConfig, EgbertGPTForCausalLM
from egbert.push import push_to_hub
from egbert.tokenizer import load_tokenizer, tokenizer_for_model

REPO_ID = "someone/tiny-gpt"
NOT_FOR_THE_HUB = "loss.png"  # a run's plot: no file a model repository needs


def save_model(tokenizer_dir: Path, out: Path) -> Path:
    tokenizer = load_tokenizer(tokenizer_dir)
    config = EgbertGPTConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model = EgbertGPTForCausalLM(config)
    model.save_pretrained(out)
    tokenizer_for_model(tokenizer, config).save_pretrained(out)
    (out / "README.md").write_text("# tiny gpt\n", encoding="utf-8")
    (out / "modeling_egbert_gpt.py").write_text("# for trust_remote_code\n", encoding="utf-8")
    return out


@pytest.fixture
def run_dir(tiny_tokenizer_dir: Path, tmp_path: Path) -> Path:
    """A run directory as the trainer writes it: the model in model/, training state beside it."""
    run = tmp_path / "run"
    save_model(tiny_tokenizer_dir, run / "model")
    (run / "model" / NOT_FOR_THE_HUB).write_bytes(b"\x89PNG")
    (run / "checkpoints" / "step-1").mkdir(parents=True)
    (run / "checkpoints" / "step-1" / "optimizer.bin").write_bytes(b"0" * 64)
    (run / "metrics.jsonl").write_text("{}\n", encoding="utf-8")
    return run


def expected_files(run: Path) -> list[str]:
    """Every file save_pretrained and the test wrote into model/, but the loss plot."""
    return sorted(path.name for path in (run / "model").iterdir() if path.name != NOT_FOR_THE_HUB)


def test_dry_run_lists_the_model_files_of_a_run_directory(run_dir: Path, capsys) -> None:
    plan = push_to_hub(run_dir, REPO_ID, dry_run=True)
    assert plan.folder == run_dir / "model"
    assert sorted(plan.files) == expected_files(run_dir)
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md"} <= set(plan.files)

    cli(["push", "--repo-id", REPO_ID, "--folder", str(run_dir), "--dry-run"])
    out = capsys.readouterr().out
    listed = [line.split()[0] for line in out.splitlines()[1:]]
    assert listed == expected_files(run_dir)
    assert out.startswith(f"would upload {len(listed)} files")
    for leftover in ("checkpoints", "optimizer.bin", "metrics.jsonl", "loss.png"):
        assert leftover not in out


def test_a_model_folder_with_training_leftovers_is_refused(run_dir: Path) -> None:
    old_layout = run_dir / "model"  # the model files with the checkpoints beside them
    (old_layout / "checkpoints").mkdir()
    (old_layout / "optimizer.bin").write_bytes(b"0")
    with pytest.raises(SystemExit) as exit_info:
        cli(["push", "--repo-id", REPO_ID, "--folder", str(old_layout), "--dry-run"])
    message = str(exit_info.value)
    assert "training leftovers (checkpoints/, optimizer.bin)" in message
    assert "\n" not in message


def test_a_folder_without_a_model_is_refused(tiny_tokenizer_dir: Path) -> None:
    with pytest.raises(SystemExit, match="is not a model folder"):
        cli(["push", "--repo-id", REPO_ID, "--folder", str(tiny_tokenizer_dir), "--dry-run"])


def test_a_repo_id_without_an_owner_is_refused(run_dir: Path) -> None:
    with pytest.raises(ConfigError, match="USER/NAME"):
        push_to_hub(run_dir, "tiny-gpt", dry_run=True)


def test_offline_mode_fails_in_one_line_before_any_upload(run_dir: Path, monkeypatch) -> None:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(SystemExit) as exit_info:
        cli(["push", "--repo-id", REPO_ID, "--folder", str(run_dir)])
    message = str(exit_info.value)
    assert message.startswith("egbert push: error: HF_HUB_OFFLINE is set")
    assert "\n" not in message


def test_an_unreachable_hub_fails_in_one_line(run_dir: Path, monkeypatch) -> None:
    """No network: the Hub's address refuses connections (a closed local port stands in)."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(SystemExit) as exit_info:
        cli(
            ["push", "--repo-id", REPO_ID, "--folder", str(run_dir), "--revision", "dev"]
            + ["--commit-message", "tiny gpt"]
        )
    message = str(exit_info.value)
    assert "cannot reach the Hub at http://127.0.0.1:9" in message
    assert "\n" not in message
