"""Weights are saved and loaded whatever their memory layout.

On a GPU, cuDNN keeps each LSTM's weights as views into one flat buffer (`flatten_parameters`).
safetensors writes one tensor per storage, so Accelerate's `save_state` dropped 16 of elmo's
LSTM tensors from its checkpoints, and safetensors' `load_model` refused to load into such a
model. These tests build that layout on the CPU and run every save and load path of a training
run through it: checkpoint, resume, best-model reload and the final model.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import subprocess
import textwrap
from dataclasses import asdict, fields
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, PartialState
from accelerate.utils.other import clean_state_dict_for_safetensors
from safetensors.torch import load_file
from torch import nn

from egbert.config import TrainingArguments
from egbert.errors import CheckpointError, ConfigError
from egbert.model_files import load_pretrained
from egbert.models.elmo import EgbertElmoConfig, EgbertElmoForBidirectionalLM
from egbert.training.batches import TrainingData
from egbert.training.checkpoints import (
    STATE_FILE,
    Checkpointer,
    ResumeOptions,
    TrainerState,
    _views_to_untangle,
    checkpoints_in,
    config_differences,
    config_hash,
    own_storage,
    publish_dir,
    refuse_changed_run,
    untangled_state_dict,
    whole_run_config,
    write_error_reason,
    write_failure,
)
from egbert.training.model_saving import SavedWithModel
from egbert.training.trainer import Trainer, options_for

VOCAB = 50

pytestmark = pytest.mark.usefixtures("one_thread_and_fresh_accelerate")


def tiny_elmo() -> EgbertElmoForBidirectionalLM:
    torch.manual_seed(0)
    config = EgbertElmoConfig(vocab_size=VOCAB, hidden_size=16, cell_size=32, num_hidden_layers=2)
    return EgbertElmoForBidirectionalLM(config)


def flatten_like_cudnn(model: nn.Module) -> int:
    """Make each nn.LSTM's weights views into one flat buffer, the layout cuDNN gives them on a
    GPU; returns how many tensors are views now."""
    views = 0
    for lstm in (module for module in model.modules() if isinstance(module, nn.LSTM)):
        flatten_lstm_like_cudnn(lstm)
        views += len(lstm._flat_weights)
    return views


def flatten_lstm_like_cudnn(lstm: nn.LSTM) -> None:
    """What cuDNN's LSTM.flatten_parameters does on a GPU (on a CPU it does nothing): the
    weights, with the values they hold, become views into one buffer."""
    weights = [getattr(lstm, name) for name in lstm._flat_weights_names]
    flat = torch.cat([weight.detach().reshape(-1) for weight in weights])
    offset = 0
    for weight in weights:
        weight.data = flat[offset : offset + weight.numel()].view_as(weight)
        offset += weight.numel()


def lstm_names(model: nn.Module) -> set[str]:
    return {name for name, _ in model.named_parameters() if "lstm" in name}


def test_the_flat_layout_is_what_loses_weights_and_untangling_keeps_them():
    PartialState(cpu=True)  # Accelerate's cleaning logs through it
    model = tiny_elmo()
    assert flatten_like_cudnn(model) == 20  # 4 LSTMs (2 layers, 2 directions) of 5 tensors
    names = lstm_names(model)
    assert len(names) == 20
    # what Accelerate's save_state did with this layout: all views of a buffer but one dropped
    dropped = names - clean_state_dict_for_safetensors(dict(model.state_dict())).keys()
    assert len(dropped) == 16
    state = untangled_state_dict(model.state_dict())
    kept = clean_state_dict_for_safetensors(dict(state))
    assert names <= kept.keys()
    for name in names:
        torch.testing.assert_close(kept[name], model.state_dict()[name], rtol=0, atol=0)
    # tied weights stay one tensor (saved once, tied again on loading)
    assert state["lm_head.weight"].data_ptr() == state["elmo.embed_tokens.weight"].data_ptr()


def test_loading_into_the_flat_layout_keeps_it(monkeypatch):
    """Each weight gets a storage of its own to load into, and afterwards the LSTMs are back in
    the flat layout, holding what was loaded. cuDNN makes that layout on a GPU; on a CPU, where
    LSTM.flatten_parameters does nothing, its stand-in makes it the same way."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = tiny_elmo().to(device)
    flatten_like_cudnn(model)
    if device == "cpu":
        monkeypatch.setattr(nn.LSTM, "flatten_parameters", flatten_lstm_like_cudnn)
    lstms = [module for module in model.modules() if isinstance(module, nn.LSTM)]
    with own_storage(model):
        for lstm in lstms:
            shared = {param.untyped_storage().data_ptr() for param in lstm._flat_weights}
            assert len(shared) == len(lstm._flat_weights)  # each its own storage to load into
            for param in lstm._flat_weights:
                param.data.fill_(0.5)
    for lstm in lstms:
        assert all((param == 0.5).all() for param in lstm._flat_weights)  # what was loaded
        storages = {param.untyped_storage().data_ptr() for param in lstm._flat_weights}
        assert len(storages) == 1  # one buffer again: the flat layout


