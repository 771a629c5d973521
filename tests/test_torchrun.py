"""Every two-process guarantee from one `torchrun --nproc-per-node 2` launch on the CPU:
`egbert pretrain` on text files and on a prepared folder, and `egbert finetune`, each equal one
process with the double batch and write the run's files once; a streamed pretrain reads a shard of
its own in each process and saves each process's stream position.

The launch runs these jobs one after the other in the same two processes (run as a script, this
file does that): two fresh interpreters and a launcher cost more than the jobs themselves. On
purpose on the CPU (gloo) even where a GPU is there, since both processes would share it; a fresh
interpreter inherits no CUDA state. The one process they are held against trains on the CPU too:
a GPU's kernels sum in other orders, and the comparison is to 1e-5."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from accelerate.state import AcceleratorState, GradientState, PartialState
from safetensors.torch import load_file

import egbert
from egbert import run_finetuning, run_pretraining
from egbert.cli import main as cli_main

pytestmark = pytest.mark.usefixtures("one_thread_and_fresh_accelerate")

PRETRAIN = {"model": "gpt", "seq_len": 32, "max_steps": 4, "log_every": 1, "report_to": ["none"]}
# fp32: bf16 sums of a batch of 8 and two of 4 differ by 1e-4 (the comparison is to 1e-5)
PRETRAIN |= {"bf16": False}
FINETUNE = {"task": "rte", "max_seq_length": 32, "lr": 1e-3, "epochs": 2, "log_every": 1}
FINETUNE |= {"report_to": ["none"], "warmup_steps": 0, "bf16": False}
FINETUNE |= {"config_overrides": "hidden_dropout_prob=0,attention_probs_dropout_prob=0"}


def command_line(command: str, options: dict) -> list[str]:
    argv = [command]
    for name, value in options.items():
        values = value if isinstance(value, list) else [value]
        argv += [f"--{name.replace('_', '-')}", *map(str, values)]
    return argv


def launch_failure(run: subprocess.CompletedProcess) -> str:
    """What a failed launch says: every line naming an error (a rank's traceback ends in one,
    egbert's one-line errors are one), which the ranks' long tracebacks push out of a plain
    tail, then the tail."""
    output = run.stdout + run.stderr
    errors = [line for line in output.splitlines() if "error" in line.lower()]
    return "\n".join(errors[-40:]) + "\n--- the last lines:\n" + output[-2000:]


def lines_of(path: Path, start: int, stop: int) -> str:
    return "".join(path.read_text(encoding="utf-8").splitlines(keepends=True)[start:stop])


@pytest.fixture(scope="module")
def launch(
    wikitext_slice, tiny_tokenizer_dir, tiny_egbert_bert_dir, micro_data, subprocess_env,
    tmp_path_factory,
):  # fmt: skip
    """Each job's options (without batch size and output folder), the launch's stdout, and the
    folder under which each job's two-process run wrote its output (named by the job)."""
    root = tmp_path_factory.mktemp("torchrun")
    slices = {"train": (0, 200), "valid": (600, 800), "half0": (0, 1500), "half1": (1500, 3000)}
    for name, (start, stop) in slices.items():
        (root / f"{name}.tokens").write_text(lines_of(wikitext_slice, start, stop), "utf-8")
    text = {"tokenizer": str(tiny_tokenizer_dir), "doc_boundary": "wikitext"}
    egbert.prepare_corpus(
        **text, model="gpt", seq_len=32, train_files=[str(root / "train.tokens")],
        validation_files=[str(root / "valid.tokens")], output_dir=str(root / "prepared"),
    )  # fmt: skip
    halves = [str(root / "half0.tokens"), str(root / "half1.tokens")]
    files = {**PRETRAIN, **text, "train_files": [str(root / "train.tokens")], "save_every": 2}
    tiny_bert = {"model": str(tiny_egbert_bert_dir), "data_dir": str(micro_data / "glue")}
    stream = {**PRETRAIN, **text, "train_files": halves, "streaming": True, "max_steps": 5}
    stream |= {"save_every": 3}
    # dropout on (the gpt recipe's is off): the recompute must draw the forward's masks again
    dropout = {
        **files,
        "config_overrides": "hidden_dropout_prob=0.1,attention_probs_dropout_prob=0.1",
    }
    resumed = {**stream, "resume_from_checkpoint": str(root / "stream/checkpoints/step-3")}
    jobs = {
        "files": ("pretrain", files),
        "muon": ("pretrain", {**files, "optim": "muon"}),
        "dropout": ("pretrain", dropout),
        "checkpointed": ("pretrain", {**dropout, "gradient_checkpointing": True}),
        "finetune": ("finetune", {**FINETUNE, **tiny_bert}),
        "folder": ("pretrain", {**PRETRAIN, "data": str(root / "prepared")}),
        "stream": ("pretrain", stream),
        "resumed": ("pretrain", resumed),  # after "stream": from its step 3
    }
    argvs = [
        command_line(command, {**options, "batch_size": 4, "output_dir": str(root / name)})
        + ["--use-cpu", "true"]
        for name, (command, options) in jobs.items()
    ]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    launcher += ["--nproc-per-node", "2", __file__, json.dumps(argvs)]
    env = {**subprocess_env, "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run(launcher, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, launch_failure(run)
    options = {name: options for name, (_, options) in jobs.items()}
    return {"root": root, "jobs": options, "stdout": run.stdout}


def train_losses(out: Path) -> list[float]:
    lines = (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [record["loss"] for record in map(json.loads, lines) if record["split"] == "train"]


def assert_same_weights(first: Path, second: Path, atol: float = 1e-5) -> None:
    one, two = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    assert one.keys() == two.keys()
    for name, tensor in one.items():
        torch.testing.assert_close(two[name], tensor, atol=atol, rtol=0)


def assert_trained_once_on_two_processes(out: Path) -> None:
    log = (out / "train.log").read_text(encoding="utf-8")
    assert log.count("egbert: training on 2 process(es)") == 1  # the main process only


@pytest.mark.slow
def test_pretrain_on_two_processes_equals_one_with_the_double_batch(launch, tmp_path):
    two, one = launch["root"] / "files", tmp_path / "one"
    run_pretraining(**launch["jobs"]["files"], batch_size=8, output_dir=str(one), use_cpu=True)
    assert launch["stdout"].count(f"model saved in {two / 'model'}") == 1  # the main process's
    assert_trained_once_on_two_processes(two)
    assert len(train_losses(two)) == 4  # each record once
    assert train_losses(two) == pytest.approx(train_losses(one), abs=1e-5)
    assert_same_weights(one / "model", two / "model")
    assert sorted(p.name for p in (two / "checkpoints").iterdir()) == ["step-2", "step-4"]


def test_muon_on_two_processes_equals_one_with_the_double_batch(launch, tmp_path):
    """--optim muon under DDP: each process orthogonalises the same all-reduced gradients. To
    1e-4: torch's Muon runs its Newton-Schulz iterations in bf16, where the all-reduce's other
    summation order moves a few weights by up to 3.3e-5 (measured); the losses agree to 1e-5."""
    two, one = launch["root"] / "muon", tmp_path / "one"
    run_pretraining(**launch["jobs"]["muon"], batch_size=8, output_dir=str(one), use_cpu=True)
    assert_trained_once_on_two_processes(two)
    assert train_losses(two) == pytest.approx(train_losses(one), abs=1e-5)
    assert train_losses(two) != pytest.approx(train_losses(launch["root"] / "files"), abs=1e-3)
    assert_same_weights(one / "model", two / "model", atol=1e-4)


def test_gradient_checkpointing_on_two_processes_trains_what_they_train_without(launch):
    """--gradient-checkpointing under DDP (two processes, gloo; non-reentrant checkpoints
    beside DDP's gradient hooks), dropout on: the losses and weights of the same run without
    it, to 1e-5."""
    plain, checkpointed = launch["root"] / "dropout", launch["root"] / "checkpointed"
    assert_trained_once_on_two_processes(checkpointed)
    assert train_losses(checkpointed) == pytest.approx(train_losses(plain), abs=1e-5)
    assert_same_weights(plain / "model", checkpointed / "model")


def test_finetune_on_two_processes_equals_one_with_the_double_batch(launch, tmp_path):
    two, one = launch["root"] / "finetune", tmp_path / "one"
    one_result = run_finetuning(
        **launch["jobs"]["finetune"], batch_size=8, output_dir=str(one), use_cpu=True
    )
    assert launch["stdout"].count(f"egbert finetune: rte -> {two}") == 1
    assert launch["stdout"].count("| rte |") == 1
    assert_trained_once_on_two_processes(two)
    assert train_losses(two) == pytest.approx(train_losses(one), abs=1e-5)
    assert_same_weights(one / "model", two / "model")
    results = json.loads((two / "eval_results.json").read_text(encoding="utf-8"))
    assert results["score"] == pytest.approx(one_result.results[0]["score"])


def test_pretrain_on_a_folder_on_two_processes_equals_one_with_the_double_batch(launch, tmp_path):
    two, one = launch["root"] / "folder", tmp_path / "one"
    argv = command_line("pretrain", {**launch["jobs"]["folder"], "batch_size": 8})
    cli_main([*argv, "--use-cpu", "true", "--output-dir", str(one)])
    assert_trained_once_on_two_processes(two)
    assert len(train_losses(two)) == 4
    assert train_losses(two) == pytest.approx(train_losses(one), abs=1e-5)


def stream_positions(out: Path, step: int) -> list[dict]:
    folder = out / "checkpoints" / f"step-{step}"
    return [json.loads((folder / f"stream_position_{rank}.json").read_text()) for rank in (0, 1)]


def test_a_stream_on_two_processes_saves_and_resumes_each_ones_position(launch):
    """Each process saves where it stands in its own shard, and a resumed run takes each back
    from its own file: from step 3 on it ends with the uninterrupted run's positions and
    weights."""
    whole, resumed = launch["root"] / "stream", launch["root"] / "resumed"
    assert_trained_once_on_two_processes(whole)
    # each process is 12 blocks into its own file (shard), not into a shared one
    assert stream_positions(whole, 3)[0] != stream_positions(whole, 3)[1]
    assert stream_positions(resumed, 5) == stream_positions(whole, 5) != stream_positions(whole, 3)
    assert_same_weights(whole / "model", resumed / "model")


if __name__ == "__main__":  # under torchrun: the jobs one after the other, in one process group
    # Each job's Accelerator ends the process group when its training ends, and gloo cannot
    # start it again on the launcher's store (the first group's rendezvous keys are taken): it
    # ends once, after the last job.
    end_process_group = PartialState.destroy_process_group
    PartialState.destroy_process_group = lambda self, group=None: None
    for argv in json.loads(sys.argv[1]):
        cli_main(argv)
        AcceleratorState._reset_state()  # the next job's Accelerator sets its own options
        GradientState._reset_state()
    end_process_group(PartialState())
