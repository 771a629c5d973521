"""`egbert pretrain`'s options of the model and the run, each against an expectation from outside
the code under test: the preset files, a model built here from the same seed, a checkpoint's
own weights (safetensors), cross-entropy with label smoothing (torch), the model card as
huggingface_hub reads it, and the FLOPs of MFU counted by hand from the model's sizes.

(The data options: tests/test_data_options.py; the trainer's: tests/test_trainer_options.py.)
"""

from __future__ import annotations

import dataclasses
import json
from importlib import resources
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from huggingface_hub import ModelCard
from option_coverage import proves
from safetensors.torch import load_file
from test_data_options import gpt_blocks
from transformers import AutoTokenizer
from transformers.trainer_pt_utils import get_length_grouped_indices

from egbert.config import TrainingArguments
from egbert.errors import CheckpointError
from egbert.models.bert import (
    EgbertBertForMaskedLM,
    EgbertBertForPreTraining,
    EgbertBertForReplacedTokenDetection,
)
from egbert.models.elmo import EgbertElmoForBidirectionalLM
from egbert.models.gpt import EgbertGPTConfig, EgbertGPTForCausalLM
from egbert.pretrain.options import PRETRAIN_ARGUMENTS
from egbert.pretrain.prepare import parse_prepare_args, prepare_arguments
from egbert.pretrain.run import (
    build_model,
    model_flops_per_token,
    parse_pretrain_args,
    pretrain_arguments,
    pretraining_trainer,
)
from egbert.tokenizer import load_tokenizer, train_tokenizer
from egbert.training.runtime import matmul_peak_flops

pytestmark = pytest.mark.usefixtures("one_thread_and_fresh_accelerate")

SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2}
SMALL |= {"intermediate_size": 64, "max_position_embeddings": 64}


def parsed(tokenizer: Path, *argv: str, model: str = "gpt") -> tuple:
    argv = [
        "--model",
        model,
        "--tokenizer",
        str(tokenizer),
        "--train-files",
        "a.txt",
        "--seq-len",
        "32",
        *argv,
    ]
    return parse_pretrain_args([*argv, "--output-dir", "out"])


def model_of(tokenizer: Path, *argv: str, model: str = "gpt") -> torch.nn.Module:
    model_args, _, objective_args, _ = parsed(tokenizer, *argv, model=model)
    return build_model(model_args, objective_args, load_tokenizer(tokenizer))[0]


@pytest.fixture(scope="module")
def small_preset(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("preset") / "small.yaml"
    path.write_text(yaml.safe_dump(SMALL), encoding="utf-8")
    return path


# ---------------------------------------------------------------- which model, of which size


@pytest.mark.parametrize(
    ("argv", "model_class"),
    [
        (["--model", "bert"], EgbertBertForPreTraining),
        (["--model", "bert", "--no-nsp"], EgbertBertForMaskedLM),
        (
            ["--model", "bert", "--no-nsp", "--objective", "rtd"],
            EgbertBertForReplacedTokenDetection,
        ),
        (["--model", "gpt"], EgbertGPTForCausalLM),
        (["--model", "elmo"], EgbertElmoForBidirectionalLM),
    ],
)
@proves("pretrain", "--model", "--nsp", "--objective")
def test_the_family_and_objective_pick_the_model(tiny_tokenizer_dir, argv, model_class):
    """MLM + NSP is BERT's pretraining model, MLM alone its masked LM, rtd ELECTRA's generator
    and discriminator; gpt a causal LM, elmo the two-way LSTM language model."""
    family = argv[1]
    model = model_of(tiny_tokenizer_dir, *argv[2:], model=family)
    assert type(model) is model_class and model.config.model_type == f"egbert-{family}"


@pytest.mark.parametrize("preset", ["mini", "file"])
@proves("pretrain", "--preset")
def test_preset_gives_the_model_the_sizes_of_its_file(tiny_tokenizer_dir, small_preset, preset):
    shipped = resources.files("egbert") / "configs" / "gpt-mini.yaml"
    path = small_preset if preset == "file" else shipped
    sizes = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    name = str(small_preset) if preset == "file" else "mini"
    config = model_of(tiny_tokenizer_dir, "--preset", name).config
    assert {key: getattr(config, key) for key in sizes} == sizes


@proves("pretrain", "--tokenizer")
def test_the_model_has_the_vocabulary_of_the_tokenizer(
    tiny_tokenizer_dir, wikitext_slice, tmp_path
):
    other = tmp_path / "tokenizer-600"
    train_tokenizer([wikitext_slice], kind="wordpiece", vocab_size=600, out_dir=other)
    for folder in (tiny_tokenizer_dir, other):
        reference = AutoTokenizer.from_pretrained(folder)
        config = model_of(folder).config
        assert config.vocab_size == len(reference) and config.eos_token_id == reference.eos_token_id


def saved_model(folder: Path, tokenizer: Path) -> dict[str, torch.Tensor]:
    """A gpt of the SMALL sizes with weights of seed 123, saved in `folder`; its weights."""
    torch.manual_seed(123)
    vocab = len(load_tokenizer(tokenizer))
    model = EgbertGPTForCausalLM(EgbertGPTConfig(vocab_size=vocab, **SMALL))
    model.save_pretrained(folder)
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}


