"""--allow-pickle of every command that reads a model folder (finetune's: test_finetune_options):
a folder whose only weights are a pickle (pytorch_model.bin) is refused without the option in
one line, and with it gives exactly what the same weights saved as safetensors give.

Cost: tiny models (hidden size 16, one layer) on a few GLUE rows, about 1 s a command."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from option_coverage import proves
from safetensors.torch import load_file
from transformers import AutoTokenizer, BertConfig, BertModel

from egbert.cli import main as cli_main
from egbert.models.bert import EgbertBertConfig, EgbertBertForPreTraining
from egbert.models.gpt import EgbertGPTConfig, EgbertGPTForCausalLM

pytestmark = pytest.mark.usefixtures("one_thread_and_fresh_accelerate")

SIZES = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2}
SIZES |= {"intermediate_size": 32, "max_position_embeddings": 256}


def save_twice(model, tokenizer, root: Path, name: str) -> tuple[Path, Path]:
    """`model` saved as safetensors in root/name and as a pickle alone in root/name-pickle."""
    safe, pickled = root / name, root / f"{name}-pickle"
    for folder in (safe, pickled):
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    torch.save(load_file(pickled / "model.safetensors"), pickled / "pytorch_model.bin")
    (pickled / "model.safetensors").unlink()
    return safe, pickled


@pytest.fixture(scope="module")
def folders(tiny_tokenizer_dir, tiny_gpt2_dir, tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """(safetensors folder, pickle folder) of an egbert bert and gpt and of a stock BERT."""
    root = tmp_path_factory.mktemp("pickles")
    wordpiece = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    gpt2 = AutoTokenizer.from_pretrained(tiny_gpt2_dir)  # prompt-eval's answers are BPE tokens
    torch.manual_seed(0)
    bert = EgbertBertForPreTraining(EgbertBertConfig(vocab_size=len(wordpiece), **SIZES))
    gpt = EgbertGPTForCausalLM(
        EgbertGPTConfig(vocab_size=len(gpt2), eos_token_id=gpt2.eos_token_id, **SIZES)
    )
    stock = BertModel(BertConfig(vocab_size=len(wordpiece), **SIZES))
    return {
        "bert": save_twice(bert, wordpiece, root, "bert"),
        "gpt": save_twice(gpt, gpt2, root, "gpt"),
        "stock": save_twice(stock, wordpiece, root, "stock"),
    }


def probe(model: Path, out: Path, micro_data: Path) -> list[str]:
    argv = ["probe", "--model", str(model), "--task", "rte", "--features", "last"]
    return [*argv, "--data-dir", str(micro_data / "glue"), "--output-dir", str(out)]


def prompt_eval(model: Path, out: Path, micro_data: Path) -> list[str]:
    argv = ["prompt-eval", "--model", str(model), "--task", "rte", "--max-eval-samples", "4"]
    return [*argv, "--data-dir", str(micro_data / "glue"), "--output-dir", str(out)]


def embed(model: Path, out: Path, micro_data: Path) -> list[str]:
    out.mkdir()
    (out / "in.txt").write_text("a short text\nanother one\n", encoding="utf-8")
    argv = ["embed", "--model", str(model), "--input", str(out / "in.txt")]
    return [*argv, "--output", str(out / "v.npy"), "--layers", "-1"]


def generate(model: Path, out: Path, micro_data: Path) -> list[str]:
    return ["generate", "--model", str(model), "--prompt", "The", "--max-new-tokens", "5"]


def convert(model: Path, out: Path, micro_data: Path) -> list[str]:
    return ["convert", "--from", str(model), "--to", str(out)]


def without_timings(results: dict) -> dict:
    for task in results["tasks"].values():
        task.pop("seconds", None)
        for entry in task.get("shots", {}).values():
            entry.pop("seconds")
    results.pop("model")
    return results


def what_it_wrote(command: str, out: Path, printed: str):
    """What a run of `command` gave: its results file, vectors, text or converted weights."""
    if command in ("probe", "prompt-eval"):
        name = "probe_results.json" if command == "probe" else "prompt_eval_results.json"
        return without_timings(json.loads((out / name).read_text(encoding="utf-8")))
    if command == "embed":
        return np.load(out / "v.npy").tolist()
    if command == "generate":
        return printed
    return {name: tensor.tolist() for name, tensor in load_file(out / "model.safetensors").items()}


ARGUMENTS = {"probe": probe, "prompt-eval": prompt_eval, "embed": embed}
ARGUMENTS |= {"generate": generate, "convert": convert}
MODEL_OF = {"probe": "bert", "prompt-eval": "gpt", "embed": "bert", "generate": "gpt"}
MODEL_OF |= {"convert": "stock"}


@pytest.mark.parametrize("command", list(ARGUMENTS))
@proves("probe", "--allow-pickle")
@proves("prompt-eval", "--allow-pickle")
@proves("embed", "--allow-pickle")
@proves("generate", "--allow-pickle")
@proves("convert", "--allow-pickle")
def test_a_pickle_folder_needs_allow_pickle_and_then_gives_the_safetensors_result(
    command, folders, micro_data, tmp_path, capsys
):
    safe, pickled = folders[MODEL_OF[command]]
    arguments = ARGUMENTS[command]
    with pytest.raises(SystemExit) as refused:
        cli_main(arguments(pickled, tmp_path / "refused", micro_data))
    message = str(refused.value.code)
    assert message.startswith(f"egbert {command}: error: ") and "\n" not in message
    assert "pickle checkpoint (pytorch_model.bin)" in message and "--allow-pickle" in message
    found = {}
    for name, folder, flag in (("safe", safe, []), ("pickled", pickled, ["--allow-pickle"])):
        capsys.readouterr()
        cli_main([*arguments(folder, tmp_path / name, micro_data), *flag])
        found[name] = what_it_wrote(command, tmp_path / name, capsys.readouterr().out)
    assert found["pickled"] == found["safe"]