class BlockCollator:
    """Next-token batches of equal-length token blocks (no padding)."""

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        ids = torch.tensor([example["input_ids"] for example in examples])
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def blocks(count: int, seed: int) -> list[dict]:
    generator = torch.Generator().manual_seed(seed)
    return [
        {"input_ids": torch.randint(5, VOCAB, (12,), generator=generator).tolist()}
        for _ in range(count)
    ]


def flat_trainer(out, **options) -> Trainer:
    model = tiny_elmo()
    flatten_like_cudnn(model)
    defaults = {"lr": 1e-2, "batch_size": 4, "max_steps": 6, "save_every": 3, "log_every": 1}
    args = TrainingArguments(output_dir=str(out), **{**defaults, **options})
    data = TrainingData(blocks(16, seed=1), BlockCollator(), eval=blocks(8, seed=2))
    saved_with_model = SavedWithModel(run_config={"model": "tiny elmo"})
    return Trainer(model, data, args, saved_with_model=saved_with_model)


def test_checkpoint_resume_best_and_final_model_keep_every_lstm_weight(tmp_path):
    trainer = flat_trainer(tmp_path, eval_every=2, metric_for_best_model="loss")
    names = lstm_names(trainer.model)
    result = trainer.train()
    saved = load_file(tmp_path / "checkpoints/step-6/model.safetensors")
    assert names <= saved.keys()
    best = load_file(tmp_path / "best/model.safetensors")
    assert names <= best.keys()
    # the final model is the best one, reloaded into the flat layout and saved again
    final = load_pretrained(EgbertElmoForBidirectionalLM, result.model_dir)
    for name in names:
        torch.testing.assert_close(final.state_dict()[name], best[name], rtol=0, atol=0)
    # a resumed run starts from the checkpoint's LSTM weights, not from random ones
    AcceleratorState._reset_state(reset_partial_state=True)
    resumed = flat_trainer(tmp_path, max_steps=8, resume=True, metric_for_best_model="loss")
    resumed._start_or_resume()
    model = resumed.accelerator.unwrap_model(resumed.model)
    for name in names:
        torch.testing.assert_close(model.state_dict()[name].cpu(), saved[name], rtol=0, atol=0)


SHARDED = textwrap.dedent(
    """
    import sys
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from egbert.training.checkpoints import own_storage, untangled_state_dict

    torch.distributed.init_process_group("gloo", init_method=f"file://{sys.argv[1]}", rank=0,
                                         world_size=1)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    mesh = init_device_mesh("cpu", (1,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model(torch.randn(2, 4)).sum().backward()
    with own_storage(model):
        pass
    print(sorted(untangled_state_dict(model.state_dict())))
    """
)