@proves("pretrain", "--init-from")
def test_init_from_starts_from_the_saved_weights(tiny_tokenizer_dir, tmp_path):
    saved_model(tmp_path / "saved", tiny_tokenizer_dir)
    weights = load_file(tmp_path / "saved" / "model.safetensors")
    model = model_of(tiny_tokenizer_dir, "--init-from", str(tmp_path / "saved"))
    state = model.state_dict()
    assert weights and all(torch.equal(state[name], tensor) for name, tensor in weights.items())


@proves("pretrain", "--init-from")
def test_init_from_alone_gives_the_family_and_the_tokenizer_of_its_folder(
    tiny_tokenizer_dir, wikitext_slice, tmp_path
):
    """A folder saved with its tokenizer answers --model and --tokenizer: the run is the
    folder's family (a gpt here), with the folder's tokenizer (600 tokens, not --tokenizer's)."""
    folder, other = tmp_path / "saved", tmp_path / "tokenizer-600"
    train_tokenizer([wikitext_slice], vocab_size=600, out_dir=other)
    weights = saved_model(folder, other)
    AutoTokenizer.from_pretrained(other).save_pretrained(folder)
    text = tmp_path / "a.txt"
    text.write_text("".join(wikitext_slice.read_text(encoding="utf-8").splitlines(True)[:40]))
    argv = ["--init-from", str(folder), "--train-files", str(text), "--seq-len", "32"]
    model_args, *rest = parse_pretrain_args([*argv, "--output-dir", str(tmp_path / "out")])
    assert model_args.model == "gpt"
    trainer = pretraining_trainer(model_args, *rest)
    model = trainer.accelerator.unwrap_model(trainer.model)
    state = {name: tensor.cpu() for name, tensor in model.state_dict().items()}  # from any device
    assert all(torch.equal(state[name], tensor) for name, tensor in weights.items())
    # the blocks hold the corpus's tokens as the folder's tokenizer reads them
    reference = AutoTokenizer.from_pretrained(other)
    known = set(reference(text.read_text(encoding="utf-8"))["input_ids"])
    known.add(reference.eos_token_id)
    seen = set(next(iter(trainer.train_loader))["input_ids"].flatten().tolist())
    assert seen <= known and len(seen) > 20


@proves("pretrain", "--config-overrides")
def test_config_overrides_add_to_the_recipes_key_by_key(tiny_tokenizer_dir, tmp_path, capsys):
    """bert's recipe sets three config fields; --config-overrides replaces the one it names
    and adds its others, on the command line, from Python and in --print-config."""
    recipe = resources.files("egbert") / "configs" / "recipes" / "bert.yaml"
    pairs = yaml.safe_load(recipe.read_text(encoding="utf-8"))["pretrain"]["config_overrides"]
    expected = dict(pair.split("=") for pair in pairs.split(","))
    given = "hidden_dropout_prob=0.25,max_position_embeddings=64"
    expected |= dict(pair.split("=") for pair in given.split(","))
    assert len(expected) == 4  # three of the recipe, one new
    config = model_of(tiny_tokenizer_dir, "--config-overrides", given, model="bert").config
    assert {key: getattr(config, key) for key in expected} == {
        key: yaml.safe_load(value) for key, value in expected.items()
    }
    options = {"model": "bert", "tokenizer": str(tiny_tokenizer_dir), "output_dir": "out"}
    model_args = pretrain_arguments(**options, config_overrides=given)[0]
    assert dict(pair.split("=") for pair in model_args.config_overrides.split(",")) == expected
    with pytest.raises(SystemExit):
        parsed(tiny_tokenizer_dir, "--config-overrides", given, "--print-config", model="bert")
    printed = yaml.safe_load(capsys.readouterr().out)["config_overrides"]
    assert dict(pair.split("=") for pair in printed.split(",")) == expected


