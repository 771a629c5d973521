"""Same seed, same numbers: pretrain (with --max-steps), finetune, probe, prompt-eval and embed,
each run with the same options and seed in two fresh processes (at once, each with its own hash
seed and `datasets` cache), give bit-identical weights, metrics and outputs.

Each process runs the five commands one after the other (the interpreter's start is most of a
tiny job's cost): bert pretrained for three steps, then fine-tuned, probed and embedded from that
model; tiny-gpt2 prompted. What may differ is timing alone: the fields TIMING name are dropped,
and each run's own folder is written RUN, before the files are compared."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

# Seconds, rates and the matmul peak measured on the way: the only numbers a rerun may change.
TIMING = {"seconds", "train_seconds", "elapsed_seconds", "elapsed_s", "compile_seconds"}
TIMING |= {"tokens_per_s", "mfu", "matmul_peak_flops"}
# A preset smaller than tiny: the same for every run
PRESET = {"hidden_size": 48, "num_hidden_layers": 2, "num_attention_heads": 2}
PRESET |= {"intermediate_size": 96, "max_position_embeddings": 64}
# A fresh process that runs egbert's commands, each as `egbert ARGV` would
RUN_COMMANDS = "import json, sys\nfrom egbert.cli import main\n"
RUN_COMMANDS += "for argv in json.loads(sys.argv[1]):\n    main(argv)\n"


def commands(run: Path, inputs: dict[str, Path]) -> list[list[str]]:
    """The five commands of one run into the folder `run`, in order, on the `inputs`: the data
    folder, the preset, the tokenizer, the gpt model and the texts to embed."""
    data, preset, tokenizer = inputs["data"], inputs["preset"], inputs["tokenizer"]
    glue = ["--task", "rte", "--data-dir", str(data / "glue"), "--seed", "3"]
    corpus = data / "corpus" / "wikitext-2"
    return [
        ["pretrain", "--model", "bert", "--preset", str(preset), "--tokenizer", str(tokenizer),
         "--train-files", str(corpus / "wiki.train.tokens"),
         "--validation-files", str(corpus / "wiki.valid.tokens"), "--max-eval-samples", "16",
         "--doc-boundary", "wikitext", "--seq-len", "32", "--batch-size", "8",
         "--max-steps", "3", "--seed", "3", "--report-to", "none",
         "--output-dir", str(run / "pretrain")],
        # with dropout (bert pretrains without): its masks come from the seed too
        ["finetune", "--model", str(run / "pretrain" / "model"), *glue, "--max-steps", "2",
         "--batch-size", "8", "--max-seq-length", "64", "--report-to", "none",
         "--config-overrides", "hidden_dropout_prob=0.1", "--output-dir", str(run / "finetune")],
        # a draw of 16 of RTE's 24 training rows: the seed picks them
        ["probe", "--model", str(run / "pretrain" / "model"), *glue,
         "--max-train-samples", "16", "--output-dir", str(run / "probe")],
        # every dev example, two draws of demonstrations: the seed picks them
        ["prompt-eval", "--model", str(inputs["gpt"]), *glue, "--shots", "2", "4",
         "--output-dir", str(run / "prompt-eval")],
        ["embed", "--model", str(run / "pretrain" / "model"), "--input", str(inputs["texts"]),
         "--layers", "-1,-2", "--combine", "concat", "--output", str(run / "embeddings.npy")],
    ]  # fmt: skip


@pytest.fixture(scope="module")
def two_runs(
    micro_data: Path,
    tiny_tokenizer_dir: Path,
    tiny_gpt2_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    subprocess_env: dict[str, str],
) -> tuple[Path, Path]:
    """The five commands run in two fresh processes at once, into folders a and b."""
    root = tmp_path_factory.mktemp("same-seed")
    inputs = {"data": micro_data, "tokenizer": tiny_tokenizer_dir, "gpt": tiny_gpt2_dir}
    inputs |= {"preset": root / "preset.yaml", "texts": root / "texts.txt"}
    inputs["preset"].write_text(yaml.safe_dump(PRESET), encoding="utf-8")
    texts = "The first text .\nA second one , longer than the first one is .\n"
    inputs["texts"].write_text(texts, encoding="utf-8")
    processes = []
    for name, hash_seed in (("a", "1"), ("b", "2")):
        run = root / name
        argv = commands(run, inputs)
        env = {**subprocess_env, "PYTHONHASHSEED": hash_seed}
        env["HF_DATASETS_CACHE"] = str(root / f"datasets-cache-{name}")
        command = [sys.executable, "-c", RUN_COMMANDS, json.dumps(argv)]
        processes.append(
            subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        )
    for process in processes:
        output = process.communicate(timeout=300)[0].decode(errors="replace")
        assert process.returncode == 0, output[-3000:]
    return root / "a", root / "b"


def without_timing(value: Any, run: Path) -> Any:
    """`value` (read from JSON) without the TIMING fields, its run's folder written RUN."""
    if isinstance(value, dict):
        return {k: without_timing(v, run) for k, v in value.items() if k not in TIMING}
    if isinstance(value, list):
        return [without_timing(item, run) for item in value]
    if isinstance(value, str):
        return value.replace(str(run), "RUN")
    return value


def read(run: Path, name: str) -> Any:
    """A JSON or JSON lines file of the run, without its timing."""
    text = (run / name).read_text(encoding="utf-8")
    if name.endswith(".jsonl"):
        return [without_timing(json.loads(line), run) for line in text.splitlines()]
    return without_timing(json.loads(text), run)


def assert_same(two_runs: tuple[Path, Path], *names: str) -> None:
    a, b = two_runs
    for name in names:
        if name.endswith((".safetensors", ".npy")):
            assert (a / name).read_bytes() == (b / name).read_bytes(), name
        else:
            assert read(a, name) == read(b, name), name


def test_pretrain_gives_the_same_weights_and_metrics(two_runs):
    assert_same(
        two_runs,
        "pretrain/model/model.safetensors",
        "pretrain/metrics.jsonl",
        "pretrain/train_results.json",
    )
    records = read(two_runs[0], "pretrain/metrics.jsonl")
    assert [r["split"] for r in records] == ["train", "eval"]  # a loss and an evaluation


def test_finetune_gives_the_same_weights_and_scores(two_runs):
    assert_same(
        two_runs,
        "finetune/model/model.safetensors",
        "finetune/metrics.jsonl",
        "finetune/eval_results.json",
    )


def test_probe_gives_the_same_scores(two_runs):
    assert_same(two_runs, "probe/probe_results.json")


def test_prompt_eval_gives_the_same_scores(two_runs):
    assert_same(two_runs, "prompt-eval/prompt_eval_results.json")


def test_embed_gives_the_same_vectors(two_runs):
    assert_same(two_runs, "embeddings.npy")
