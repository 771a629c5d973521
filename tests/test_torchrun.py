"""`egbert pretrain` and `egbert finetune` under `torchrun --nproc-per-node 2` on the CPU: the
run's files are written once, and the result equals one process with the double batch.

On purpose on the CPU (gloo) even where a GPU is there, since both processes would share it; a
fresh interpreter inherits no CUDA state. The one process they are held against trains on the CPU
too: a GPU's kernels sum in other orders, and the comparison is to 1e-5."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from egbert import run_finetuning, run_pretraining

pytestmark = pytest.mark.usefixtures("one_thread_and_fresh_accelerate")


def torchrun(command: str, argv: list[str], env: dict[str, str]) -> str:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    launcher += ["--nproc-per-node", "2", "-m", "egbert.cli", command, *argv, "--use-cpu"]
    run = subprocess.run(
        launcher,
        env={**env, "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert "training on 2 process(es)" in run.stdout + run.stderr
    return run.stdout


def train_losses(out: Path) -> list[float]:
    lines = (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [record["loss"] for record in map(json.loads, lines) if record["split"] == "train"]


def assert_same_weights(first: Path, second: Path) -> None:
    one, two = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    assert one.keys() == two.keys()
    for name, tensor in one.items():
        torch.testing.assert_close(two[name], tensor, atol=1e-5, rtol=0)


def test_pretrain_on_two_processes_equals_one_with_the_double_batch(
    wikitext_slice, tiny_tokenizer_dir, tmp_path, subprocess_env
):
    train = tmp_path / "train.tokens"
    lines = wikitext_slice.read_text(encoding="utf-8").splitlines(keepends=True)
    train.write_text("".join(lines[:200]), encoding="utf-8")
    options = {"model": "gpt", "tokenizer": str(tiny_tokenizer_dir), "train_files": [str(train)]}
    options |= {"doc_boundary": "wikitext", "seq_len": 32, "max_steps": 4, "log_every": 1}
    options |= {"report_to": ["none"], "save_every": 2}
    argv = []
    for name, value in {**options, "batch_size": 4, "output_dir": str(tmp_path / "two")}.items():
        values = value if isinstance(value, list) else [value]
        argv += [f"--{name.replace('_', '-')}", *map(str, values)]
    stdout = torchrun("pretrain", argv, subprocess_env)
    run_pretraining(**options, batch_size=8, output_dir=str(tmp_path / "one"), use_cpu=True)
    two, one = tmp_path / "two", tmp_path / "one"
    assert stdout.count("egbert: gpt pretrained for 4 steps") == 1  # the main process only
    assert len(train_losses(two)) == 4  # each record once
    assert train_losses(two) == pytest.approx(train_losses(one), abs=1e-5)
    assert_same_weights(one / "model", two / "model")
    assert sorted(p.name for p in (two / "checkpoints").iterdir()) == ["step-2", "step-4"]
    log = (two / "train.log").read_text(encoding="utf-8")
    assert log.count("egbert: training on 2 process(es)") == 1


def test_finetune_on_two_processes_equals_one_with_the_double_batch(
    tiny_egbert_bert_dir, micro_data, tmp_path, subprocess_env
):
    options = {
        "task": "rte",
        "model": str(tiny_egbert_bert_dir),
        "data_dir": str(micro_data / "glue"),
    }
    options |= {"max_seq_length": 32, "lr": 1e-3, "epochs": 2, "log_every": 1}
    options |= {"report_to": ["none"], "warmup_steps": 0}
    options |= {"config_overrides": "hidden_dropout_prob=0,attention_probs_dropout_prob=0"}
    argv = []
    for name, value in {**options, "batch_size": 4, "output_dir": str(tmp_path / "two")}.items():
        values = value if isinstance(value, list) else [value]
        argv += [f"--{name.replace('_', '-')}", *map(str, values)]
    stdout = torchrun("finetune", argv, subprocess_env)
    one_result = run_finetuning(
        **options, batch_size=8, output_dir=str(tmp_path / "one"), use_cpu=True
    )
    two, one = tmp_path / "two", tmp_path / "one"
    assert stdout.count("egbert finetune: rte ->") == 1 and stdout.count("| rte |") == 1
    assert train_losses(two) == pytest.approx(train_losses(one), abs=1e-5)
    assert_same_weights(one / "model", two / "model")
    results = json.loads((two / "eval_results.json").read_text(encoding="utf-8"))
    assert results["score"] == pytest.approx(one_result.results[0]["score"])