@proves("pretrain", "--allow-pickle")
def test_allow_pickle_loads_a_pickled_checkpoint_to_start_from(tiny_tokenizer_dir, tmp_path):
    folder = tmp_path / "pickled"
    weights = saved_model(folder, tiny_tokenizer_dir)
    (folder / "model.safetensors").unlink()
    torch.save(weights, folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="holds a pickle checkpoint"):
        model_of(tiny_tokenizer_dir, "--init-from", str(folder))
    state = model_of(tiny_tokenizer_dir, "--init-from", str(folder), "--allow-pickle").state_dict()
    assert all(torch.equal(state[name], tensor) for name, tensor in weights.items())


# ---------------------------------------------------------------- FLOPs of MFU


def flops_by_hand(
    model: torch.nn.Module, seq_len: int, predictions: float, attention: bool
) -> float:
    """Training FLOPs per token as nanoGPT and PaLM count them: forward + backward = 3 x the
    forward's 2 per weight, so 6 per weight outside the embeddings; the attention's scores and
    weighted values, 2 x 2 x hidden x seq_len forward per layer, 12 x hidden x seq_len with the
    backward; the output softmax over the vocabulary (its weight is the embedding's) at each
    predicted position, 6 x vocab x hidden."""
    config = model.config
    embeddings = {
        id(module.weight) for module in model.modules() if isinstance(module, torch.nn.Embedding)
    }
    weights = sum(p.numel() for p in model.parameters() if id(p) not in embeddings)
    layers = config.num_hidden_layers if attention else 0
    return (
        6 * weights
        + 12 * layers * config.hidden_size * seq_len
        + 6 * config.vocab_size * config.hidden_size * predictions
    )


@pytest.mark.parametrize(
    ("family", "argv", "predictions", "attention"),
    [
        ("gpt", [], 1.0, True),
        (
            "bert",
            ["--mlm-probability", "0.25", "--config-overrides", "sparse_mlm_logits=true"],
            0.25,
            True,
        ),
        ("bert", ["--config-overrides", "sparse_mlm_logits=false"], 1.0, True),
        ("elmo", [], 2.0, False),  # its softmax predicts each token twice, forward and backward
    ],
)
@proves("pretrain", "--mlm-probability")
def test_the_flops_per_token_of_mfu_are_counted_by_hand(
    family, argv, predictions, attention, tiny_tokenizer_dir, small_preset
):
    model_args, _, objective_args, _ = parsed(tiny_tokenizer_dir, *argv, model=family)
    model = build_model(model_args, objective_args, load_tokenizer(tiny_tokenizer_dir))[0]
    flops_per_token = model_flops_per_token(model, family, objective_args)
    for seq_len in (16, 64):
        expected = flops_by_hand(model, seq_len, predictions, attention)
        assert flops_per_token(seq_len) == pytest.approx(expected, rel=1e-9)


# ---------------------------------------------------------------- a run built from its options


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, wikitext_slice: Path) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("pretrain-options")
    lines = wikitext_slice.read_text(encoding="utf-8").splitlines(keepends=True)
    (folder / "train.tokens").write_text("".join(lines[:60]), encoding="utf-8")
    (folder / "valid.tokens").write_text("".join(lines[60:100]), encoding="utf-8")
    return {name: folder / f"{name}.tokens" for name in ("train", "valid")}


def rows(examples) -> list[list[int]]:
    return [list(map(int, example["input_ids"])) for example in examples]


