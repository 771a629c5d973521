"""The trainer's options as `egbert pretrain` parses them, each against an expectation from outside
the trainer: torch's AdamW and clip_grad_norm_ in a plain loop written here, the schedules'
formulas written here, the intervals counted by hand, TensorBoard's own reader.

The model is tests/test_trainer.py's TinyLM (a next-token model of a few hundred weights): the
trainer knows nothing of the model, so what holds for it holds for bert, gpt and elmo.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from accelerate.state import AcceleratorState
from option_coverage import proves
from safetensors.torch import load_file
from test_trainer import NoisyCollator, TinyConfig, TinyLM, tiny_dataset

from egbert.config import TrainingArguments
from egbert.pretrain.run import parse_pretrain_args
from egbert.training.batches import TrainingData
from egbert.training.model_saving import SavedWithModel
from egbert.training.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread_and_fresh_accelerate")

SEQ = 8  # tiny_dataset's sequence length


def options(out: Path, *argv: str) -> TrainingArguments:
    """The trainer's options of `egbert pretrain --model gpt ... ARGV` (gpt's recipe under)."""
    required = ["--model", "gpt", "--tokenizer", "tok", "--train-files", "a.txt"]
    required += ["--output-dir", str(out), "--report-to", "none", "--log-every", "1"]
    return parse_pretrain_args([*required, *argv])[3]


def trainer_of(args: TrainingArguments, size: int = 24, eval_size: int = 0, **model) -> Trainer:
    """A Trainer of TinyLM (no dropout unless given) on `size` noiseless sequences."""
    torch.manual_seed(0)
    evaluation = {"eval": tiny_dataset(eval_size), "eval_collator": NoisyCollator(0.0)}
    return Trainer(
        TinyLM(TinyConfig(**{"dropout": 0.0, **model})),
        TrainingData(tiny_dataset(size), NoisyCollator(0.0), **(evaluation if eval_size else {})),
        args,
        saved_with_model=SavedWithModel(run_config={"model": {"hidden_size": 16}}),
    )


def fresh_accelerate() -> None:
    """Accelerate's state is process-wide (the precision, the device): a trainer built after
    another with other options needs it cleared."""
    AcceleratorState._reset_state(reset_partial_state=True)


def records(trainer: Trainer, split: str) -> list[dict]:
    return [record for record in trainer.log.records() if record["split"] == split]


def whole_batch(size: int = 24) -> dict[str, torch.Tensor]:
    """All `size` sequences in one batch: the mean loss over it does not depend on their order,
    so it is the loss of any step that sees them all."""
    return NoisyCollator(0.0)(tiny_dataset(size))


def tiny_lm() -> TinyLM:
    torch.manual_seed(0)  # the weights trainer_of starts from
    return TinyLM(TinyConfig(dropout=0.0))


def decays(name: str, param: torch.nn.Parameter) -> bool:
    """AdamW's decay goes on matrices only, never on biases and norms (docs/training.md)."""
    return param.ndim >= 2 and "norm" not in name


# ---------------------------------------------------------------- AdamW, clipping, accumulation


@proves("pretrain", "--lr", "--adam-beta1", "--adam-beta2", "--adam-epsilon", "--weight-decay")
def test_adamw_gets_the_options(tmp_path):
    argv = ["--lr", "0.02", "--adam-beta1", "0.8", "--adam-beta2", "0.95"]
    argv += ["--adam-epsilon", "1e-5", "--weight-decay", "0.3", "--schedule", "constant"]
    trainer = trainer_of(options(tmp_path, *argv))
    model = trainer.accelerator.unwrap_model(trainer.model)
    optimizer = trainer.optimizer.optimizer  # Accelerate's wrapper holds torch's AdamW
    assert isinstance(optimizer, torch.optim.AdamW)
    decay_of = {
        id(param): group["weight_decay"]
        for group in optimizer.param_groups
        for param in group["params"]
    }
    for name, param in model.named_parameters():
        assert decay_of[id(param)] == (0.3 if decays(name, param) else 0.0), name
    for group in optimizer.param_groups:
        assert group["betas"] == (0.8, 0.95) and group["eps"] == 1e-5 and group["lr"] == 0.02


