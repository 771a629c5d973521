"""The GPU scripts (docs/gpu.md) run on the CPU at tiny sizes, so that a change that breaks one of
them fails CI instead of the next GPU session: scripts/gpu_check.sh without its suite and its
quickstart (its kill-and-resume check of one family, through scripts/resume_check.py), and
scripts/gpu_perf.sh with GPU_PERF_TINY=1 (every row, through `egbert pretrain` and
scripts/bench.py); and gpu_perf's summary, whose numbers need a GPU, on files written here."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from egbert import EgbertBertConfig, EgbertElmoConfig, EgbertGPTConfig, EgbertGPTForCausalLM
from egbert.config import apply_config_overrides, load_preset

REPO = Path(__file__).resolve().parents[1]


def script_module(name: str):
    """scripts/NAME.py as a module (scripts/ is no package; its folder goes last on the path,
    where a script finds the sibling modules it imports)."""
    if str(REPO / "scripts") not in sys.path:
        sys.path.append(str(REPO / "scripts"))
    spec = importlib.util.spec_from_file_location(f"egbert_{name}", REPO / "scripts" / f"{name}.py")
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = script_module("bench")
gpu_perf_summary = script_module("gpu_perf_summary")
resume_check = script_module("resume_check")


def run_script(argv: list[str], env: dict[str, str], logs: Path, warm_python) -> None:
    """Run a script of scripts/ on the CPU, its Python commands on the warm interpreter; on
    failure, show the ends of its logs."""
    env = {**env, "CUDA_VISIBLE_DEVICES": ""}
    env["PYTHON"] = warm_python(env)
    result = subprocess.run(
        ["bash", *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=900
    )
    if result.returncode != 0:
        tails = [f"{path}:\n{path.read_text()[-1500:]}" for path in sorted(logs.rglob("*.log"))]
        pytest.fail("\n".join([result.stdout[-2000:], result.stderr[-2000:], *tails]))


def table_line(text: str, start: str) -> list[str]:
    """The cells of the table line that starts with `start`."""
    line = next((line for line in text.splitlines() if line.startswith(start)), None)
    assert line is not None, f"no line {start!r} in:\n{text}"
    return [cell.strip() for cell in line.strip("|").split("|")]


@pytest.mark.slow
def test_gpu_check_without_suite_and_quickstart_kills_and_resumes(
    tmp_path, subprocess_env, data_dir, warm_python
):
    out = tmp_path / "check"
    env = {**subprocess_env, "EGBERT_DATA": str(data_dir)}
    env |= {"GPU_CHECK_ALLOW_CPU": "1", "GPU_CHECK_TINY": "1"}
    argv = ["scripts/gpu_check.sh", "--no-suite", "--no-quickstart", str(out)]
    run_script(argv, env, out, warm_python)
    summary = (out / "summary.md").read_text()
    assert table_line(summary, "| test suite |")[1:] == ["skipped", "--no-suite"]
    assert table_line(summary, "| quickstart")[1] == "skipped"
    resume = table_line(summary, "| pretrain, SIGKILL, resume: plain |")
    assert resume[1] == "ok" and resume[2].startswith("1 of 1 families ok, engine: NO")
    # resume_check's own row: killed before the end, resumed from that checkpoint, equal weights
    family, engine, killed, resumed, missing, difference, ok = table_line(
        (out / "resume-plain.log").read_text(), "| gpt |"
    )
    assert killed == resumed and int(killed.removeprefix("step ")) < 8
    assert (engine, missing, ok) == ("NO", "0", "ok") and difference.startswith("0 ")


@pytest.mark.slow
def test_gpu_perf_tiny_fills_every_row(
    tmp_path, subprocess_env, data_dir, tiny_tokenizer_dir, warm_python
):
    out = tmp_path / "perf"
    env = {**subprocess_env, "EGBERT_DATA": str(data_dir)}
    # the suite's tokenizer: training one is a process of its own (`egbert tokenizer train` is
    # tested in test_tokenizer.py)
    env |= {
        "GPU_PERF_TINY": "1",
        "GPU_PERF_COMPILE": "0",
        "GPU_PERF_TOKENIZER": str(tiny_tokenizer_dir),
    }
    run_script(["scripts/gpu_perf.sh", str(out)], env, out, warm_python)
    summary = (out / "summary.md").read_text()
    assert not (out / "tokenizer").exists()  # the one given was used
    for row in ("gpt seq 64", "bert NSP seq 128", "elmo seq 64"):
        for kind in ("bench", "egbert pretrain"):
            cells = table_line(summary, f"| {row}: {kind} |")
            assert "failed" not in cells[-1], cells
            assert float(cells[1].replace(",", "")) > 0  # tokens/s
            measured, spec = cells[2].split(" / ")
            assert float(measured) > 0 and spec == "-"  # a CPU has no datasheet peak here
            assert cells[5].endswith("x")  # against the reference
        assert float(table_line(summary, f"| {row}: egbert pretrain |")[6]) > 0  # / bench loop


# ---------------------------------------------------------------- gpu_perf's summary


@pytest.mark.parametrize(
    ("device", "card", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 989),
        ("NVIDIA H100 PCIe", "H100 PCIe", 756),
        ("NVIDIA H200", "H200", 989),
        ("NVIDIA H100 NVL", None, None),
        ("NVIDIA GH200 480GB", None, None),
        ("NVIDIA A100-SXM4-80GB", None, None),
        ("cpu", None, None),
    ],
)
def test_the_datasheet_peak_is_known_for_named_cards_only(device, card, tflops):
    peak = gpu_perf_summary.spec_peak(device)
    assert (peak and (peak.name, peak.flops)) == (card and (card, tflops * 1e12))


def test_mfu_against_the_datasheet_counts_the_same_flops():
    """0.5 of a measured 750 TFLOP/s is 375 TFLOP/s, 0.379 of an H100 SXM's 989."""
    h100 = gpu_perf_summary.spec_peak("NVIDIA H100 80GB HBM3")
    assert gpu_perf_summary.mfu_text(0.5, 750e12, h100) == "0.500 / 0.379"
    assert gpu_perf_summary.mfu_text(0.5, 750e12, None) == "0.500 / -"