def test_fsdp2_sharded_parameters_pass_the_layout_checks(tmp_path, subprocess_env, warm_python):
    """FSDP2 keeps each parameter as a DTensor shard, which has no storage to compare: resuming
    an FSDP run once failed with "Attempted to access the data pointer on an invalid python
    storage". One process on the CPU (gloo; a subprocess, so that this process never joins a
    process group), which is enough to build that layout."""
    result = subprocess.run(
        [warm_python(subprocess_env), "-c", SHARDED, str(tmp_path / "store")],
        capture_output=True,
        text=True,
        env=subprocess_env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "['0.bias', '0.weight', '1.bias', '1.weight']" in result.stdout


# ---------------------------------------------------------------- failed writes, resuming


def test_a_failed_write_is_named_by_what_to_do_about_it():
    """The one-line error of a run whose log, plot or model could not be written: the file, the
    reason (a full disk by name, else the system's words) and whether the newest checkpoint
    survives; errors that are not about writing stay the caller's."""
    assert write_error_reason(OSError(errno.ENOSPC, "No space left on device")) == "disk full"
    assert write_error_reason(OSError(errno.EACCES, "Permission denied")) == "Permission denied"
    assert write_error_reason(OSError("quota reached")) == "quota reached"
    full = disk_full("/runs/a/train.log")
    step = Path("/runs/a/checkpoints/step-4")
    assert str(write_failure(full, Path("/runs/a"), step)) == (
        "could not write /runs/a/train.log: disk full; free disk space (or fix the permissions) "
        "and run again with --resume (the newest checkpoint /runs/a/checkpoints/step-4 is intact)"
    )
    forbidden = OSError(errno.EROFS, "Read-only file system")
    assert str(write_failure(forbidden, Path("/runs/a"), None)) == (
        "could not write /runs/a: Read-only file system; free disk space (or fix the "
        "permissions) and run again with --resume (no checkpoint yet)"
    )
    for number in (errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EPERM):
        assert isinstance(write_failure(OSError(number, "x"), Path("."), None), CheckpointError)
    assert write_failure(OSError(errno.ENOENT, "No such file"), Path("."), None) is None


def disk_full(path: Path) -> OSError:
    return OSError(errno.ENOSPC, "No space left on device", str(path))


def linear_checkpointer(folder: Path, keep: int) -> tuple[Checkpointer, nn.Module]:
    """A Checkpointer of a CPU Accelerator that has prepared a small linear model."""
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(nn.Linear(3, 2))
    return Checkpointer(accelerator, folder, keep=keep), model


class RecordedStream:
    """A stream position that holds nothing to resume from (or does) and records its reads."""

    def __init__(self, holds: bool) -> None:
        self.holds, self.reads = holds, []

    def load(self, checkpoint: Path, process_index: int) -> bool:
        self.reads.append((checkpoint, process_index))
        return self.holds


def test_resume_restores_the_weights_and_state_and_removes_the_later_checkpoints(
    tmp_path, one_thread_and_fresh_accelerate
):
    """Three checkpoints, the weights a different constant in each; resuming from the first
    loads its weights and trainer state, keeps the current run's config, removes the later two
    and says so, and reads the stream position of this process (0)."""
    checkpointer, model = linear_checkpointer(tmp_path / "checkpoints", keep=5)
    for step in (1, 2, 3):
        nn.init.constant_(model.weight, float(step))
        saved = TrainerState(step=step, epoch=step - 1, batches_in_epoch=2, run_config={"a": 1})
        checkpointer.save(step, asdict(saved))
    nn.init.constant_(model.weight, 0.0)
    first = tmp_path / "checkpoints/step-1"
    current = TrainerState(run_config={"a": 1}, config_hash="now")
    said, stream = [], RecordedStream(holds=False)
    state = checkpointer.resume(first, model, current, False, stream, said.append)
    assert (model.weight == 1.0).all()
    assert (state.step, state.epoch, state.batches_in_epoch) == (1, 0, 2)
    assert (state.run_config, state.config_hash) == ({"a": 1}, "now")
    assert [path.name for _, path in checkpoints_in(tmp_path / "checkpoints")] == ["step-1"]
    assert stream.reads == [(first, 0)]
    assert said == [
        f"egbert: {first} holds no stream position; reading from the start",
        f"egbert: resumed from {first} (step 1, epoch 0, batch 2 of the epoch); removed the "
        "later step-2, step-3",
    ]
    said.clear()
    checkpointer.resume(first, model, current, False, RecordedStream(holds=True), said.append)
    assert said == [f"egbert: resumed from {first} (step 1, epoch 0, batch 2 of the epoch)"]


class OpensAFile:
    """A pickle that creates a file when it is unpickled: code a stranger put in a checkpoint."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return open, (str(self.path), "w")


def test_a_checkpoint_that_runs_code_when_unpickled_is_refused_before_it_runs(
    tmp_path, one_thread_and_fresh_accelerate
):
    accelerator = Accelerator(cpu=True)
    model = nn.Linear(3, 2)
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    checkpointer = Checkpointer(accelerator, tmp_path / "checkpoints", keep=1)
    step = checkpointer.save(1, asdict(TrainerState(step=1)))
    marker = tmp_path / "ran"
    torch.save(
        {"state": {}, "param_groups": [], "payload": OpensAFile(marker)}, step / "optimizer.bin"
    )
    with pytest.raises(CheckpointError) as error:
        checkpointer.resume(step, model, TrainerState(), False, None, print)
    assert not marker.exists()
    assert str(error.value).startswith(f"cannot load checkpoint {step}: Weights only load failed")


def test_a_changed_run_is_refused_with_each_change_named(tmp_path):
    """config_differences and refuse_changed_run against run configs written out here: a field
    outside the options by its dotted key, an option by its flag, an absent value as (unset);
    logging options may change, a length may only grow from a set value."""
    saved = {
        "model": "bert",
        "data": {"files": {"a": 1}},
        "options": {"lr": 0.1, "seq_len": 8, "log_every": 5, "max_steps": None, "epochs": 2},
    }
    current = {
        "model": "bert",
        "data": {"files": {"a": 2}},
        "tokenizer": "t",
        "options": {"lr": 0.2, "log_every": 1, "max_steps": 100, "epochs": 3, "mlm": 0.4},
    }
    expected = [
        "data.files.a: 1 -> 2",
        "--lr 0.1 -> 0.2",
        "--max-steps None -> 100",
        "--mlm (unset) -> 0.4",
        "--seq-len 8 -> (unset)",
        "tokenizer: (unset) -> t",
    ]
    assert config_differences(saved, current) == expected  # epochs 2 -> 3: a longer run
    assert config_differences({"options": {"epochs": 3}}, {"options": {"epochs": 2}}) == [
        "--epochs 3 -> 2"
    ]
    assert config_differences({"options": {"a": {"b": 1}}}, {"options": {"a": {"b": 2}}}) == [
        "--a.b 1 -> 2"
    ]
    step = tmp_path / "step-1"
    step.mkdir()
    (step / STATE_FILE).write_text(json.dumps({"step": 1, "run_config": saved}), encoding="utf-8")
    with pytest.raises(ConfigError) as error:
        refuse_changed_run(step, {**saved, "data": {"files": {"a": 2}}}, anyway=False)
    assert str(error.value) == (
        f"cannot resume from {step}: the run changed (data.files.a: 1 -> 2); use the original "
        "options (a resume may change only the logging, evaluation and saving intervals, "
        "--report-to and the like, or run longer) or pass --resume-anyway"
    )
    with pytest.raises(
        ConfigError, match=r"\(data.files.a: 1 -> \(unset\); model: bert -> \(unset\); tok"
    ):
        refuse_changed_run(step, {"options": saved["options"], "tokenizer": "t"}, anyway=False)
    state = refuse_changed_run(step, {"options": saved["options"]}, anyway=False, parts=True)
    assert state == {"step": 1, "run_config": saved}  # the sections passed are the same
    assert refuse_changed_run(step, current, anyway=True)["step"] == 1
    (step / STATE_FILE).write_text(json.dumps({"step": 1}), encoding="utf-8")  # no run config
    assert refuse_changed_run(step, {}, anyway=False) == {"step": 1}
    assert refuse_changed_run(step, {}, anyway=False, parts=True) == {"step": 1}


def test_a_save_starts_afresh_makes_its_folders_and_adds_each_process_files(
    tmp_path, one_thread_and_fresh_accelerate, caplog
):
    """A save killed before it was published left `.tmp-step-1` with a stale file: the next
    save of step 1 starts that folder afresh. The checkpoints folder is made with its parents;
    what `write_own_files` adds is in the checkpoint; a plain module's tied weights are saved
    without accelerate's "Removed shared tensor" warning."""
    folder = tmp_path / "checkpoints"
    (folder / ".tmp-step-1").mkdir(parents=True)
    (folder / ".tmp-step-1/stale.txt").write_text("from a killed save")
    tied = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10))
    tied[1].weight = tied[0].weight
    accelerator = Accelerator(cpu=True)
    accelerator.prepare(tied)
    fresh = tmp_path / "not/made/yet/checkpoints"
    with caplog.at_level(logging.WARNING):
        step = Checkpointer(accelerator, folder, keep=1).save(
            1, {"step": 1}, lambda part: (part / "own.json").write_text("{}")
        )
        Checkpointer(accelerator, fresh, keep=1).save(1, {"step": 1})
    assert sorted(path.name for path in step.iterdir()) == [
        "model.safetensors",
        "own.json",
        "random_states_0.pkl",
        "trainer_state.json",
    ]
    assert (fresh / "step-1/model.safetensors").is_file()  # its parent folders made
    assert not [record for record in caplog.records if "shared tensor" in record.getMessage()]
    assert load_file(step / "model.safetensors").keys() == {"0.weight", "1.bias"}