@proves("pretrain", "--lr", "--adam-beta1", "--adam-beta2", "--adam-epsilon", "--weight-decay")
@proves("pretrain", "--grad-accum", "--batch-size")
def test_the_trainer_steps_as_a_plain_adamw_loop(tmp_path):
    """Three steps of two accumulated half batches equal three steps of torch's AdamW on the
    whole batch, with the options' lr, betas, epsilon and decay on the matrices only."""
    lr, betas, eps, decay = 0.05, (0.7, 0.9), 1e-3, 0.2
    argv = ["--lr", str(lr), "--adam-beta1", str(betas[0]), "--adam-beta2", str(betas[1])]
    argv += ["--adam-epsilon", str(eps), "--weight-decay", str(decay), "--schedule", "constant"]
    argv += ["--batch-size", "12", "--grad-accum", "2", "--max-steps", "3", "--max-grad-norm", "0"]
    trainer = trainer_of(options(tmp_path, *argv))
    trainer.train()

    model = tiny_lm()
    params = dict(model.named_parameters())
    groups = [
        {"params": [p for n, p in params.items() if decays(n, p)], "weight_decay": decay},
        {"params": [p for n, p in params.items() if not decays(n, p)], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps)
    for _ in range(3):
        model(**whole_batch()).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    trained = load_file(tmp_path / "model" / "model.safetensors")
    for name, param in params.items():
        torch.testing.assert_close(trained[name], param.detach(), atol=2e-6, rtol=0)


@pytest.mark.parametrize("max_norm", [0.05, 0.0])
@proves("pretrain", "--max-grad-norm")
def test_the_optimizer_steps_with_the_gradient_clipped_to_max_grad_norm(tmp_path, max_norm):
    trainer = trainer_of(options(tmp_path, "--max-grad-norm", str(max_norm), "--max-steps", "1"))
    seen = {}
    trainer.optimizer.optimizer.register_step_pre_hook(
        lambda optimizer, *_: seen.update(
            {id(p): p.grad.clone() for group in optimizer.param_groups for p in group["params"]}
        )
    )
    trainer.train()
    model = tiny_lm()
    model(**whole_batch()).loss.backward()
    unclipped = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm or math.inf)
    assert unclipped > 0.05 * 2  # the clipping has something to do
    trained = trainer.accelerator.unwrap_model(trainer.model).parameters()
    for param, stepped in zip(model.parameters(), trained, strict=True):
        torch.testing.assert_close(seen[id(stepped)].cpu(), param.grad, atol=1e-7, rtol=1e-5)


@proves("pretrain", "--batch-size", "--max-steps")
def test_each_step_trains_on_batch_size_sequences(tmp_path):
    trainer = trainer_of(options(tmp_path, "--batch-size", "5", "--max-steps", "3"))
    assert next(iter(trainer.train_loader))["input_ids"].shape == (5, SEQ)
    result = trainer.train()
    assert result.step == 3 and result.tokens == 3 * 5 * SEQ


@pytest.mark.parametrize(
    ("argv", "steps"), [(["--epochs", "2"], 12), (["--epochs", "2", "--max-steps", "5"], 5)]
)
@proves("pretrain", "--epochs", "--max-steps")
def test_a_run_is_its_epochs_of_steps_unless_max_steps_says_otherwise(tmp_path, argv, steps):
    """24 sequences in batches of 4: 6 steps an epoch."""
    trainer = trainer_of(options(tmp_path, "--batch-size", "4", *argv))
    result = trainer.train()
    assert trainer.total_steps == result.step == steps


# ---------------------------------------------------------------- the learning rate


def schedule_lr(schedule: str, step: int, total: int, warmup: int, peak: float) -> float:
    """The rate of update step + 1 (`step` updates done): transformers' get_*_schedule_with_warmup
    for linear, cosine and constant; the Noam rule of "Attention Is All You Need" (d_model 16:
    TinyLM's hidden size) for inverse_sqrt."""
    if schedule == "inverse_sqrt":
        n = step + 1
        return peak * 16**-0.5 * min(n**-0.5, n * warmup**-1.5)
    if step < warmup:
        return peak * step / warmup
    progress = (step - warmup) / (total - warmup)
    return (
        peak
        * {
            "linear": 1 - progress,
            "cosine": 0.5 * (1 + math.cos(math.pi * progress)),
            "constant": 1.0,
            # stable at the peak, then linearly to 0 over the last 20% of the run (--wsd-decay)
            "wsd": min(1.0, (total - step) / (0.2 * total)),
        }[schedule]
    )


