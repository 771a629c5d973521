"""Training on the GPUs people have (issue 62), proved on the CPU: fp16 with dynamic loss scaling
(egbert's own autocast and torch.amp.GradScaler("cpu") there, the path Accelerate takes on a GPU),
gradient checkpointing, and --auto-find-batch-size.

The expectations come from outside the code: torch's GradScaler documents its initial scale
(2**16) and its backoff (halving on an overflow); gradient checkpointing must give the plain
run's gradients; a batch halved with the accumulation doubled must train as the run started with
that batch and accumulation would.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import fresh_accelerate
from option_coverage import proves
from safetensors.torch import load_file
from test_trainer import NoisyCollator, TinyConfig, TinyLM, TinyOutput, epoch_order, tiny_dataset
from torch import nn

from egbert.config import TrainingArguments
from egbert.errors import ConfigError
from egbert.models.bert import EgbertBertConfig, EgbertBertForPreTraining
from egbert.models.elmo import EgbertElmoConfig, EgbertElmoForBidirectionalLM
from egbert.models.gpt import EgbertGPTConfig, EgbertGPTForCausalLM
from egbert.training.batches import TrainingData
from egbert.training.model_saving import SavedWithModel
from egbert.training.runtime import check_bf16_supported
from egbert.training.trainer import Trainer, enable_gradient_checkpointing

pytestmark = pytest.mark.usefixtures("one_thread_and_fresh_accelerate")

# torch.amp.GradScaler's documented defaults: init_scale 2**16, backoff_factor 0.5
INITIAL_SCALE, BACKOFF = 2.0**16, 0.5


class Killed(Exception):
    """The process dies here (as under SIGKILL: nothing after the last checkpoint is saved)."""


class Harness(nn.Module):
    """TinyLM, with what a test needs around its forward: the loss multiplied by 1e4 on the
    batches holding the example `boosted` (its gradients overflow fp16 then, its loss stays
    finite), a real torch.OutOfMemoryError for batches above `fits` examples from forward call
    `tight_from` on, and a death at forward call `die_at`. Counts the calls and the
    out-of-memory ones, and keeps autocast's dtype and the examples (label rows) trained on."""

    def __init__(
        self,
        boosted: int | None = None,
        fits: int | None = None,
        die_at: int = 0,
        tight_from: int = 1,
    ):
        super().__init__()
        torch.manual_seed(0)
        self.inner = TinyLM(TinyConfig(dropout=0.1))
        self.config = self.inner.config
        rows = [e["input_ids"] for e in tiny_dataset() if e["id"] == boosted]
        self.register_buffer("boosted", torch.tensor(rows), persistent=False)  # on the run's device
        self.fits, self.die_at, self.tight_from = fits, die_at, tight_from
        self.calls, self.out_of_memory, self.dtypes, self.rows = 0, 0, set(), []

    def forward(self, input_ids, attention_mask=None, labels=None, label_smoothing=None):
        self.calls += 1
        if self.calls == self.die_at:
            raise Killed
        tight = self.fits is not None and self.calls >= self.tight_from
        if tight and input_ids.shape[0] > self.fits:
            self.out_of_memory += 1
            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.75 GiB total capacity)"
            )
        outputs = self.inner(input_ids, attention_mask, labels, label_smoothing)
        self.rows += [tuple(row) for row in labels.tolist()]
        self.dtypes.add(outputs.logits.dtype)
        if len(self.boosted) and (labels.unsqueeze(1) == self.boosted).all(-1).any():
            return TinyOutput(outputs.loss * 1e4, outputs.logits)
        return outputs


def train(out: Path, model: Harness | nn.Module, **options) -> Trainer:
    defaults = {"lr": 3e-2, "batch_size": 4, "max_steps": 4, "log_every": 1, "seed": 1}
    defaults["report_to"] = ["none"]
    args = TrainingArguments(output_dir=str(out), **{**defaults, **options})
    run_config = {"model": {"hidden_size": 16}, "seq_len": 8}
    saved_with_model = SavedWithModel(run_config=run_config)
    trainer = Trainer(
        model,
        TrainingData(tiny_dataset(), NoisyCollator()),
        args,
        saved_with_model=saved_with_model,
    )
    try:
        trainer.train()
    finally:
        fresh_accelerate()
    return trainer


def train_records(out: Path) -> list[dict]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [record for record in records if record["split"] == "train"]


def weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(out / "model" / "model.safetensors")