def test_a_run_starts_from_the_newest_complete_checkpoint_or_refuses_to_overwrite(
    tmp_path, one_thread_and_fresh_accelerate
):
    """Checkpoint folders made by hand: only `step-N` with a trainer state counts, newest by
    number (step-10 after step-2); what a killed save left (`.tmp-*`) goes at the start."""
    folder = tmp_path / "checkpoints"
    for name in ("step-1", "step-2", "step-10", "other-11", "step-x"):
        (folder / name).mkdir(parents=True)
        (folder / name / STATE_FILE).write_text("{}")
    (folder / "step-12").mkdir()  # no trainer state: never completed
    for leftover in (folder / ".tmp-step-12", tmp_path / ".tmp-model"):
        leftover.mkdir()
    checkpointer = Checkpointer(Accelerator(cpu=True), folder, keep=2)
    assert [number for number, _ in checkpoints_in(folder)] == [1, 2, 10]
    assert checkpoints_in(folder)[-1] == (10, folder / "step-10")
    assert checkpointer.latest() == folder / "step-10"
    assert checkpoints_in(tmp_path / "none") == []
    said = []

    def args(**options) -> ResumeOptions:
        return options_for(ResumeOptions, TrainingArguments(output_dir=str(tmp_path), **options))

    assert checkpointer.start(args(resume=True), said.append) == folder / "step-10"
    assert said == [] and not (folder / ".tmp-step-12").exists()
    assert not (tmp_path / ".tmp-model").exists() and (folder / "step-12").is_dir()
    with pytest.raises(ConfigError) as error:
        checkpointer.start(args(), said.append)
    assert str(error.value) == (
        f"{tmp_path} already holds checkpoints; pass --resume to continue that run, "
        "--overwrite-output-dir to start over, or choose a new --output-dir"
    )
    named = args(resume_from_checkpoint=str(folder / "step-2"))
    assert checkpointer.start(named, said.append) == folder / "step-2"
    assert checkpointer.start(args(overwrite_output_dir=True), said.append) is None
    assert said == [
        f"egbert: --overwrite-output-dir: removed the earlier run's checkpoints step-1, step-2, "
        f"step-10 from {folder}"
    ]
    assert checkpoints_in(folder) == [] and checkpointer.latest() is None
    assert checkpointer.start(args(resume=True), said.append) is None
    assert said[-1] == f"egbert: no checkpoint in {folder}; starting"
    with pytest.raises(ConfigError) as error:
        checkpointer.start(args(resume_from_checkpoint=str(folder / "step-12")), said.append)
    assert str(error.value) == (
        f"--resume-from-checkpoint {folder / 'step-12'}: not a checkpoint (no {STATE_FILE}); "
        "pass a run's checkpoints/step-N folder"
    )