def test_pretrain_is_counted_as_the_bench_loop_counts_its_tokens(tmp_path):
    """Steps x batch x seq over the log's elapsed seconds (padding included), the first window
    left out; real tokens/s and MFU over the same span (each window by its seconds)."""
    records = [
        {"split": "train", "step": 10, "tokens_per_s": 1.0, "elapsed_s": 5.0, "mfu": 0.1},
        {"split": "eval", "step": 10, "loss": 1.0},
        {"split": "train", "step": 20, "tokens_per_s": 900.0, "elapsed_s": 15.0, "mfu": 0.4},
        {"split": "train", "step": 30, "tokens_per_s": 960.0, "elapsed_s": 35.0, "mfu": 0.5},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    results = {"compile_seconds": 12.0, "matmul_peak_flops": 7e14}
    (tmp_path / "train_results.json").write_text(json.dumps(results))
    numbers = gpu_perf_summary.pretrain_numbers(tmp_path, batch_size=4, seq_len=8)
    assert numbers.batch_tokens_per_s == pytest.approx(20 * 4 * 8 / 30.0)
    assert numbers.tokens_per_s == pytest.approx((900 * 10 + 960 * 20) / 30)
    assert numbers.mfu == pytest.approx((0.4 * 10 + 0.5 * 20) / 30)
    assert (numbers.peak_flops, numbers.compile_seconds) == (7e14, 12.0)


def test_llmc_counts_every_weight_once_and_half_the_attention(tmp_path):
    config = EgbertGPTConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64,
    )  # fmt: skip
    model = EgbertGPTForCausalLM(config)
    model.save_pretrained(tmp_path)
    weights = sum(parameter.numel() for parameter in model.parameters())  # tied ones once
    flops, counted = gpu_perf_summary.llmc_flops_per_token(tmp_path, 64)
    assert counted == weights
    assert flops == 6 * weights + 6 * 2 * 32 * 64


# ---------------------------------------------------------------- resume_check's comparison


def test_the_resume_check_compares_every_tensor_and_its_name():
    weights = {"a": torch.zeros(2, 3), "b": torch.ones(4)}
    assert resume_check.max_difference(weights, {k: v.clone() for k, v in weights.items()}) == 0
    moved = {"a": weights["a"] + 1e-3, "b": weights["b"]}
    assert resume_check.max_difference(weights, moved) == pytest.approx(1e-3)
    assert resume_check.max_difference(weights, {"a": weights["a"]}) == float("inf")
    assert resume_check.max_difference(weights, {**weights, "b": torch.ones(5)}) == float("inf")
    log = "egbert: resumed from runs/x/checkpoints/step-20 (step 20, epoch 0, batch 20 ...)"
    assert resume_check.resumed_from(log) == 20 and resume_check.resumed_from("starting") is None


# ---------------------------------------------------------------- bench.py --pretrain


@pytest.mark.parametrize(
    ("family", "config_class"),
    [("bert", EgbertBertConfig), ("gpt", EgbertGPTConfig), ("elmo", EgbertElmoConfig)],
)
def test_bench_pretrain_gives_each_familys_model_the_loops_dropout(family, config_class):
    """`scripts/bench.py --pretrain`'s overrides fit each family's config as `egbert pretrain`
    applies them (elmo's has no attention dropout and no positions: it was refused)."""
    config = config_class(**load_preset(family, "tiny"))
    apply_config_overrides(config, bench.pretrain_overrides(family, 0.25, 1024))
    assert config.hidden_dropout_prob == 0.25
    if family != "elmo":
        assert (config.attention_probs_dropout_prob, config.max_position_embeddings) == (0.25, 1024)
