"""--compile end to end, a compiled forward of each family without a graph break, and a compiled
run that leaves the process as it found it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from option_coverage import proves
from safetensors.torch import load_file

from egbert import (
    EgbertBertConfig,
    EgbertBertForPreTraining,
    EgbertElmoConfig,
    EgbertElmoForBidirectionalLM,
    EgbertGPTConfig,
    EgbertGPTForCausalLM,
)
from egbert.cli import main as cli_main
from egbert.commands.pretrain import main
from egbert.models import kernels
from egbert.training.trainer import COMPILE_SETTINGS

SHAPE = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, intermediate_size=64)

pytestmark = pytest.mark.usefixtures("one_thread_and_fresh_accelerate")


def tiny_models() -> dict[str, torch.nn.Module]:
    heads = dict(num_attention_heads=2, max_position_embeddings=64, sparse_mlm_logits=True)
    return {
        "bert": EgbertBertForPreTraining(EgbertBertConfig(**SHAPE, **heads)),
        "gpt": EgbertGPTForCausalLM(
            EgbertGPTConfig(**SHAPE, num_attention_heads=2, max_position_embeddings=64)
        ),
        "elmo": EgbertElmoForBidirectionalLM(
            EgbertElmoConfig(vocab_size=100, hidden_size=32, cell_size=64)
        ),
    }


def training_batch(family: str, padded: bool) -> dict[str, torch.Tensor]:
    """What egbert's collators give: attention_mask only when some row is padded."""
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, 100, (4, 16), generator=generator)
    batch = {"input_ids": input_ids, "labels": input_ids.clone()}
    if family == "bert":
        batch["labels"] = torch.where(torch.rand(4, 16, generator=generator) < 0.3, input_ids, -100)
        batch["labels"][:, 1] = input_ids[:, 1]  # every row predicts something
        batch["token_type_ids"] = torch.zeros_like(input_ids)
        batch["next_sentence_label"] = torch.tensor([0, 1, 0, 1])
    if padded:
        batch["attention_mask"] = torch.ones_like(input_ids)
        batch["attention_mask"][0, 10:] = 0
        batch["labels"][0, 10:] = -100
    return batch


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("family", ["bert", "gpt", "elmo"])
def test_training_forward_compiles_into_one_graph(family, padded, monkeypatch):
    """fullgraph=True raises at the first graph break (a .item(), a bool of a device tensor, a
    data-dependent branch); the eager backend traces without code generation, so it is fast.
    The graph computes what the model computes: the same loss and gradients as the eager
    forward, dropout included (both F.dropout's masks drawn after the same seed: the eager
    forward's own CPU masks are switched off)."""
    torch._dynamo.reset()
    model = tiny_models()[family].train()
    batch = training_batch(family, padded)
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    torch.manual_seed(0)
    with torch._dynamo.config.patch(**COMPILE_SETTINGS):
        loss = compiled(**batch).loss
    loss.backward()
    gradients = {name: param.grad for name, param in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    monkeypatch.setattr(kernels, "CPU_DROPOUT_MASKS", False)
    torch.manual_seed(0)
    expected = model(**batch).loss
    expected.backward()
    assert torch.isfinite(loss) and loss.shape == () and model.training
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    for name, param in model.named_parameters():
        if gradients[name] is None or param.grad is None:  # a weight the loss does not reach
            assert gradients[name] is param.grad, name
        else:
            torch.testing.assert_close(gradients[name], param.grad, rtol=1e-4, atol=1e-5)


def files_naming(folder: Path, text: bytes) -> list[Path]:
    return [path for path in folder.rglob("*") if path.is_file() and text in path.read_bytes()]


@proves("pretrain", "--compile", "--compile-mode")
def test_compile_trains_saves_plain_names_and_resumes(
    tiny_tokenizer_dir, wikitext_slice, tmp_path, monkeypatch
):
    """--compile through `egbert pretrain`: checkpoints, the best model and the final model hold
    the model's own names (no `_orig_mod.`), the compile time is reported apart, and a resumed
    compiled run goes on from the checkpoint. Dynamo and AOT autograd trace as with inductor,
    but the graphs run eagerly: inductor's C++ code generation took 6 minutes here on 2 busy
    cores (scripts/bench.py --pretrain --compile times the real thing)."""
    compile_module = torch.nn.Module.compile
    modes = []

    def compile_eagerly(module, mode=None, **options):  # a backend and a mode exclude each other
        modes.append(mode)
        compile_module(module, backend="aot_eager", **options)

    monkeypatch.setattr(torch.nn.Module, "compile", compile_eagerly)
    out = tmp_path / "gpt"
    argv = [
        "--model", "gpt", "--preset", "tiny", "--tokenizer", str(tiny_tokenizer_dir),
        "--train-files", str(wikitext_slice), "--doc-boundary", "wikitext",
        "--output-dir", str(out), "--seq-len", "32", "--batch-size", "8", "--seed", "3",
        "--validation-files", str(wikitext_slice), "--max-eval-samples", "16",
        "--eval-every", "2", "--save-every", "2", "--log-every", "2",
        "--metric-for-best-model", "loss", "--compile", "--compile-mode", "reduce-overhead",
    ]  # fmt: skip
    main([*argv, "--max-steps", "4"])
    results = json.loads((out / "train_results.json").read_text())
    assert results["compile_seconds"] > 0 and results["step"] == 4
    assert modes == ["reduce-overhead"]
    assert "egbert: compiled the model in" in (out / "train.log").read_text()
    assert (out / "best" / "model.safetensors").is_file()
    assert files_naming(out, b"_orig_mod") == []
    main([*argv, "--max-steps", "6", "--resume"])
    results = json.loads((out / "train_results.json").read_text())
    assert results["step"] == 6 and results["compile_seconds"] > 0
    train = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [record for record in train if record["split"] == "train"]
    assert [record["step"] for record in train] == [2, 4, 6]
    assert all(record["tokens_per_s"] > 0 and record["mfu"] > 0 for record in train)
    assert files_naming(out, b"_orig_mod") == []


@pytest.mark.slow
def test_a_compiled_run_leaves_the_process_as_it_found_it(
    tiny_egbert_bert_dir, micro_data, tmp_path, subprocess_env, warm_python
):
    """A compiled fine-tune, then an eager one in this process: torch._dynamo's settings are
    as they were before, and the eager run's weights equal those of the same run in a fresh
    process (fp32 CPU, one thread, within 1e-6). torch's own per-graph backend override turns
    the trainer's real torch.compile call into aot_eager: traced alike, without inductor's
    minutes of code generation."""
    argv = [
        "finetune", "--task", "rte", "--model", str(tiny_egbert_bert_dir),
        "--data-dir", str(micro_data / "glue"), "--max-seq-length", "32", "--batch-size", "8",
        "--epochs", "2", "--lr", "1e-3", "--seed", "5", "--report-to", "none",
    ]  # fmt: skip
    found = torch._dynamo.config.get_config_copy()
    with torch._dynamo.config.patch(debug_backend_override=">=0:aot_eager"):
        cli_main([*argv, "--compile", "--output-dir", str(tmp_path / "compiled")])
    compiled = json.loads((tmp_path / "compiled" / "train_results.json").read_text())
    assert compiled["compile_seconds"] > 0
    now = torch._dynamo.config.get_config_copy()
    assert {name: value for name, value in now.items() if value != found[name]} == {}

    cli_main([*argv, "--output-dir", str(tmp_path / "eager")])
    fresh = [warm_python(subprocess_env), "-m", "egbert.cli", *argv]
    fresh += ["--output-dir", str(tmp_path / "fresh")]
    subprocess.run(fresh, env=subprocess_env, check=True, capture_output=True)
    fresh_weights = load_file(tmp_path / "fresh" / "model" / "model.safetensors")
    eager_weights = load_file(tmp_path / "eager" / "model" / "model.safetensors")
    assert eager_weights.keys() == fresh_weights.keys()
    for name, tensor in fresh_weights.items():
        torch.testing.assert_close(eager_weights[name], tensor, atol=1e-6, rtol=0)