def test_a_failed_save_says_which_checkpoint_is_kept_and_leaves_no_temp_folder(
    tmp_path, one_thread_and_fresh_accelerate
):
    """The main process's extras are in a published checkpoint; a save whose files could not
    be written raises one line naming the checkpoint kept (none before the first)."""
    folder = tmp_path / "checkpoints"
    checkpointer, _ = linear_checkpointer(folder, keep=2)

    def own_files_fail(part: Path) -> None:
        raise disk_full(part / "own.json")

    with pytest.raises(CheckpointError) as error:
        checkpointer.save(1, {"step": 1}, own_files_fail)
    assert str(error.value) == (
        f"could not write checkpoint {folder / 'step-1'}: disk full; free disk space or choose "
        "another --output-dir (none kept)"
    )
    first = checkpointer.save(1, {"step": 1}, None, lambda part: (part / "tokenizer.json").touch())
    assert (first / "tokenizer.json").is_file()
    assert (first / STATE_FILE).read_text(encoding="utf-8") == '{\n  "step": 1\n}'  # for people
    with pytest.raises(CheckpointError, match=rf"\(the previous checkpoint {first} is intact\)$"):
        checkpointer.save(2, {"step": 2}, own_files_fail)
    assert sorted(path.name for path in folder.iterdir()) == ["step-1"]


