"""The step's numbers the trainer logs and keeps (egbert/training/step_numbers.py), each rule
checked against a value worked out here: which loss parts are logged, the FLOPs per token of
MFU, the messages of skipped steps, and the clock a finished run leaves for --replay-clock."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from accelerate import Accelerator
from torch import nn
from transformers import BertConfig, BertForSequenceClassification
from transformers.utils import ModelOutput

from egbert.errors import ConfigError, TrainingError
from egbert.training import step_numbers
from egbert.training.step_numbers import (
    CLOCK_FILE,
    Agreement,
    ReplayedClock,
    StepLedger,
    StepNumbers,
    TrainingClock,
    agrees_each_step,
    default_flops_per_token,
    loss_parts,
    precision_record,
    read_clock,
    skip_nonfinite_step,
    skip_overflow_step,
    training_clock,
    write_clock,
)


def test_the_log_shows_the_loss_and_each_scalar_loss_part_only():
    outputs = ModelOutput(
        loss=torch.tensor(2.0, dtype=torch.bfloat16, requires_grad=True),
        mlm_loss=torch.tensor(1.5),
        token_loss=torch.ones(3),  # a loss per token, not a scalar
        accuracy=torch.tensor(0.5),  # a scalar that is not a loss
    )
    parts = loss_parts(outputs)
    assert sorted(parts) == ["loss", "mlm_loss"]
    assert parts["loss"].dtype == torch.float32 and not parts["loss"].requires_grad
    assert parts["mlm_loss"].item() == 1.5


def test_mfu_counts_a_models_own_flops_else_six_per_weight_outside_the_embeddings():
    class Counted(nn.Module):
        def flops_per_token(self, seq_len: int) -> float:
            return 10.0 * seq_len

    assert default_flops_per_token(Counted())(7) == 70.0
    config = BertConfig(
        vocab_size=50, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=16, max_position_embeddings=32, num_labels=3,
    )  # fmt: skip
    model = BertForSequenceClassification(config)
    embedding_weights = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    by_hand = sum(p.numel() for p in model.parameters() if id(p) not in embedding_weights)
    assert by_hand < sum(p.numel() for p in model.parameters())
    assert default_flops_per_token(model)(128) == 6.0 * by_hand
    assert default_flops_per_token(nn.Linear(2, 2)) is None  # no way to count: no MFU


def test_a_skipped_step_is_counted_and_named_until_one_too_many():
    state = SimpleNamespace(skipped_nonfinite=0)
    found = (math.nan, (12, 1, 3))
    message = skip_nonfinite_step(state, found, 2)
    assert message == (
        "egbert: skipped a step with loss nan at step 12 (epoch 1, batch 3 of the epoch) "
        "(1 of 2 allowed)"
    )
    assert skip_nonfinite_step(state, found, 2).endswith("(2 of 2 allowed)")
    with pytest.raises(TrainingError, match=r"^the loss is nan at step 12 .* --skip-nonfinite N"):
        skip_nonfinite_step(state, found, 2)
    assert state.skipped_nonfinite == 3


def test_an_fp16_overflow_is_counted_and_its_scale_logged():
    state = SimpleNamespace(step=4, skipped_overflow=0)
    assert precision_record(state, None) == {}  # not fp16: nothing to log
    assert skip_overflow_step(state, 32768.0) == (
        "egbert: fp16 gradients overflowed at step 5; update skipped, loss scale lowered to "
        "32768 (1 skipped so far)"
    )
    assert precision_record(state, 32768.0) == {"loss_scale": 32768.0, "skipped_overflow": 1}
    assert skip_overflow_step(state, 16384.0).endswith("to 16384 (2 skipped so far)")


def test_a_replayed_clock_gives_the_recorded_readings_then_refuses_to_go_on():
    clock = ReplayedClock([1.0, 2.5, 4.0], done=1, source="runs/first")
    cpu = torch.device("cpu")
    assert [clock.advance(0.0, cpu, print), clock.advance(9.0, cpu, print)] == [2.5, 4.0]
    with pytest.raises(TrainingError) as error:
        clock.advance(0.0, cpu, print)
    assert str(error.value) == (
        "--replay-clock runs/first: that run ended after 3 steps and this one goes on; replay "
        "it with that run's options, data and seed"
    )


def test_the_clock_is_written_only_when_every_step_has_its_reading(tmp_path):
    readings = [0.5, 1.0, 1.5, 2.0]  # three steps trained and one skipped
    write_clock(tmp_path, SimpleNamespace(step=3, skipped_nonfinite=1, clock_readings=readings))
    assert json.loads((tmp_path / CLOCK_FILE).read_text()) == {"elapsed_seconds": readings}
    assert read_clock(str(tmp_path)) == readings
    later = tmp_path / "resumed"
    later.mkdir()  # resumed from a checkpoint that kept no readings: the first ones are missing
    write_clock(later, SimpleNamespace(step=5, skipped_nonfinite=0, clock_readings=readings))
    assert not (later / CLOCK_FILE).exists()
    with pytest.raises(ConfigError) as error:
        read_clock(str(later))
    assert str(error.value) == (
        f"--replay-clock {later}: no clock.json there; pass the folder of a finished training "
        "run (egbert writes its clock at the end of each run)"
    )


def test_the_training_clock_leaves_out_the_compile_step_and_paused_time(monkeypatch):
    """Wall-clock readings scripted here: the first step with --compile (2.5 s) is said and
    kept apart; later steps add their time; what `paused()` spans (7 s) is not training."""
    readings = iter([10.0, 12.5, 13.0, 13.0, 20.0, 21.0])
    monkeypatch.setattr(step_numbers.time, "perf_counter", lambda: next(readings))
    said, cpu = [], torch.device("cpu")
    clock = TrainingClock(compiling=True)
    assert clock.advance(4.0, cpu, said.append) == 4.0
    assert clock.compile_seconds == 2.5 and not clock.compiling
    assert said == [
        "egbert: compiled the model in 2.5 s (the first step; left out of the training time, "
        "tokens/s and MFU)"
    ]
    assert clock.advance(4.0, cpu, said.append) == 4.5
    with clock.paused():
        pass
    assert clock.advance(4.5, cpu, said.append) == 5.5
    assert clock.compile_seconds == 2.5 and len(said) == 1


def losses(loss: float, mlm: float) -> dict[str, torch.Tensor]:
    return {"loss": torch.tensor(loss), "mlm_loss": torch.tensor(mlm)}


def test_the_ledger_sums_steps_until_they_agree_and_logs_their_means(
    one_thread_and_fresh_accelerate,
):
    """Numbers worked out by hand for one process: two steps agreed (their tokens, FLOPs and
    loss sums), the log's means over them and tokens/s over the window's seconds; then three
    steps with a NaN and an inf loss, where the first bad one is named and nothing is added."""
    accelerator = Accelerator(cpu=True)
    cpu = accelerator.device
    ledger = StepLedger(accelerator, elapsed_seconds=1.0, flops=False)
    ledger.add(StepNumbers(10, 100.0, losses(2.0, 1.5), cpu), (1, 0, 0))
    ledger.add(StepNumbers(torch.tensor(20), torch.tensor(300.0), losses(4.0, 2.5), cpu), (2, 0, 1))
    state = SimpleNamespace(elapsed_seconds=5.0, tokens_seen=7, step=2, epoch=0)
    assert ledger.agree(state, stop=False) == Agreement(
        steps=2,
        tokens=30.0,
        timed_tokens=30.0,
        flops=400.0,
        losses={"loss": 6.0, "mlm_loss": 4.0},
        elapsed_seconds=5.0,
        stop=False,
        first_nonfinite=None,
    )
    assert state.tokens_seen == 37
    assert ledger.record(state, lr=0.1) == {
        "step": 2,
        "epoch": 0,
        "loss": 3.0,
        "mlm_loss": 2.0,
        "lr": 0.1,
        "tokens_per_s": 7.5,
        "elapsed_s": 5.0,
    }
    for place, loss in [((3, 0, 2), 1.0), ((4, 0, 3), math.nan), ((5, 1, 0), math.inf)]:
        ledger.add(StepNumbers(5, 0.0, losses(loss, 1.0), cpu), place)
    state.elapsed_seconds = 86400.123456  # a day in: float32 would make it 86400.125
    agreed = ledger.agree(state, stop=True)
    assert (agreed.steps, agreed.tokens, agreed.stop) == (3, 15, True)
    assert agreed.elapsed_seconds == state.elapsed_seconds == 86400.123456
    assert math.isnan(agreed.first_nonfinite[0]) and agreed.first_nonfinite[1] == (4, 0, 3)
    assert state.tokens_seen == 37 and ledger.window.steps == 0
    assert ledger.record(state, lr=0.1)["tokens_per_s"] == 0.0  # the window since 5.0 s


def test_mfu_is_the_steps_flops_per_second_over_the_measured_peak(one_thread_and_fresh_accelerate):
    accelerator = Accelerator(cpu=True)
    ledger = StepLedger(accelerator, elapsed_seconds=0.0, flops=True)
    ledger.add(StepNumbers(10, 123456789.0, losses(2.0, 1.0), accelerator.device), (1, 0, 0))
    state = SimpleNamespace(elapsed_seconds=4.0, tokens_seen=0, step=1, epoch=0)
    assert ledger.agree(state, stop=False).flops == 123456789.0  # float32 would give ...792
    record = ledger.record(state, lr=0.1)
    assert ledger.matmul_peak_flops > 0
    assert record["mfu"] == pytest.approx(123456789.0 / 4.0 / ledger.matmul_peak_flops)
    assert "mfu" not in StepLedger(accelerator, 0.0, flops=False).record(state, lr=0.1)


def test_a_plain_output_logs_its_loss_alone():
    assert loss_parts(SimpleNamespace(loss=torch.tensor(2.0), mlm_loss=torch.tensor(1.0))) == {
        "loss": torch.tensor(2.0)
    }


@pytest.mark.parametrize(
    ("skip_nonfinite", "timed", "processes", "each_step"),
    [
        (0, False, 1, False),
        (1, False, 1, True),
        (0, True, 2, True),
        (0, True, 1, False),
        (0, False, 2, False),
    ],
)
def test_processes_agree_each_step_only_to_skip_a_step_or_share_a_clock(
    skip_nonfinite, timed, processes, each_step
):
    """`timed`: a budget or --eval-every-minutes, which read the elapsed time every step."""
    assert agrees_each_step(skip_nonfinite, timed, processes) is each_step


def test_the_clock_is_the_wall_clock_unless_a_run_is_replayed():
    wall = training_clock(True, None, None, None)
    assert isinstance(wall, TrainingClock) and wall.compiling
    state = SimpleNamespace(clock_readings=[1.0])
    replayed = training_clock(False, "runs/first", [1.0, 2.0], state)
    assert replayed.advance(0.0, torch.device("cpu"), print) == 2.0  # goes on after step 1
    with pytest.raises(TrainingError, match=r"^--replay-clock runs/first: that run ended"):
        replayed.advance(0.0, torch.device("cpu"), print)


def test_loss_sums_keep_float64s_precision(one_thread_and_fresh_accelerate):
    """float32 losses of 1e8 and 1.0 sum to 1e8 in float32; the ledger sums in float64."""
    accelerator = Accelerator(cpu=True)
    ledger = StepLedger(accelerator, elapsed_seconds=0.0, flops=False)
    for loss in (1e8, 1.0):
        ledger.add(StepNumbers(1, 0.0, losses(loss, 0.0), accelerator.device), (1, 0, 0))
    state = SimpleNamespace(elapsed_seconds=1.0, tokens_seen=0, step=2, epoch=0)
    assert ledger.agree(state, stop=False).losses["loss"] == 100000001.0