@proves("pretrain", "--seed", "--label-smoothing", "--validation-files", "--train-files")
@proves("pretrain", "--license", "--card-datasets", "--output-dir")
def test_a_run_trains_and_evaluates_what_its_options_say(
    corpus, tiny_tokenizer_dir, small_preset, tmp_path
):
    """The trainer `egbert pretrain` builds: its model is the one its --seed draws, its training
    and evaluation examples those of --train-files and --validation-files, its loss smoothed;
    two steps later its card and MFU say what the options and the model's sizes say."""
    out = tmp_path / "run"
    argv = ["--model", "gpt", "--tokenizer", str(tiny_tokenizer_dir), "--preset", str(small_preset)]
    argv += ["--train-files", str(corpus["train"]), "--validation-files", str(corpus["valid"])]
    argv += ["--doc-boundary", "line", "--seq-len", "16", "--batch-size", "4", "--max-steps", "2"]
    argv += ["--seed", "11", "--label-smoothing", "0.2", "--license", "mit", "--log-every", "1"]
    argv += ["--card-datasets", "Salesforce/wikitext", "--report-to", "none", "--use-cpu"]
    trainer = pretraining_trainer(*parse_pretrain_args([*argv, "--output-dir", str(out)]))
    model = trainer.accelerator.unwrap_model(trainer.model)

    torch.manual_seed(11)
    drawn = EgbertGPTForCausalLM(model.config)  # the recipe's config, the seed's weights
    assert all(
        torch.equal(a, b) for a, b in zip(model.parameters(), drawn.parameters(), strict=True)
    )

    def examples_of(path: Path) -> list[list[int]]:
        """gpt's blocks of the file's lines (--doc-boundary line), built by definition."""
        lines = path.read_text(encoding="utf-8").splitlines()
        documents = [line.strip() for line in lines if line.strip()]
        return gpt_blocks(AutoTokenizer.from_pretrained(tiny_tokenizer_dir), documents, 16)

    assert rows(trainer.train_loader.dataset) == examples_of(corpus["train"])
    assert rows(trainer.eval_sets[""]) == examples_of(corpus["valid"])

    batch = trainer.data_collator([trainer.train_loader.dataset[index] for index in range(4)])
    logits = drawn.eval()(batch["input_ids"]).logits[:, :-1]
    smoothed = F.cross_entropy(
        logits.flatten(0, 1), batch["labels"][:, 1:].flatten(), label_smoothing=0.2
    )
    model.eval()
    loss = model(**batch, **trainer.loss_arguments).loss  # what the training forward passes
    assert loss.item() == pytest.approx(smoothed.item(), rel=1e-5)
    assert model.config.label_smoothing == 0.0  # the option is the trainer's, not the model's

    result = trainer.train()
    assert result.model_dir == out / "model" and result.step == 2
    card = ModelCard.load(out / "model" / "README.md")
    assert card.data.license == "mit" and card.data.datasets == ["Salesforce/wikitext"]
    peak = matmul_peak_flops("cpu", torch.float32)  # the run's --use-cpu
    flops = flops_by_hand(model, 16, 1.0, attention=True)
    for record in [record for record in result.history if record["split"] == "train"]:
        assert record["mfu"] * peak / record["tokens_per_s"] == pytest.approx(flops, rel=1e-6)
    # the peak it divided by, in the results, for MFU against another (gpu_perf's datasheet)
    assert json.loads((out / "train_results.json").read_text())["matmul_peak_flops"] == peak


# ---------------------------------------------------------------- the Python API

# Three sets of options that hold together, between them every option away from its default.
API_OPTIONS = [
    {
        "model": "bert", "tokenizer": "tok", "train_files": ["a.txt", "b.txt"], "preset": "mini",
        "config_overrides": "hidden_dropout_prob=0", "allow_pickle": True, "dataset": "d",
        "dataset_config": "c", "split": "s", "text_column": "t", "source_weights": [1.0, 2.0, 3.0],
        "validation_split": "v", "max_eval_samples": 5, "max_train_samples": 9,
        "doc_boundary": "line", "encoding": "latin-1", "encoding_errors": "replace", "seq_len": 64,
        "nsp": False, "objective": "rtd", "mlm_probability": 0.2, "whole_word_mask": True,
        "short_seq_prob": 0.2, "streaming": True, "shuffle_buffer": 8,
        "card_datasets": ["x/y"], "license": "mit", "output_dir": "out", "lr": 0.01,
        "weight_decay": 0.1, "adam_beta1": 0.8, "adam_beta2": 0.95, "adam_epsilon": 1e-6,
        "batch_size": 8, "batch_ramp_to": 16, "max_steps": 10, "epochs": 2, "schedule": "cosine",
        "warmup_steps": 3.0, "bf16": False, "max_grad_norm": 0.5, "label_smoothing": 0.1,
        "eval_every": 5, "save_every": 5, "keep_checkpoints": 3, "seed": 7, "budget_minutes": 2.0,
        "skip_nonfinite": 1, "log_every": 2, "report_to": ["none"], "resume": True,
        "resume_anyway": True, "metric_for_best_model": "loss", "greater_is_better": True,
        "num_workers": 1, "compile": True, "compile_mode": "reduce-overhead", "use_cpu": True,
        "ddp_find_unused_parameters": True, "replay_clock": "done",
    },
    {
        "model": "gpt", "data": "prepared", "init_from": "m", "validation_split_percentage": 5.0,
        "num_proc": 2, "output_dir": "out", "grad_accum": 2, "bf16": True,
        "resume_from_checkpoint": "out/checkpoints/step-4",
    },
    {
        "model": "bert", "tokenizer": "tok", "train_files": ["a.txt"], "dupe_factor": 2,
        "validation_files": ["v.txt"], "output_dir": "out", "overwrite_output_dir": True,
        "fp16": True, "gradient_checkpointing": True, "auto_find_batch_size": True,
        "group_by_length": True, "optim": "muon", "muon_lr": 0.02, "muon_weight_decay": 0.1,
        "muon_momentum": 0.9, "wsd_decay": 0.3, "eval_every_minutes": 2.5,
    },
]  # fmt: skip