def test_only_views_of_one_buffer_in_different_layouts_are_untangled():
    """Two views of one buffer (cuDNN's flat LSTM weights) are; a tensor tied under two names,
    a tensor of its own, meta tensors (no storage yet), a tensor whose storage cannot be read
    (a sparse one here, an FSDP2 shard in a run) and a non-tensor entry are not."""
    flat = torch.zeros(10)
    tied = torch.ones(3)
    tensors = {
        "sparse": torch.sparse_coo_tensor([[0]], [1.0], (3,), check_invariants=True),
        "extra_state": 5,
        "weight": flat[:4].view(2, 2),
        "bias": flat[4:],
        "tied": tied,
        "tied_again": tied,
        "alone": torch.ones(2),
        "meta": torch.empty(3, device="meta"),
        "meta_other": torch.empty(4, device="meta"),
    }
    assert _views_to_untangle(tensors).keys() == {"weight", "bias"}


def test_a_published_folder_is_flushed_file_by_file_before_its_rename(tmp_path, monkeypatch):
    flushed, real_fsync = set(), os.fsync

    def recording_fsync(handle: int) -> None:
        flushed.add(os.fstat(handle).st_ino)
        real_fsync(handle)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    temp = tmp_path / ".tmp-step-1"
    (temp / "sub").mkdir(parents=True)
    (temp / "a.json").write_text("{}")
    (temp / "sub/b.bin").write_bytes(b"b")
    inodes = {path.stat().st_ino for path in (temp, temp / "a.json", temp / "sub/b.bin")}
    publish_dir(temp, tmp_path / "step-1")
    assert inodes <= flushed and tmp_path.stat().st_ino in flushed
    assert (tmp_path / "step-1/sub/b.bin").read_bytes() == b"b" and not temp.exists()


def test_a_file_that_cannot_be_deleted_does_not_stop_a_run(
    tmp_path, monkeypatch, one_thread_and_fresh_accelerate
):
    """A leftover, an old checkpoint or a failed save's temp folder holding a file the system
    refuses to delete: the run goes on (and a failed save still says why it failed)."""
    real_unlink = os.unlink

    def refuse_stuck(path, *args, **kwargs):
        if os.path.basename(path) == "stuck.bin":
            raise PermissionError(errno.EPERM, "Operation not permitted", path)
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", refuse_stuck)
    folder = tmp_path / "checkpoints"
    (folder / ".tmp-step-9").mkdir(parents=True)
    (folder / ".tmp-step-9/stuck.bin").touch()
    checkpointer, _ = linear_checkpointer(folder, keep=1)
    checkpointer.clean_leftovers(tmp_path)
    checkpointer.save(1, {"step": 1}, lambda part: (part / "stuck.bin").touch())
    checkpointer.save(2, {"step": 2})  # removes step-1, stuck.bin and all
    assert checkpointer.latest() == folder / "step-2"

    def stuck_then_full(part: Path) -> None:
        (part / "stuck.bin").touch()
        raise disk_full(part / "stuck.bin")

    with pytest.raises(CheckpointError, match="disk full"):
        checkpointer.save(3, {"step": 3}, stuck_then_full)


def test_the_run_config_holds_every_option_and_the_process_count_and_hashes_by_content():
    args = TrainingArguments(output_dir="out", lr=0.1)
    config = whole_run_config({"model": "bert", "options": {"seq_len": 8}}, asdict(args), 2)
    assert (config["model"], config["num_processes"]) == ("bert", 2)
    assert config["options"]["seq_len"] == 8 and config["options"]["lr"] == 0.1
    assert config["options"].keys() == {"seq_len"} | {f.name for f in fields(TrainingArguments)}
    assert config_hash({"b": 1, "a": Path("x")}) == config_hash({"a": Path("x"), "b": 1})
    assert config_hash({"a": 1}) == hashlib.sha256(b'{"a": 1}').hexdigest()
    assert config_hash({"a": 1}) != config_hash({"a": 2})