def assert_same_weights(first: Path, second: Path, atol: float = 0.0) -> None:
    a, b = weights(first), weights(second)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=atol, rtol=0)


# ---------------------------------------------------------------- fp16


@proves("pretrain", "--fp16")
def test_fp16_trains_in_float16_within_its_tolerance_of_fp32(tmp_path, monkeypatch):
    """--fp16 on the CPU: the forward runs in float16 (autocast), the log carries the loss scale
    (GradScaler's initial 2**16, no overflow here) and the losses stay within fp16's precision of
    the fp32 run's; a launch config's `mixed_precision: fp16` trains the same run."""
    fp32, fp16 = Harness(), Harness()
    train(tmp_path / "fp32", fp32)
    train(tmp_path / "fp16", fp16, fp16=True)
    assert fp32.dtypes == {torch.float32} and fp16.dtypes == {torch.float16}
    records = train_records(tmp_path / "fp16")
    assert [record["loss_scale"] for record in records] == [INITIAL_SCALE] * 4
    assert "loss_scale" not in train_records(tmp_path / "fp32")[0]
    losses = [
        [record["loss"] for record in train_records(tmp_path / run)] for run in ("fp32", "fp16")
    ]
    # float16 keeps 11 significant bits (relative step 2**-11 ~ 5e-4); four steps of a model
    # two matmuls deep stay within 1e-2 of the loss, and far from equal
    assert losses[1] == pytest.approx(losses[0], rel=1e-2) and losses[1] != losses[0]
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    launched = Harness()
    train(tmp_path / "launched", launched)
    assert launched.dtypes == {torch.float16}
    assert_same_weights(tmp_path / "launched", tmp_path / "fp16")


def test_a_step_whose_fp16_gradients_overflow_is_skipped_counted_and_logged(tmp_path):
    """The second batch's loss, 1e4 times larger, overflows float16's gradients at scale 2**16:
    its update is not applied (the run still makes 4 updates, the scale halves once) and the log
    names it."""
    order = epoch_order(24, seed=1, epoch=0)
    model = Harness(boosted=order[4])  # the second batch of 4
    trainer = train(tmp_path, model, fp16=True, lr=1e-2)
    assert trainer.state.skipped_overflow == 1 and trainer.state.step == 4
    assert model.calls == 5
    records = train_records(tmp_path)
    assert [r["loss_scale"] for r in records] == [INITIAL_SCALE] + [INITIAL_SCALE * BACKOFF] * 3
    assert [r["skipped_overflow"] for r in records] == [0, 1, 1, 1]
    log = (tmp_path / "train.log").read_text()
    assert "fp16 gradients overflowed at step 2; update skipped, loss scale lowered to 32768" in log
    assert all(torch.isfinite(tensor).all() for tensor in weights(tmp_path).values())


@pytest.mark.parametrize("optim", ["adamw", "muon"])
@proves("pretrain", "--resume")
def test_the_loss_scale_survives_a_kill_and_the_resume_is_exact(tmp_path, optim):
    """An overflow at the second batch lowers the scale before checkpoint step-2; the process
    dies in step 3; resumed, the run goes on at the lowered scale (saved in the checkpoint, not
    GradScaler's initial one) and ends with the uninterrupted run's weights and losses; with
    Muon too (GradScaler unscales and skips both optimizers' steps as one)."""
    boosted = epoch_order(24, seed=1, epoch=0)[4]
    options = {"fp16": True, "save_every": 2, "schedule": "constant", "lr": 1e-2, "optim": optim}
    train(tmp_path / "clean", Harness(boosted), **options)
    with pytest.raises(Killed):
        train(tmp_path / "killed", Harness(boosted, die_at=4), **options)
    assert (tmp_path / "killed/checkpoints/step-2/scaler.pt").is_file()
    train(tmp_path / "killed", Harness(boosted), resume=True, **options)
    clean, resumed = train_records(tmp_path / "clean"), train_records(tmp_path / "killed")
    assert [r["loss_scale"] for r in resumed[-2:]] == [INITIAL_SCALE * BACKOFF] * 2
    assert [(r["loss"], r["loss_scale"]) for r in resumed[-2:]] == [
        (r["loss"], r["loss_scale"]) for r in clean[-2:]
    ]
    assert_same_weights(tmp_path / "killed", tmp_path / "clean")


