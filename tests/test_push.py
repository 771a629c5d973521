"""`egbert push`: which files of a model folder or run directory would go to the Hub, the
one-line refusals of folders that are not a model, and the one-line failure when the Hub cannot
be reached (offline mode, or no network), before anything is uploaded. Nothing here contacts
the Hub."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
import yaml
from huggingface_hub import HfApi, constants
from option_coverage import proves

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


@proves("push", "--repo-id", "--folder", "--dry-run")
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
    assert out.splitlines()[0].endswith(f"from {run_dir / 'model'} to {REPO_ID}:")
    for leftover in ("checkpoints", "optimizer.bin", "metrics.jsonl", "loss.png"):
        assert leftover not in out


@proves("push", "--config", "--print-config")
def test_the_options_come_back_from_the_printed_config(run_dir: Path, tmp_path, capsys) -> None:
    argv = ["push", "--repo-id", REPO_ID, "--folder", str(run_dir), "--dry-run"]
    with pytest.raises(SystemExit) as exit_info:
        cli([*argv, "--private", "--print-config"])
    printed = capsys.readouterr().out
    assert exit_info.value.code == 0 and yaml.safe_load(printed) == {
        "repo_id": REPO_ID, "folder": str(run_dir), "private": True, "revision": None,
        "commit_message": None, "dry_run": True,
    }  # fmt: skip
    (tmp_path / "push.yaml").write_text(printed, encoding="utf-8")
    cli(["push", "--config", str(tmp_path / "push.yaml")])
    assert capsys.readouterr().out.startswith(f"would upload {len(expected_files(run_dir))} ")


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


class HubRoot(BaseHTTPRequestHandler):
    """The Hub's front page, as the reachability check asks for it (HEAD: 200)."""

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def local_hub(monkeypatch) -> list[tuple[str, dict]]:
    """A Hub that answers at a local address and records what is asked of it: the reachability
    check is egbert's own, against a local HTTP server; the token check and the three calls an
    upload makes (huggingface_hub's HfApi methods; the real Hub is out of reach here) are
    recorded with their arguments."""
    server = HTTPServer(("127.0.0.1", 0), HubRoot)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    calls: list[tuple[str, dict]] = []

    def recorder(name: str):
        def record(self, *args, **kwargs):
            calls.append((name, {"args": args, **kwargs}))
            return {"name": "someone"}

        return record

    for name in ("whoami", "create_repo", "create_branch", "upload_folder"):
        monkeypatch.setattr(HfApi, name, recorder(name))
    yield calls
    server.shutdown()


@proves("push", "--private", "--revision", "--commit-message")
def test_an_upload_asks_the_hub_for_the_repository_branch_and_commit_given(
    run_dir: Path, local_hub: list, capsys
) -> None:
    argv = ["push", "--repo-id", REPO_ID, "--folder", str(run_dir), "--private"]
    cli([*argv, "--revision", "dev", "--commit-message", "tiny gpt, first try"])
    calls = dict(local_hub)
    assert [name for name, _ in local_hub] == [
        "whoami",
        "create_repo",
        "create_branch",
        "upload_folder",
    ]
    repo, branch = calls["create_repo"], calls["create_branch"]
    assert repo["args"] == (REPO_ID,) and repo["private"] is True
    assert branch["args"] == (REPO_ID,) and branch["branch"] == "dev"
    upload = calls["upload_folder"]
    assert upload["repo_id"] == REPO_ID and upload["revision"] == "dev"
    assert upload["commit_message"] == "tiny gpt, first try"
    assert Path(upload["folder_path"]) == run_dir / "model"
    assert sorted(upload["allow_patterns"]) == expected_files(run_dir)
    assert capsys.readouterr().out.startswith("uploaded ")

    local_hub.clear()  # the defaults: public, main, egbert's own message
    cli(["push", "--repo-id", REPO_ID, "--folder", str(run_dir)])
    calls = dict(local_hub)
    assert "create_branch" not in calls and calls["create_repo"]["private"] is False
    assert calls["upload_folder"]["revision"] is None
    assert calls["upload_folder"]["commit_message"] == "Upload model with egbert push"