@pytest.mark.parametrize("schedule", ["linear", "cosine", "constant", "inverse_sqrt", "wsd"])
@pytest.mark.parametrize("warmup", [["--warmup-steps", "3"], ["--warmup-ratio", "0.375"]])
@proves("pretrain", "--schedule", "--warmup-steps", "--warmup-ratio", "--lr")
def test_each_step_runs_at_the_rate_of_the_schedule(tmp_path, schedule, warmup):
    """8 steps, 3 of them warmup (3 steps, or 0.375 of 8)."""
    if schedule == "inverse_sqrt" and warmup[0] == "--warmup-ratio":
        pytest.skip("inverse_sqrt takes its warmup in steps")
    argv = ["--schedule", schedule, *warmup, "--lr", "0.5", "--max-steps", "8"]
    trainer = trainer_of(options(tmp_path, *argv))
    trainer.train()
    expected = [schedule_lr(schedule, step, 8, 3, 0.5) for step in range(8)]
    assert [record["lr"] for record in records(trainer, "train")] == pytest.approx(expected)


@proves("pretrain", "--schedule", "--wsd-decay")
def test_wsd_decays_over_the_share_of_the_run_wsd_decay_names(tmp_path):
    """8 steps, warmup 2, the last half decaying: 0, 0.5, then 1 until step 4, then 8 - step
    quarters of the peak."""
    argv = ["--schedule", "wsd", "--wsd-decay", "0.5", "--warmup-steps", "2", "--lr", "0.4"]
    trainer = trainer_of(options(tmp_path, *argv, "--max-steps", "8"))
    trainer.train()
    expected = [0.0, 0.2, 0.4, 0.4, 0.4, 0.3, 0.2, 0.1]
    assert [record["lr"] for record in records(trainer, "train")] == pytest.approx(expected)


# ---------------------------------------------------------------- Muon


MUON_OPTIONS = ["--optim", "muon", "--muon-lr", "0.03", "--muon-weight-decay", "0.05"]
MUON_OPTIONS += ["--muon-momentum", "0.8", "--lr", "0.02", "--weight-decay", "0.3"]


@proves("pretrain", "--optim", "--muon-lr", "--muon-weight-decay", "--muon-momentum")
def test_muon_gets_its_options_and_the_matrices_adamw_the_rest(tmp_path):
    """TinyLM's body is the model itself: its one matrix that is no embedding is the head."""
    trainer = trainer_of(options(tmp_path, *MUON_OPTIONS, "--schedule", "constant"))
    model = trainer.accelerator.unwrap_model(trainer.model)
    optimizer = trainer.optimizer.optimizer
    (muon_group,) = optimizer.muon.param_groups
    assert [id(param) for param in muon_group["params"]] == [id(model.head.weight)]
    assert (muon_group["lr"], muon_group["weight_decay"], muon_group["momentum"]) == (
        0.03,
        0.05,
        0.8,
    )
    adamw_decay = {
        id(param): group["weight_decay"]
        for group in optimizer.adamw.param_groups
        for param in group["params"]
    }
    rest = {name for name, param in model.named_parameters() if param is not model.head.weight}
    assert {name for name, p in model.named_parameters() if id(p) in adamw_decay} == rest
    for name, param in model.named_parameters():
        if name in rest:
            assert adamw_decay[id(param)] == (0.3 if decays(name, param) else 0.0), name
    assert all(group["lr"] == 0.02 for group in optimizer.adamw.param_groups)
    assert optimizer.param_groups == optimizer.muon.param_groups + optimizer.adamw.param_groups