def as_argv(options: dict) -> list[str]:
    """The command line of `options`: --kebab-case, lists as several values, booleans as words."""
    argv = []
    for name, value in options.items():
        values = value if isinstance(value, list) else [value]
        words = [str(item).lower() if isinstance(item, bool) else str(item) for item in values]
        argv += [f"--{name.replace('_', '-')}", *words]
    return argv


def field_default(spec: dataclasses.Field):
    if spec.default_factory is not dataclasses.MISSING:
        return spec.default_factory()
    return spec.default


def test_the_python_api_takes_every_option_as_the_command_line_does():
    """run_pretraining(**options) and prepare_corpus(**options) get the dataclasses the command
    lines of the same options give: what the tests above prove of an option holds for both."""
    specs = {spec.name: spec for cls in PRETRAIN_ARGUMENTS for spec in dataclasses.fields(cls)}
    given = {name for options in API_OPTIONS for name in options}
    assert given == set(specs)
    for options in API_OPTIONS:
        assert all(options[name] != field_default(specs[name]) for name in options)
        assert pretrain_arguments(**options) == parse_pretrain_args(as_argv(options))
        data = {
            name: options[name]
            for name in options
            if name not in TrainingArguments.__dataclass_fields__
        }
        data |= {"output_dir": "folder", "seed": 3}
        assert prepare_arguments(**data) == parse_prepare_args(as_argv(data))


@proves("pretrain", "--group-by-length")
def test_group_by_length_trains_in_transformers_length_grouped_order(
    corpus, tiny_tokenizer_dir, tmp_path
):
    """bert's sentence pairs are mostly filled to --seq-len, so grouping them by length saves
    little padding; the order is still transformers' grouped one (get_length_grouped_indices)
    under the seed, not the shuffled one."""
    argv = ["--model", "bert", "--tokenizer", str(tiny_tokenizer_dir), "--report-to", "none"]
    argv += ["--train-files", str(corpus["train"]), "--seq-len", "32", "--seed", "5"]
    argv += ["--batch-size", "2", "--max-steps", "2", "--output-dir", str(tmp_path / "run")]

    def trained_rows(trainer) -> list[list[int]]:
        """The examples of epoch 0's batches, as they were before masking."""
        trainer.train_loader.set_epoch(0)
        rows = []
        for batch in trainer.train_loader:
            masked = batch["labels"] != -100
            originals = torch.where(masked, batch["labels"], batch["input_ids"]).tolist()
            rows += [row[: len(row) - padding(row)] for row in originals]
        return rows

    def padding(row: list[int]) -> int:  # [PAD] is id 0
        return next((i for i, token in enumerate(reversed(row)) if token != 0), len(row))

    grouped = pretraining_trainer(*parse_pretrain_args([*argv, "--group-by-length"]))
    examples = rows(grouped.train_loader.dataset)
    lengths = [len(example) for example in examples]
    order = get_length_grouped_indices(lengths, 2, generator=torch.Generator().manual_seed(5))
    assert trained_rows(grouped) == [examples[index] for index in order]
    shuffled = pretraining_trainer(*parse_pretrain_args(argv))
    assert trained_rows(shuffled) != trained_rows(grouped)