def test_bf16_with_fp16_and_bf16_on_a_gpu_without_it_are_refused(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="--bf16 and --fp16 are two mixed precisions"):
        TrainingArguments(output_dir=str(tmp_path), bf16=True, fp16=True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *device: "Tesla T4")
    with pytest.raises(ConfigError) as refused:
        check_bf16_supported(True, "cuda")
    assert str(refused.value) == (
        "--bf16: this GPU (Tesla T4) has no bf16; train with --fp16 (fp16 with loss scaling) "
        "instead"
    )
    check_bf16_supported(True, "cpu")  # the CPU runs bf16 autocast
    check_bf16_supported(None, "cuda")  # --fp16, or bf16 left to the launch config


# ---------------------------------------------------------------- gradient checkpointing


def tiny_family_model(family: str) -> tuple[nn.Module, nn.Module, dict]:
    """A tiny model of `family` with dropout on, the module each layer's forward runs once per
    forward (twice with checkpointing: the recompute), and a batch with labels."""
    ids = torch.randint(1, 50, (3, 12), generator=torch.Generator().manual_seed(0))
    sizes = {"vocab_size": 50, "hidden_size": 16, "max_position_embeddings": 32}
    if family == "elmo":
        model = EgbertElmoForBidirectionalLM(EgbertElmoConfig(**sizes, cell_size=32))
        return model, model.elmo.forward_lstm.layers[1], {"input_ids": ids, "labels": ids}
    layers = {"num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 32}
    if family == "gpt":
        model = EgbertGPTForCausalLM(EgbertGPTConfig(**sizes, **layers))
        return model, model.gpt.layers[1].attention, {"input_ids": ids, "labels": ids}
    model = EgbertBertForPreTraining(EgbertBertConfig(**sizes, **layers))
    labels = torch.full_like(ids, -100)
    labels[:, 1::4] = ids[:, 1::4]
    batch = {"input_ids": ids, "labels": labels, "next_sentence_label": torch.tensor([0, 1, 1])}
    return model, model.bert.layers[1].attention, batch


@pytest.mark.parametrize("family", ["bert", "gpt", "elmo"])
def test_gradient_checkpointing_recomputes_the_layers_and_gives_the_same_gradients(family):
    """In fp32 with dropout on: every gradient within 1e-5 of the plain backward's, and the
    layers ran again in the backward pass (the recompute that saves their activations)."""
    gradients, calls = [], []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model, layer, batch = tiny_family_model(family)
        model.train()
        if checkpointing:
            enable_gradient_checkpointing(model)
        count = []
        layer.register_forward_pre_hook(lambda *_, count=count: count.append(1))
        torch.manual_seed(1)
        model(**batch).loss.backward()
        gradients.append(
            {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
        )
        calls.append(len(count))
    assert calls == [1, 2]
    assert gradients[0].keys() == gradients[1].keys()
    for name, gradient in gradients[0].items():
        torch.testing.assert_close(gradients[1][name], gradient, atol=1e-5, rtol=0)


@proves("pretrain", "--gradient-checkpointing")
def test_gradient_checkpointing_trains_the_run_it_would_train_without(tmp_path):
    """A tiny gpt trained 4 steps with --gradient-checkpointing: its layers recomputed in every
    backward, its weights those of the run without, within 1e-5; a model without the support is
    refused in one line."""
    counts = {}
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model, layer, _ = tiny_family_model("gpt")
        count = []
        layer.register_forward_pre_hook(lambda *_, count=count: count.append(1))
        out = tmp_path / str(checkpointing)
        train(out, model, gradient_checkpointing=checkpointing)
        counts[checkpointing] = len(count)
    assert counts == {False: 4, True: 8}
    assert_same_weights(tmp_path / "True", tmp_path / "False", atol=1e-5)
    with pytest.raises(ConfigError, match="--gradient-checkpointing: Harness does not support it"):
        train(tmp_path / "tiny", Harness(), gradient_checkpointing=True)


def test_gradient_checkpointing_trains_the_same_run_compiled(tmp_path):
    """--gradient-checkpointing with --compile: the compiled tiny gpt's checkpointed run ends
    with the weights of its compiled run without, within 1e-5, and its graph is another one (it
    keeps another number of elements for the backward, counted by a saved-tensors hook). torch's
    per-graph backend override makes the trainer's torch.compile aot_eager_decomp_partition:
    inductor's graphs and partitioner (what is saved, what recomputed), without its code
    generation. On these graphs checkpointing saves little: docs/performance.md."""
    kept = {}

    def count(tensor: torch.Tensor) -> torch.Tensor:
        kept[checkpointing] += tensor.numel()
        return tensor

    backend = ">=0:aot_eager_decomp_partition"
    with torch._dynamo.config.patch(debug_backend_override=backend):
        for checkpointing in (False, True):
            torch.manual_seed(0)
            model, _, _ = tiny_family_model("gpt")
            kept[checkpointing] = 0
            with torch.autograd.graph.saved_tensors_hooks(count, lambda tensor: tensor):
                trainer = train(tmp_path / str(checkpointing), model, compile=True,
                                gradient_checkpointing=checkpointing)  # fmt: skip
            assert trainer.clock.compile_seconds > 0  # it compiled
    assert kept[True] != kept[False], kept
    assert_same_weights(tmp_path / "True", tmp_path / "False", atol=1e-5)


SHARDED_CHECKPOINTING = """
import json, sys, torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
sys.path.insert(0, sys.argv[2])
from test_fit_the_gpu import tiny_family_model
from egbert.training.trainer import enable_gradient_checkpointing

torch.distributed.init_process_group("gloo", init_method=f"file://{sys.argv[1]}", rank=0,
                                     world_size=1)
mesh = init_device_mesh("cpu", (1,))
differences, calls = {}, {}
for family in ("bert", "gpt"):
    gradients = []
    for sharded in (False, True):
        torch.manual_seed(0)
        model, layer, batch = tiny_family_model(family)
        count = []
        layer.register_forward_pre_hook(lambda *_, count=count: count.append(1))
        model.train()
        if sharded:
            enable_gradient_checkpointing(model)
            for layer in getattr(model, family).layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
        torch.manual_seed(1)
        model(**batch).loss.backward()
        gradients.append({name: p.grad.full_tensor() if sharded else p.grad
                          for name, p in model.named_parameters() if p.grad is not None})
    assert gradients[0].keys() == gradients[1].keys()
    calls[family] = len(count)  # the sharded run's: its forward, and the recompute
    differences[family] = max((gradients[1][n] - g).abs().max().item()
                              for n, g in gradients[0].items())
print(json.dumps({"differences": differences, "calls": calls}))
"""


def test_gradient_checkpointing_in_layers_sharded_by_fsdp2_gives_the_same_gradients(
    tmp_path, subprocess_env, warm_python
):
    """--gradient-checkpointing under FSDP2 (each layer and the model sharded by fully_shard,
    as Accelerate's fsdp config does; one process on gloo, in a process of its own so that this
    one joins no process group), dropout on: a layer runs again in the backward, and bert's and
    gpt's gradients are those of the plain model, within 1e-5."""
    code = [warm_python(subprocess_env), "-c", SHARDED_CHECKPOINTING]
    arguments = [str(tmp_path / "store"), str(Path(__file__).parent)]
    result = subprocess.run(
        [*code, *arguments], capture_output=True, text=True, env=subprocess_env, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["calls"] == {"bert": 2, "gpt": 2}
    differences = report["differences"]
    assert all(difference <= 1e-5 for difference in differences.values()), differences


# ---------------------------------------------------------------- --auto-find-batch-size


@proves("pretrain", "--auto-find-batch-size")
def test_auto_find_batch_size_halves_the_batch_and_trains_the_same_run(tmp_path):
    """Batches of 8 run out of memory above 2 examples: the run goes on with 2 x 4 accumulation
    and ends with the weights of a run started with --batch-size 2 --grad-accum 4; killed and
    resumed, it goes on with the batch found (no out-of-memory again) to the same weights."""
    options = {"batch_size": 8, "auto_find_batch_size": True, "schedule": "constant"}
    found = Harness(fits=2)
    trainer = train(tmp_path / "found", found, **options)
    assert found.out_of_memory == 2  # at 8, then at 4
    assert trainer.state.batch_size_found == 2 and trainer.batching.grad_accum == 4
    log = (tmp_path / "found/train.log").read_text()
    assert (
        "egbert: out of memory at batch 4; --auto-find-batch-size goes on with batch 2 x 4 "
        "accumulation from step 1 (the same 8 examples a step)"
    ) in log
    train(tmp_path / "direct", Harness(), batch_size=2, grad_accum=4, schedule="constant")
    assert_same_weights(tmp_path / "found", tmp_path / "direct")

    later = Harness(fits=4, tight_from=3)  # batches of 8 fit for two steps, then no longer
    train(tmp_path / "later", later, **{**options, "max_steps": 3})
    epoch = [tuple(tiny_dataset()[index]["input_ids"]) for index in epoch_order(24, 1, 0)]
    assert later.rows == epoch  # 8 + 8 + 4 + 4: the epoch's examples once each, in order

    with pytest.raises(Killed):  # dies in step 3, after checkpoint step-2
        train(tmp_path / "killed", Harness(fits=2, die_at=2 + 2 * 4 + 1), save_every=2, **options)
    resumed = Harness(fits=2)
    train(tmp_path / "killed", resumed, save_every=2, resume=True, **options)
    assert resumed.out_of_memory == 0
    log = (tmp_path / "killed/train.log").read_text()
    assert "going on with the batch 2 x 4 accumulation found" in log
    assert_same_weights(tmp_path / "killed", tmp_path / "direct")


def test_auto_find_batch_size_leaves_other_errors_and_odd_batches_alone(tmp_path):
    with pytest.raises(torch.OutOfMemoryError):  # without the option
        train(tmp_path / "off", Harness(fits=2), batch_size=8)
    with pytest.raises(Exception, match="cannot halve into equal batches; pass an even"):
        train(tmp_path / "odd", Harness(fits=2), batch_size=3, auto_find_batch_size=True)


# ---------------------------------------------------------------- quickstart's precision


@pytest.mark.parametrize(
    ("device", "bf16", "expected"),
    [("cuda", False, (False, True)), ("cuda", True, (True, False)), ("cpu", False, (False, False))],
)
def test_quickstart_trains_in_fp16_on_a_gpu_without_bf16(
    tmp_path, monkeypatch, device, bf16, expected
):
    """A T4 (no bf16): the plan trains in fp16, and its pretraining and fine-tuning runs get
    --fp16; an A100 or H100: bf16; a CPU without bf16: fp32."""
    from egbert.quickstart import run as quickstart
    from egbert.quickstart.options import QuickstartArguments

    monkeypatch.setattr(quickstart, "training_device", lambda: device)
    monkeypatch.setattr(quickstart, "bf16_pays_off", lambda found: found == device and bf16)
    budget = quickstart.start_budget(QuickstartArguments(output_dir=str(tmp_path)), tmp_path)
    assert (budget.plan.bf16, budget.plan.fp16) == expected
    saved = json.loads((tmp_path / "plan.json").read_text())
    assert (saved["bf16"], saved["fp16"]) == expected
    assert quickstart.autocast_dtype(budget.plan) == (
        torch.float16 if expected[1] else torch.bfloat16 if expected[0] else None
    )


class Captured(Exception):
    """A job's options, caught where quickstart hands them over."""


def test_quickstart_hands_fp16_to_its_pretraining_and_fine_tuning(tmp_path, monkeypatch, data_dir):
    """A plan in fp16: the pretraining and fine-tuning runs get fp16=True, bf16=False."""
    from types import SimpleNamespace

    from egbert.families import MODEL_FAMILIES
    from egbert.quickstart import run as quickstart
    from egbert.quickstart.budget import Budget, Plan
    from egbert.quickstart.options import QuickstartArguments
    from egbert.quickstart.report import Row

    def capture(*args, **options):
        raise Captured(options)

    monkeypatch.setattr(quickstart.pretrain_run, "run_pretraining", capture)
    monkeypatch.setattr(quickstart, "finetune_once", capture)
    budget = Budget(Plan(options={}, bf16=False, fp16=True), tmp_path / "plan.json", minutes=10)
    choice = SimpleNamespace(
        preset="tiny",
        batch_size=8,
        seq_len=64,
        lr_scale=1.0,
        minutes=1.0,
        grad_accum=1,
        gradient_checkpointing=False,
    )
    choice.epochs, choice.finetune_lr_scale = None, 1.0
    plan = SimpleNamespace(
        pretraining=dict.fromkeys(MODEL_FAMILIES, choice),
        finetuning=SimpleNamespace(max_steps=None),
    )
    args = QuickstartArguments(output_dir=str(tmp_path), heads=["cls"])
    with pytest.raises(Captured) as pretraining:
        quickstart.pretrain_families(args, budget, data_dir, plan)
    model = tmp_path / "bert"
    (model / "model").mkdir(parents=True)
    (model / "model" / "config.json").write_text(json.dumps({"model_type": "egbert-bert"}))
    with pytest.raises(Captured) as finetuning:
        quickstart.run_finetune_pass(
            [("rte", [(Row("bert"), 42)])], {Row("bert"): model}, None, args, budget, plan
        )
    for caught in (pretraining, finetuning):
        assert (caught.value.args[0]["fp16"], caught.value.args[0]["bf16"]) == (True, False)