@proves("pretrain", "--optim", "--muon-lr", "--muon-weight-decay", "--muon-momentum")
@proves("pretrain", "--grad-accum")
def test_the_trainer_steps_as_a_plain_muon_and_adamw_loop(tmp_path):
    """Three steps of two accumulated half batches equal three steps of torch's Muon on the
    head (Moonshot's lr scaling) and AdamW on the rest, on the whole batch."""
    argv = [*MUON_OPTIONS, "--schedule", "constant", "--max-grad-norm", "0"]
    argv += ["--batch-size", "12", "--grad-accum", "2", "--max-steps", "3"]
    trainer_of(options(tmp_path, *argv)).train()

    model = tiny_lm()
    params = dict(model.named_parameters())
    muon = torch.optim.Muon(
        [model.head.weight],
        lr=0.03,
        weight_decay=0.05,
        momentum=0.8,
        adjust_lr_fn="match_rms_adamw",
    )
    rest = {name: param for name, param in params.items() if name != "head.weight"}
    groups = [
        {"params": [p for n, p in rest.items() if decays(n, p)], "weight_decay": 0.3},
        {"params": [p for n, p in rest.items() if not decays(n, p)], "weight_decay": 0.0},
    ]
    adamw = torch.optim.AdamW(groups, lr=0.02)
    for _ in range(3):
        model(**whole_batch()).loss.backward()
        for optimizer in (muon, adamw):
            optimizer.step()
            optimizer.zero_grad()
    trained = load_file(tmp_path / "model" / "model.safetensors")
    for name, param in params.items():
        torch.testing.assert_close(trained[name], param.detach(), atol=2e-6, rtol=0)


