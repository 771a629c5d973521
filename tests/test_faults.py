"""Faults a long run must survive, on the real `egbert pretrain` and `egbert finetune` commands:
SIGKILL at random moments (one of them while a checkpoint is being written), SIGTERM and SIGINT,
and a full disk. After each, `--resume` goes on, and the final model equals that of a run never
interrupted (fp32 CPU, one thread, within 1e-6). The kill harness is scripts/chaos.py's, which
runs the same with many more kills."""

from __future__ import annotations

import errno
import functools
import importlib.util
import json
import random
import signal
import sys
from pathlib import Path

import accelerate.checkpointing
import pytest
import transformers.modeling_utils
import warm_python as warm
from conftest import fresh_accelerate
from safetensors.torch import load_file

from egbert.cli import main as cli_main
from egbert.models.bert import EgbertBertConfig, EgbertBertModel
from egbert.tokenizer import load_tokenizer

REPO = Path(__file__).resolve().parents[1]
# scripts/ is no package: load the harness from its file (registered first: dataclasses need it)
_spec = importlib.util.spec_from_file_location("egbert_chaos", REPO / "scripts" / "chaos.py")
chaos = sys.modules["egbert_chaos"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(chaos)
# every run killed here goes through the warm interpreter: wait() returns once its command ended
interrupt = functools.partial(chaos.interrupt, popen=warm.Popen)

PRETRAIN_STEPS, FINETUNE_EPOCHS, SAVE_EVERY = 30, 4, 3
SIGNAL_EXIT_SECONDS = 10.0  # "within seconds": a tiny step and a checkpoint, on a busy machine

pytestmark = pytest.mark.usefixtures("one_thread_and_fresh_accelerate")


@pytest.fixture(scope="module")
def corpus(wikitext_slice: Path, tmp_path_factory) -> Path:
    """30 lines of WikiText: about 18 batches of 8 x 32 tokens, so 30 steps cross an epoch."""
    lines = wikitext_slice.read_text(encoding="utf-8").splitlines(keepends=True)[:30]
    path = tmp_path_factory.mktemp("faults") / "corpus.tokens"
    path.write_text("".join(lines), encoding="utf-8")
    return path


def pretrain_argv(tokenizer: Path, corpus: Path, out: Path) -> list[str]:
    return chaos.pretrain_argv("gpt", tokenizer, corpus, out, PRETRAIN_STEPS, SAVE_EVERY, 5)


@pytest.fixture(scope="module")
def clean_pretrain(tiny_tokenizer_dir, corpus, tmp_path_factory) -> Path:
    """The uninterrupted run, in this process (same numerics as the subprocesses: one thread)."""
    import torch

    out = tmp_path_factory.mktemp("clean-pretrain")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cli_main(["pretrain", *pretrain_argv(tiny_tokenizer_dir, corpus, out)])
    finally:
        torch.set_num_threads(threads)
        fresh_accelerate()
    return out


def train_losses(out: Path) -> list[float]:
    records = map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
    return [record["loss"] for record in records if record["split"] == "train"]


def assert_same_final_model(clean: Path, resumed: Path, weights="model/model.safetensors") -> None:
    difference = chaos.max_weight_difference(clean / weights, resumed / weights)
    assert difference <= 1e-6, difference


def interrupt_until_mid_save(command, out: Path, logs: Path, rng: random.Random) -> None:
    """SIGKILL as soon as a checkpoint is being written (again if the write won the race)."""
    for attempt in range(3):
        kill = interrupt(command, out, logs / f"save-{attempt}.log", rng, "save")
        assert kill is not None and kill.returncode == -signal.SIGKILL, kill
        if kill.mid_save:
            return
    pytest.fail("three kills never caught a checkpoint being written")


@pytest.mark.slow
def test_pretrain_survives_kills_and_signals(
    clean_pretrain, tiny_tokenizer_dir, corpus, tmp_path, warm_python
):
    """SIGKILL at a random step, SIGKILL mid-save, SIGTERM (the half-written checkpoint cleaned
    up, a checkpoint, exit 0), SIGINT twice (exit at once); resumed after each, it ends where
    the clean run ends."""
    out, logs, rng = tmp_path / "run", tmp_path / "logs", random.Random(8)
    logs.mkdir()
    argv = pretrain_argv(tiny_tokenizer_dir, corpus, out)
    command = chaos.egbert_command("pretrain", argv, warm_python(chaos.child_env()))

    kill = interrupt(command, out, logs / "kill-1.log", rng, "step")
    assert kill is not None and kill.returncode == -signal.SIGKILL
    interrupt_until_mid_save(command, out, logs, rng)
    assert list((out / "checkpoints").glob(".tmp-step-*")), "the half-written checkpoint"

    log = logs / "sigterm.log"
    term = interrupt(command, out, log, rng, "step", signals=(signal.SIGTERM,))
    assert term is not None and term.returncode == 0, chaos.tail(log)
    assert not list((out / "checkpoints").glob(".tmp-*")), "a half-written checkpoint was left"
    assert term.exit_seconds < SIGNAL_EXIT_SECONDS, term
    assert term.checkpoint == term.step  # the checkpoint is of the step it stopped at
    assert f"stopped at step {term.step}; checkpoint saved" in log.read_text()
    assert not (out / "model").exists()  # a checkpoint, not a final model

    log = logs / "sigint-twice.log"
    twice = interrupt(command, out, log, rng, "step", signals=(signal.SIGINT,) * 2)
    assert twice is not None and twice.returncode == 128 + signal.SIGINT, chaos.tail(log)
    assert twice.exit_seconds < 3.0, twice  # the second signal: at once
    assert "second signal, exiting now" in log.read_text()

    chaos.run_to_the_end(command, logs / "final.log")
    assert "resumed from" in (logs / "final.log").read_text()
    assert_same_final_model(clean_pretrain, out)
    assert train_losses(out) == pytest.approx(train_losses(clean_pretrain), abs=1e-6)
    assert len(train_losses(out)) == PRETRAIN_STEPS
    final = json.loads((out / f"checkpoints/step-{PRETRAIN_STEPS}/trainer_state.json").read_text())
    assert final["epoch"] >= 1  # the run crossed an epoch boundary on the way


# ---------------------------------------------------------------- finetune


@pytest.fixture(scope="module")
def finetune_inputs(tiny_tokenizer_dir, data_dir, tmp_path_factory) -> dict[str, Path]:
    """A tiny random BERT with the tiny tokenizer, and RTE cut to 32 train / 16 dev rows."""
    import torch

    root = tmp_path_factory.mktemp("finetune-faults")
    tokenizer = load_tokenizer(tiny_tokenizer_dir)
    config = EgbertBertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    EgbertBertModel(config).save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    glue = chaos.glue_slice(data_dir / "glue" / "RTE", root / "glue", rows=(32, 16))
    return {"model": root / "model", "glue": glue}


def finetune_argv(inputs: dict[str, Path], out: Path) -> list[str]:
    return chaos.finetune_argv(inputs["model"], inputs["glue"], out, FINETUNE_EPOCHS, 2, 5)


@pytest.mark.slow
def test_finetune_survives_kills_and_sigint(finetune_inputs, tmp_path, warm_python):
    """SIGKILL mid-save and SIGINT (checkpoint, exit 0), then resume: the best model and the dev
    scores equal the uninterrupted run's (a SIGKILL at a random step: pretrain's test, above)."""
    # The uninterrupted run as a process of its own, like the interrupted ones (in this
    # process its weights ended 1.4e-3 from theirs after 16 steps)
    clean, python = tmp_path / "clean", warm_python(chaos.child_env())
    command = chaos.egbert_command("finetune", finetune_argv(finetune_inputs, clean), python)
    chaos.run_to_the_end(command, tmp_path / "clean.log")

    out, logs, rng = tmp_path / "run", tmp_path / "logs", random.Random(3)
    logs.mkdir()
    command = chaos.egbert_command("finetune", finetune_argv(finetune_inputs, out), python)
    interrupt_until_mid_save(command, out, logs, rng)
    log = logs / "sigint.log"
    stop = interrupt(command, out, log, rng, "step", signals=(signal.SIGINT,), steps_ahead=3)
    assert stop is not None and stop.returncode == 0, chaos.tail(log)
    assert stop.exit_seconds < SIGNAL_EXIT_SECONDS and stop.checkpoint == stop.step, stop
    assert not (out / "eval_results.json").exists()

    chaos.run_to_the_end(command, logs / "final.log")
    assert_same_final_model(clean, out)  # the best epoch's model
    last = f"checkpoints/step-{FINETUNE_EPOCHS * 4}"  # 32 rows, batch 8: 4 steps per epoch
    assert_same_final_model(clean / last, out / last, "model.safetensors")  # the last step's
    clean_results = json.loads((clean / "eval_results.json").read_text())
    results = json.loads((out / "eval_results.json").read_text())
    assert results["history"] == clean_results["history"]  # every epoch, across the restarts
    assert len(results["history"]) == FINETUNE_EPOCHS


# ---------------------------------------------------------------- disk full


def disk_full(path) -> OSError:
    return OSError(errno.ENOSPC, "No space left on device", str(path))


def test_disk_full_is_one_line_and_keeps_the_last_checkpoint(
    clean_pretrain, tiny_tokenizer_dir, corpus, tmp_path, monkeypatch, capsys
):
    """The disk fills while checkpoint step-6 is written, then while the final model is:
    one-line errors, step-3 (then the final checkpoint) intact, and --resume ends equal."""
    out = tmp_path / "run"
    argv = ["pretrain", *pretrain_argv(tiny_tokenizer_dir, corpus, out)]
    real_save = accelerate.checkpointing.save

    def save_until_step_6(obj, path, *args, **kwargs):
        if ".tmp-step-6" in str(path):
            Path(path).write_bytes(b"half a file")
            raise disk_full(path)
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(accelerate.checkpointing, "save", save_until_step_6)
    with pytest.raises(SystemExit) as stopped:
        cli_main(argv)
    message = str(stopped.value.code)
    assert message.startswith("egbert pretrain: error: could not write checkpoint"), message
    assert "disk full" in message and "step-3 is intact" in message and "\n" not in message
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-3"]
    assert load_file(out / "checkpoints/step-3/model.safetensors")
    monkeypatch.undo()
    fresh_accelerate()

    def no_space(state_dict, filename, *args, **kwargs):
        raise disk_full(filename)

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", no_space)
    with pytest.raises(SystemExit) as stopped:
        cli_main(argv)
    message = str(stopped.value.code)
    assert message.startswith("egbert pretrain: error: could not write"), message
    assert "disk full" in message and "--resume" in message and "\n" not in message
    assert not (out / "model").exists()
    assert not list(out.glob(".tmp-*")), "a half-written final model left behind"
    assert (out / f"checkpoints/step-{PRETRAIN_STEPS}/trainer_state.json").is_file()
    monkeypatch.undo()
    fresh_accelerate()

    cli_main(argv)
    assert_same_final_model(clean_pretrain, out)
    assert "Traceback" not in capsys.readouterr().err
