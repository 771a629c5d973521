"""Streamed pretraining through the trainer: each family for --max-steps and --budget-minutes,
each process's own shards (under torchrun: tests/test_torchrun.py), resume from the stream's saved
state (bit-identical without a shuffle buffer), and the options a stream refuses."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
import torch
from conftest import kill_once
from safetensors.torch import load_file

import egbert
from egbert import sources
from egbert.cli import main as cli_main
from egbert.errors import ConfigError
from egbert.training.batches import split_stream

pytestmark = pytest.mark.usefixtures("one_thread_and_fresh_accelerate")


@pytest.fixture(autouse=True)
def private_datasets_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")


@pytest.fixture(scope="module")
def short_corpus(wikitext_slice: Path, tmp_path_factory) -> Path:
    """12 lines of WikiText-2: a stream that ends (and restarts) within a few steps (90 bert
    pairs and 57 gpt blocks of 32 tokens)."""
    lines = wikitext_slice.read_text(encoding="utf-8").splitlines(keepends=True)
    path = tmp_path_factory.mktemp("stream") / "short.tokens"
    path.write_text("".join(lines[:12]), encoding="utf-8")
    return path


def streaming_options(family: str, tokenizer: Path, train: Path, out: Path) -> dict:
    return {
        "model": family,
        "tokenizer": str(tokenizer),
        "train_files": [str(train)],
        "doc_boundary": "wikitext",
        "output_dir": str(out),
        "seq_len": 32,
        "batch_size": 4,
        "streaming": True,
        "seed": 3,
        "use_cpu": True,  # a few fixed steps, the same on any machine
    }


@pytest.mark.parametrize("family", ["bert", "gpt", "elmo"])
@pytest.mark.parametrize("length", [{"max_steps": 3}, {"budget_minutes": 0.03}])
def test_each_family_pretrains_from_a_stream(
    family, length, wikitext_slice, tiny_tokenizer_dir, tmp_path
):
    options = streaming_options(family, tiny_tokenizer_dir, wikitext_slice, tmp_path / "run")
    result = egbert.run_pretraining(**options, **length, validation_files=[str(wikitext_slice)],
                                    max_eval_samples=8, shuffle_buffer=50)  # fmt: skip
    if "max_steps" in length:
        assert result.step == 3
    else:  # the budget ends the stream's run, and the schedule reaches 0 there
        assert result.elapsed_seconds >= length["budget_minutes"] * 60 and result.step >= 1
        checkpoint = tmp_path / "run" / "checkpoints" / f"step-{result.step}"
        assert torch.load(checkpoint / "scheduler.bin", weights_only=True)["_last_lr"] == [0.0, 0.0]
    assert result.model_dir is not None and (result.model_dir / "model.safetensors").is_file()
    assert result.metrics  # evaluated on the first 8 streamed validation examples


def test_a_stream_needs_a_run_length_and_refuses_what_it_cannot_do(
    wikitext_slice, tiny_tokenizer_dir, tmp_path
):
    options = streaming_options("bert", tiny_tokenizer_dir, wikitext_slice, tmp_path / "run")
    refusals = [
        ({}, "streaming training data has no length; give --max-steps"),
        ({"max_steps": 2, "dupe_factor": 2}, "--dupe-factor makes static-masked copies"),
        ({"max_steps": 2, "num_proc": 2}, "--num-proc tokenizes a cached data set"),
        ({"max_steps": 2, "num_workers": 1}, "--num-workers 1 with a stream"),
        ({"max_steps": 2, "group_by_length": True}, "--group-by-length needs map-style data"),
        ({"max_steps": 2, "streaming": False, "shuffle_buffer": 10}, "use it with --streaming"),
    ]
    for extra, message in refusals:
        with pytest.raises(ConfigError, match=message) as error:
            egbert.run_pretraining(**{**options, **extra})
        assert "\n" not in str(error.value)


# ---------------------------------------------------------------- each process its own shards


def test_two_processes_read_disjoint_shards_and_together_every_example_once(tmp_path: Path):
    documents = [f"document {i} ." for i in range(101)]
    files = []
    for index in range(4):
        files.append(tmp_path / f"part{index}.txt")
        files[-1].write_text("\n".join(documents[index::4]) + "\n", encoding="utf-8")
    by_files = sources.read_documents(files, doc_boundary="line", streaming=True)
    one_file = tmp_path / "one.txt"
    one_file.write_text("\n".join(documents) + "\n", encoding="utf-8")
    by_ranges = sources.read_documents(
        [one_file], doc_boundary="line", streaming=True, shard_bytes=200
    )
    unsharded = sources.read_documents([one_file], doc_boundary="line", streaming=True)
    assert by_files.num_shards == 4 and by_ranges.num_shards >= 4 and unsharded.num_shards == 1
    for stream in (by_files, by_ranges, unsharded):
        seen = [[row["text"] for row in split_stream(stream, rank, 2)] for rank in (0, 1)]
        assert not set(seen[0]) & set(seen[1])
        assert sorted(seen[0] + seen[1]) == sorted(documents)
        assert abs(len(seen[0]) - len(seen[1])) <= 30  # shares, not one process reading all
    # whole shards: each file's documents go to one process, which reads no other file's
    three = sources.read_documents(files[:3], doc_boundary="line", streaming=True)
    # shard i to process i % 2, as split_dataset_by_node deals a number of shards it divides
    for stream, shards in ((by_files, [[0, 2], [1, 3]]), (three, [[0, 2], [1]])):
        for rank in (0, 1):
            part = split_stream(stream, rank, 2)
            assert part.num_shards == len(shards[rank])  # it reads only its own files
            texts = {row["text"] for row in part}
            assert texts == {text for shard in shards[rank] for text in documents[shard::4]}


# ---------------------------------------------------------------- resume


def test_a_resumed_stream_goes_on_where_it_stopped(wikitext_slice: Path):
    """No shuffle buffer: exactly the rest. With one, the buffer is lost on resume: some
    examples are skipped, none is seen twice."""
    for buffer in (None, 16):
        stream = sources.read_documents(
            [wikitext_slice] * 2, doc_boundary="line", streaming=True, shard_bytes=50_000
        )
        if buffer:
            stream = stream.shuffle(seed=0, buffer_size=buffer)
        everything = [row["text"] for row in stream]
        iterator = iter(stream)
        first = [next(iterator)["text"] for _ in range(500)]
        state = stream.state_dict()
        stream.load_state_dict(state)
        rest = [row["text"] for row in stream]
        if buffer is None:
            assert first + rest == everything
        else:
            assert len(everything) - buffer <= len(first) + len(rest) < len(everything)
            remaining = collections_difference(everything, first)
            lost = collections_difference(remaining, rest)  # raises if one came twice
            assert 0 < len(lost) <= buffer


def collections_difference(items: list[str], removed: list[str]) -> list[str]:
    """`items` minus `removed`, as multisets (raises if `removed` holds one too many)."""
    left = list(items)
    for item in removed:
        left.remove(item)
    return left


def _newest_step(out: Path) -> int:
    steps = [int(path.name.split("-")[1]) for path in (out / "checkpoints").glob("step-*")]
    return max(steps, default=0)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["bert", "gpt"])
def test_a_killed_streamed_run_resumes_to_the_clean_runs_weights(
    family, short_corpus, tiny_tokenizer_dir, tmp_path, subprocess_env, warm_python, capsys
):
    """SIGKILL after a checkpoint in the stream's second pass, then resume: the final weights
    equal an uninterrupted run's (fp32 CPU; bert's NSP pairs and masks included)."""
    argv = [
        "--model", family, "--tokenizer", str(tiny_tokenizer_dir), "--doc-boundary", "wikitext",
        "--train-files", str(short_corpus), "--streaming", "--max-steps", "16",
        "--save-every", "2", "--seq-len", "32", "--batch-size", "8", "--seed", "3",
        "--use-cpu", "true", "--resume",
    ]  # fmt: skip
    clean = tmp_path / "clean"
    options = streaming_options(family, tiny_tokenizer_dir, short_corpus, clean)
    egbert.run_pretraining(**{**options, "batch_size": 8}, max_steps=16, save_every=2)
    epochs = json.loads((clean / "checkpoints/step-16/trainer_state.json").read_text())["epoch"]
    assert epochs >= 1  # the stream ran out and started again before the end

    out = tmp_path / "killed"
    python = warm_python(subprocess_env)
    command = [python, "-m", "egbert.cli", "pretrain", *argv, "--output-dir", str(out)]
    kill_once(command, subprocess_env, lambda: _newest_step(out) >= 8, "checkpoint at step 8")
    assert not (out / "model").exists()
    killed_at = _newest_step(out)
    assert (out / f"checkpoints/step-{killed_at}/stream_position_0.json").is_file()

    capsys.readouterr()
    cli_main(command[3:])  # resumed in this process, as the clean run
    assert f"resumed from {out / 'checkpoints'}" in capsys.readouterr().out
    clean_weights = load_file(clean / "model/model.safetensors")
    resumed_weights = load_file(out / "model/model.safetensors")
    for name, tensor in clean_weights.items():
        torch.testing.assert_close(resumed_weights[name], tensor, atol=1e-6, rtol=0)