@pytest.mark.parametrize("family", ["bert", "gpt", "elmo"])
def test_muon_takes_the_bodys_matrices_and_leaves_embeddings_and_heads_to_adamw(family):
    """bert's pretraining heads (the MLM transform, NSP) lie outside its body; the LM heads of
    bert and gpt are the embedding table; elmo's body holds its LSTMs' three matrices."""
    from egbert.models import bert, elmo, gpt
    from egbert.training.optimization import muon_matrices

    config_class = {"bert": bert.EgbertBertConfig, "gpt": gpt.EgbertGPTConfig}
    config_class["elmo"] = elmo.EgbertElmoConfig
    model_class = {"bert": bert.EgbertBertForPreTraining, "gpt": gpt.EgbertGPTForCausalLM}
    model_class["elmo"] = elmo.EgbertElmoForBidirectionalLM
    size = {"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 1}
    if family != "elmo":
        size |= {"num_attention_heads": 2, "intermediate_size": 32}
    model = model_class[family](config_class[family](**size))
    chosen = {id(param) for param in muon_matrices(model)}
    names = sorted(name for name, param in model.named_parameters() if id(param) in chosen)
    expected = {
        "bert": ["bert.layers.0.attention.out.weight", "bert.layers.0.attention.qkv.weight"]
        + ["bert.layers.0.feed_forward.down.weight", "bert.layers.0.feed_forward.up.weight"]
        + ["bert.pooler.weight"],
        "gpt": ["gpt.layers.0.attention.out.weight", "gpt.layers.0.attention.qkv.weight"]
        + ["gpt.layers.0.feed_forward.down.weight", "gpt.layers.0.feed_forward.up.weight"],
        "elmo": [
            f"elmo.{direction}_lstm.layers.0.weight_{kind}_l0"
            for direction in ("backward", "forward")
            for kind in ("hh", "hr", "ih")
        ],
    }[family]
    assert names == expected


def test_muon_lr_unset_is_the_adamw_lr(tmp_path):
    trainer = trainer_of(options(tmp_path, "--optim", "muon", "--lr", "0.07"))
    assert trainer.optimizer.optimizer.muon.param_groups[0]["initial_lr"] == 0.07


@pytest.mark.parametrize("engine", ["FSDP", "DEEPSPEED"])
def test_muon_is_refused_where_the_engine_shards_or_owns_the_optimizer(engine):
    from accelerate.utils import DistributedType

    from egbert.errors import ConfigError
    from egbert.training.optimization import check_muon_engine

    with pytest.raises(ConfigError, match="--optim muon does not run under .*--optim adamw"):
        check_muon_engine("muon", DistributedType[engine])
    check_muon_engine("adamw", DistributedType[engine])
    check_muon_engine("muon", DistributedType.MULTI_CPU)


# ---------------------------------------------------------------- precision, smoothing, device


@pytest.mark.parametrize(("flag", "dtype"), [("true", torch.bfloat16), ("false", torch.float32)])
@proves("pretrain", "--bf16")
def test_bf16_runs_the_training_forward_in_bfloat16(tmp_path, flag, dtype):
    fresh_accelerate()  # the precision is process-wide
    trainer = trainer_of(options(tmp_path, "--bf16", flag, "--max-steps", "1"))
    seen = []
    model = trainer.accelerator.unwrap_model(trainer.model)
    model.head.register_forward_hook(lambda module, inputs, output: seen.append(output.dtype))
    trainer.train()
    fresh_accelerate()
    assert seen == [dtype]


@proves("pretrain", "--use-cpu", "--ddp-find-unused-parameters")
def test_the_accelerator_gets_the_device_and_ddp_options(tmp_path, monkeypatch):
    """As on a machine with a GPU (Accelerate falls back to the CPU where there is none)."""
    from egbert.training import runtime

    monkeypatch.setattr(runtime, "has_accelerator", lambda: True)
    for given in (False, True):
        fresh_accelerate()
        argv = ["--use-cpu", str(given), "--ddp-find-unused-parameters", str(given)]
        accelerator = trainer_of(options(tmp_path / str(given), *argv)).accelerator
        assert accelerator.state._cpu is given  # Accelerator(cpu=...): the CPU even by a GPU
        assert accelerator.ddp_handler.find_unused_parameters is given
    fresh_accelerate()


@proves("pretrain", "--num-workers")
def test_num_workers_collate_in_that_many_loader_processes(tmp_path):
    assert trainer_of(options(tmp_path / "a", "--num-workers", "0")).train_loader.num_workers == 0
    assert trainer_of(options(tmp_path / "b", "--num-workers", "3")).train_loader.num_workers == 3
    default = trainer_of(options(tmp_path / "c"))
    on_cpu = default.accelerator.device.type == "cpu"
    assert default.train_loader.num_workers == (0 if on_cpu else 2)  # docs/training.md


# ---------------------------------------------------------------- intervals, files, trackers


@proves("pretrain", "--log-every", "--eval-every", "--save-every", "--keep-checkpoints")
@proves("pretrain", "--output-dir")
def test_logs_evaluations_and_checkpoints_come_at_their_intervals(tmp_path):
    out = tmp_path / "run"
    argv = ["--max-steps", "6", "--log-every", "2", "--eval-every", "3", "--save-every", "1"]
    trainer = trainer_of(options(out, *argv, "--keep-checkpoints", "3"), eval_size=8)
    trainer.train()
    assert [record["step"] for record in records(trainer, "train")] == [2, 4, 6]
    assert [record["step"] for record in records(trainer, "eval")] == [3, 6]
    checkpoints = sorted(path.name for path in (out / "checkpoints").iterdir())
    assert checkpoints == ["step-4", "step-5", "step-6"]  # saved at every step, the last 3 kept
    assert (out / "model" / "model.safetensors").is_file()


@proves("pretrain", "--eval-every-minutes")
def test_evaluations_come_at_minute_marks_of_the_training_time(tmp_path):
    """A replayed clock (--replay-clock) sets each step's training time: marks every minute are
    passed after steps 3 (70 s), 5 (130 s) and 6 (250 s: two marks at once, one evaluation),
    and each evaluation records the training time it came at."""
    clock = tmp_path / "clock"
    clock.mkdir()
    readings = [20.0, 50.0, 70.0, 100.0, 130.0, 250.0, 260.0]
    (clock / "clock.json").write_text(json.dumps({"elapsed_seconds": readings}))
    argv = ["--max-steps", "7", "--replay-clock", str(clock), "--eval-every-minutes", "1"]
    trainer = trainer_of(options(tmp_path / "run", *argv), eval_size=8)
    trainer.train()
    evaluations = records(trainer, "eval")
    assert [record["step"] for record in evaluations] == [3, 5, 6, 7]  # 7: the run's end
    assert [record["elapsed_s"] for record in evaluations] == [70.0, 130.0, 250.0, 260.0]


@proves("pretrain", "--report-to")
def test_report_to_tensorboard_writes_the_records_for_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer = trainer_of(options(tmp_path / "tb", "--max-steps", "3", "--report-to", "tensorboard"))
    trainer.train()
    events = EventAccumulator(str(next((tmp_path / "tb" / "logs").rglob("events.out.*")).parent))
    events.Reload()
    logged = {event.step: event.value for event in events.Scalars("train/loss")}
    expected = {record["step"]: record["loss"] for record in records(trainer, "train")}
    assert list(logged) == list(expected) == [1, 2, 3]
    assert list(logged.values()) == pytest.approx(list(expected.values()))
    fresh_accelerate()
    trainer_of(options(tmp_path / "none", "--max-steps", "1")).train()
    assert not (tmp_path / "none" / "logs").exists()


@proves("pretrain", "--greater-is-better", "--metric-for-best-model")
def test_greater_is_better_keeps_the_evaluation_with_the_largest_metric(tmp_path):
    argv = ["--max-steps", "12", "--eval-every", "3", "--lr", "0.3", "--metric-for-best-model"]
    trainer = trainer_of(options(tmp_path, *argv, "loss", "--greater-is-better"), eval_size=8)
    result = trainer.train()
    losses = {record["step"]: record["loss"] for record in records(trainer, "eval")}
    assert result.best_step == max(losses, key=losses.get) != min(losses, key=losses.get)
    assert result.metrics["loss"] == pytest.approx(max(losses.values()))


# ---------------------------------------------------------------- resume


@pytest.mark.parametrize("optim", ["adamw", "muon"])
@proves("pretrain", "--resume")
def test_resume_goes_on_to_the_weights_of_an_uninterrupted_run(tmp_path, optim):
    """Dropout and noisy inputs: the checkpoint must bring back the RNG, the optimizer (Muon's
    momentum and AdamW's moments with --optim muon) and the place in the epoch for the resumed
    steps to be the uninterrupted run's."""
    argv = ["--schedule", "constant", "--lr", "0.05", "--save-every", "2", "--optim", optim]
    uninterrupted = options(tmp_path / "whole", *argv, "--max-steps", "4")
    torch.manual_seed(0)
    data = TrainingData(tiny_dataset(24), NoisyCollator(0.2))
    Trainer(TinyLM(TinyConfig()), data, uninterrupted).train()
    for seed, steps, resume in ((0, "2", []), (1, "4", ["--resume"])):
        fresh_accelerate()
        args = options(tmp_path / "resumed", *argv, "--max-steps", steps, *resume)
        torch.manual_seed(seed)  # the resumed run's weights must come from the checkpoint
        Trainer(
            TinyLM(TinyConfig()), TrainingData(tiny_dataset(24), NoisyCollator(0.2)), args
        ).train()
    whole = load_file(tmp_path / "whole/model/model.safetensors")
    resumed = load_file(tmp_path / "resumed/model/model.safetensors")
    for name, tensor in whole.items():
        torch.testing.assert_close(resumed[name], tensor, atol=1e-6, rtol=0)
    lines = (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3, 4]


# ---------------------------------------------------------------- label smoothing


@proves("pretrain", "--label-smoothing")
def test_training_loss_is_smoothed_by_label_smoothing(tmp_path):
    trainer = trainer_of(options(tmp_path, "--label-smoothing", "0.2", "--max-steps", "1"))
    batch = whole_batch()
    logits = tiny_lm()(batch["input_ids"]).logits
    flat_logits, targets = logits[:, :-1].reshape(-1, logits.size(-1)), batch["labels"][:, 1:]
    smoothed = F.cross_entropy(flat_logits, targets.reshape(-1), label_smoothing=0.2)
    unsmoothed = F.cross_entropy(flat_logits, targets.reshape(-1))
    trainer.train()
    logged = records(trainer, "train")[0]["loss"]
    assert logged == pytest.approx(smoothed.item(), rel=1e-6)
    assert logged != pytest.approx(unsmoothed.item(), rel=1e-3), "the option changed the loss"
    assert trainer.accelerator.unwrap_model(trainer.model).config.label_smoothing == 0.0
