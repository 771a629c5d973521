"""The policy job (`egbert rlhf`): tune a gpt model to write completions a scoring model scores
high, with TRL's RLOOTrainer (REINFORCE with a leave-one-out baseline, Ahmadian et al. 2024;
the KL to the starting model subtracted from each completion's reward) or GRPOTrainer.

    egbert rlhf --model runs/gpt-mini --reward-model runs/sst2/model --reward-label positive \
        --prompts-from-task sst2 --data-dir $EGBERT_DATA/glue --output-dir runs/rlhf

or from Python, with the same options as keyword arguments:

    egbert.run_rlhf(model="runs/gpt-mini", reward_model="runs/reward", prompts="p.txt", ...)

It reads one way: the policy (an egbert gpt folder or a stock GPT-2) and its tokenizer, the
scoring model with its own tokenizer (`ScoringModel`: each prompt + completion read with the
scorer's special tokens, [CLS] ... [SEP] for bert, which TRL's built-in model reward leaves
out), the prompts (training and held-out: see `RLHFArguments`), TRL's trainer with egbert's
budget and signal handling, then the held-out prompts completed by the starting and the tuned
policy with the same sampling seeds (policy_report.py).

OUTPUT_DIR gets model/ (the tuned policy and its tokenizer: `egbert generate`,
AutoModelForCausalLM and pipeline("text-generation") load it as they load the start; with
--lora the adapters merged in, and adapter/ the adapters alone, which PeftModel.from_pretrained
loads onto the start named in its adapter_config.json),
rlhf_results.json (the held-out reward before and after with the interval of its change, the
KL to the start per token, the perplexity of --validation-text, completions side by side),
reward_kl.png (the reward and the KL against the steps) and checkpoints/ (TRL's checkpoint-N
folders: after a kill, SIGTERM or Ctrl-C the same command with --resume goes on from the last).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate import PartialState
from datasets import Dataset
from huggingface_hub import ModelCard
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

from egbert.alignment.policy_report import PolicyReport, compare_policies, plot_reward_and_kl
from egbert.alignment.prompts import load_prompts, prompts_from_task, word_range
from egbert.alignment.runs import (
    CHECKPOINTS,
    StopTraining,
    last_checkpoint,
    show_metrics_in_progress_bar,
    train_until_stopped,
)
from egbert.arguments import arguments_from_options
from egbert.errors import ConfigError
from egbert.families import CAUSAL_MODEL_TYPES
from egbert.lora import LoraArguments, lora_config, save_adapters_and_merge, trainable_parameters
from egbert.model_files import load_pretrained, read_model_config, resolve_model_dir
from egbert.outputs import check_output_folder
from egbert.report import ModelCardInfo, model_card
from egbert.tokenizer import load_tokenizer
from egbert.training.runtime import bf16_pays_off, training_device

RESULTS_FILE = "rlhf_results.json"
PLOT_FILE = "reward_kl.png"
ALGORITHMS = {"rloo": (RLOOTrainer, RLOOConfig), "grpo": (GRPOTrainer, GRPOConfig)}
SCORES = ("probability", "logit")


@dataclass
class RLHFArguments:
    """The options of `egbert rlhf`: the policy, the scorer, the prompts and the training."""

    _argument_group_name = "policy, scorer, prompts and training"

    model: str = field(
        metadata={
            "help": "the policy to tune: an egbert gpt folder (or pretraining run) or a stock "
            "GPT-2 checkpoint, with its tokenizer"
        }
    )
    reward_model: str = field(
        metadata={
            "help": "the scoring model: an egbert reward output (one logit, the reward) or any "
            "sequence classifier folder with its tokenizer (with --reward-label)"
        }
    )
    output_dir: str = field(
        metadata={"help": "the run's folder: model/, rlhf_results.json, reward_kl.png"}
    )
    prompts: str | None = field(
        default=None,
        metadata={
            "help": "the prompts: a .txt file (one a line), or a .jsonl, .json, .csv or .parquet "
            "file, save_to_disk folder or data set with a prompt column"
        },
    )
    validation_prompts: str | None = field(
        default=None,
        metadata={"help": "held-out prompts, as --prompts (default: --eval-prompts of --prompts)"},
    )
    prompts_from_task: str | None = field(
        default=None,
        metadata={
            "help": "take the prompts from a single-sentence GLUE task instead (sst2, cola): "
            "the first --prompt-words words of each sentence, training prompts from its train "
            "split, held-out ones from its dev split"
        },
    )
    data_dir: str | None = field(
        default=None,
        metadata={"help": "the GLUE folder for --prompts-from-task (without it: the hub)"},
    )
    prompt_words: str = field(
        default="2-8",
        metadata={"help": "with --prompts-from-task: the words a prompt keeps, LOW-HIGH or N"},
    )
    max_prompts: int | None = field(
        default=None, metadata={"help": "train on the first N training prompts only"}
    )
    eval_prompts: int = field(
        default=200,
        metadata={
            "help": "held-out prompts completed before and after training (their reward, KL "
            "and completions in the results)"
        },
    )
    reward_label: str | None = field(
        default=None,
        metadata={
            "help": "the scorer's label to score by, by name (positive) or index; needed when "
            "it has several labels"
        },
    )
    reward_score: str | None = field(
        default=None,
        metadata={
            "help": "the reward: the label's probability or its logit (default: probability "
            "for a scorer with labels, the logit for one with one output)",
            "choices": SCORES,
        },
    )
    algorithm: str = field(
        default="rloo",
        metadata={
            "help": "TRL's trainer: rloo (RLOOTrainer, the KL in the reward) or grpo "
            "(GRPOTrainer, the KL in the loss)",
            "choices": tuple(ALGORITHMS),
        },
    )
    kl_coef: float = field(
        default=0.1,
        metadata={"help": "weight of the KL to the starting model (TRL's beta; 0: no reference)"},
    )
    group_size: int = field(
        default=4,
        metadata={"help": "completions per prompt, the group each one's baseline comes from"},
    )
    batch_size: int = field(
        default=16, metadata={"help": "completions per batch (a multiple of --group-size)"}
    )
    grad_accum: int = field(default=1, metadata={"help": "batches per optimizer step"})
    max_completion_length: int = field(
        default=24, metadata={"help": "tokens a completion may have at most"}
    )
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature"})
    top_k: int = field(default=0, metadata={"help": "sample from the top K tokens only (0: all)"})
    # 1e-4: 1e-5 moved a gpt-mini's reward by nothing in 3.5 minutes, 5e-4 broke its language
    # (docs/experiments/rlhf-sst2.md)
    lr: float = field(default=1e-4, metadata={"help": "peak learning rate (linear decay)"})
    epochs: float = field(default=1.0, metadata={"help": "passes over the training prompts"})
    max_steps: int | None = field(
        default=None, metadata={"help": "optimizer steps (instead of --epochs)"}
    )
    warmup_steps: float = field(
        default=0.0, metadata={"help": "linear warmup: steps, or a fraction of them below 1"}
    )
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient clipping norm"})
    seed: int = field(default=42, metadata={"help": "random seed (sampling, order, prompts)"})
    bf16: bool | None = field(
        default=None,
        metadata={"help": "bf16 autocast (default: where the device runs it faster than fp32)"},
    )
    gradient_checkpointing: bool = field(
        default=False,
        metadata={"help": "recompute activations in the backward pass (less memory, slower)"},
    )
    validation_text: str | None = field(
        default=None,
        metadata={
            "help": "a text file whose perplexity the results give before and after (e.g. "
            "WikiText-2's wiki.valid.tokens): how much of the language the tuning kept"
        },
    )
    budget_minutes: float | None = field(
        default=None,
        metadata={"help": "stop training after this many minutes (the held-out report aside)"},
    )
    save_every: int = field(
        default=0, metadata={"help": "checkpoint every N steps (0: at each epoch's end)"}
    )
    resume: bool = field(
        default=False, metadata={"help": "go on from the last checkpoint in OUTPUT_DIR"}
    )

    def __post_init__(self) -> None:
        if self.prompts is not None and self.prompts_from_task is not None:
            raise ConfigError("give one of --prompts FILE and --prompts-from-task TASK, not both")
        if self.prompts_from_task is not None and self.validation_prompts is not None:
            raise ConfigError(
                "--prompts-from-task holds out its task's dev split; drop --validation-prompts"
            )
        word_range(self.prompt_words)
        for name in ("max_prompts", "max_steps", "batch_size", "grad_accum", "eval_prompts"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        if self.group_size < 2:
            raise ConfigError(
                f"--group-size must be >= 2 (each completion's baseline is the others' mean), "
                f"got {self.group_size}"
            )
        if (self.batch_size * self.grad_accum) % self.group_size:
            raise ConfigError(
                f"--batch-size x --grad-accum ({self.batch_size} x {self.grad_accum}) must be a "
                f"multiple of --group-size ({self.group_size}): whole groups are scored together"
            )
        if self.max_completion_length < 1:
            raise ConfigError(
                f"--max-completion-length must be >= 1, got {self.max_completion_length}"
            )
        if self.kl_coef < 0:
            raise ConfigError(f"--kl-coef must be >= 0, got {self.kl_coef}")
        if self.budget_minutes is not None and self.budget_minutes <= 0:
            raise ConfigError(f"--budget-minutes must be > 0, got {self.budget_minutes}")


@dataclass
class RLHFOutput:
    """What `run_rlhf` returns: rlhf_results.json's content and where the tuned policy is (a
    signal ends the run with egbert.errors.Interrupted instead, its checkpoint saved)."""

    results: dict[str, Any] = field(default_factory=dict)
    model_dir: Path | None = None


def run_rlhf(**options: Any) -> RLHFOutput:
    """`egbert rlhf` from Python: the keyword arguments are the command's options (RLHFArguments
    fields, e.g. model="runs/gpt", reward_model="runs/reward", prompts="p.txt", output_dir=...)."""
    args, lora = arguments_from_options((RLHFArguments, LoraArguments), options)
    return train_policy(args, lora)


# ---------------------------------------------------------------- the scoring model


class ScoringModel:
    """A TRL reward function: the scorer's probability (or logit) of its label for each prompt +
    completion, read with the scorer's own tokenizer and special tokens.

    Given the policy's tokenizer, the text scored is the prompt's tokens and the completion's
    decoded together, not the prompt and the completion's decoded text end to end (TRL's join):
    a WordPiece completion decodes without the space before it, or starting in a word's middle
    ("##s"), which end to end would glue it to the prompt's last word."""

    __name__ = "scorer"  # TRL logs the reward under its function's name

    def __init__(
        self,
        model_dir: str,
        label: str | None = None,
        score: str | None = None,
        policy_tokenizer: PreTrainedTokenizerBase | None = None,
        batch_size: int = 64,
    ) -> None:
        path = resolve_model_dir(model_dir)
        self.model = load_pretrained(AutoModelForSequenceClassification, path).eval()
        self.model.to(PartialState().device)
        self.tokenizer = load_tokenizer(path)
        self.label = scored_label(self.model.config, label, model_dir)
        self.score = score or ("logit" if self.model.config.num_labels == 1 else "probability")
        self.max_length = min(
            512, getattr(self.model.config, "max_position_embeddings", 512) or 512
        )
        self.policy_tokenizer = policy_tokenizer
        self.batch_size = batch_size

    @torch.inference_mode()
    def __call__(
        self,
        prompts: list[str],
        completions: list[str],
        completion_ids: list[list[int]] | None = None,
        **_: Any,
    ) -> list[float]:
        texts = self.scored_texts(prompts, completions, completion_ids)
        return [
            value
            for start in range(0, len(texts), self.batch_size)
            for value in self.scores(texts[start : start + self.batch_size])
        ]

    def scored_texts(
        self, prompts: list[str], completions: list[str], completion_ids: list[list[int]] | None
    ) -> list[str]:
        """Each prompt and its completion as one text (see the class doc)."""
        if self.policy_tokenizer is None or completion_ids is None:
            return [
                prompt + completion for prompt, completion in zip(prompts, completions, strict=True)
            ]
        prompt_ids = self.policy_tokenizer(prompts)["input_ids"]
        return self.policy_tokenizer.batch_decode(
            [p + c for p, c in zip(prompt_ids, completion_ids, strict=True)],
            skip_special_tokens=True,
        )

    def scores(self, texts: list[str]) -> list[float]:
        batch = self.tokenizer(
            texts, truncation=True, max_length=self.max_length, padding=True, return_tensors="pt"
        ).to(self.model.device)
        logits = self.model(**batch).logits.float()
        if self.score == "logit":
            values = logits[:, self.label]
        elif logits.shape[-1] == 1:
            values = torch.sigmoid(logits[:, 0])
        else:
            values = logits.softmax(-1)[:, self.label]
        return values.cpu().tolist()


def scored_label(config: Any, label: str | None, model_dir: str) -> int:
    """The output the reward reads: the only one, or --reward-label's (a name or an index)."""
    names = {str(name): int(index) for index, name in config.id2label.items()}
    if config.num_labels == 1:
        if label is not None and label not in ("0", *names):
            raise ConfigError(
                f"--reward-label {label!r}: {model_dir} has one output, the reward; drop "
                "--reward-label"
            )
        return 0
    listed = ", ".join(config.id2label[i] for i in range(config.num_labels))
    if label is None:
        raise ConfigError(
            f"--reward-model {model_dir} has {config.num_labels} labels ({listed}); pass "
            "--reward-label NAME to score by one of them"
        )
    if label.isdigit() and int(label) < config.num_labels:
        return int(label)
    if label not in names:
        raise ConfigError(
            f"--reward-label {label!r} is not a label of {model_dir}; use one of {listed}"
        )
    return names[label]


# ---------------------------------------------------------------- the policy and the prompts


def is_causal_lm(config: dict[str, Any]) -> bool:
    """Whether a config.json describes a left-to-right language model with its LM head."""
    architectures = config.get("architectures") or []
    return config.get("model_type") in CAUSAL_MODEL_TYPES or any(
        name.endswith(("ForCausalLM", "LMHeadModel")) for name in architectures
    )


def load_policy(model: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The policy and its tokenizer (its pad token the eos where it has none, as TRL pads)."""
    path = resolve_model_dir(model)
    config = read_model_config(path)
    if not is_causal_lm(config):
        kind = config.get("model_type") or "unknown"
        raise ConfigError(
            f"--model {model} holds a {kind} model ({', '.join(config.get('architectures') or [])}"
            "), not a causal language model; egbert rlhf tunes an egbert gpt folder or a GPT-2"
        )
    policy = load_pretrained(AutoModelForCausalLM, path)
    tokenizer = load_tokenizer(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return policy, tokenizer


def training_prompts(args: RLHFArguments) -> tuple[Dataset, Dataset]:
    """(training prompts, held-out prompts), as the options say where each comes from."""
    if args.prompts is None and args.prompts_from_task is None:
        raise ConfigError("give the prompts: one of --prompts FILE and --prompts-from-task TASK")
    if args.prompts_from_task:
        task, words = args.prompts_from_task, word_range(args.prompt_words)
        train, held_out = (
            prompts_from_task(task, split, args.data_dir, words, args.seed)
            for split in ("train", "validation")
        )
    elif args.validation_prompts:
        train, held_out = load_prompts(args.prompts), load_prompts(args.validation_prompts)
    else:
        prompts = load_prompts(args.prompts)
        if len(prompts) <= args.eval_prompts:
            raise ConfigError(
                f"--prompts {args.prompts} has {len(prompts)} prompts, and --eval-prompts "
                f"{args.eval_prompts} of them are held out; pass more, a smaller --eval-prompts "
                "or --validation-prompts"
            )
        split = prompts.train_test_split(test_size=args.eval_prompts, seed=args.seed)
        train, held_out = split["train"], split["test"]
    if args.max_prompts:
        train = train.select(range(min(args.max_prompts, len(train))))
    return train, held_out.select(range(min(args.eval_prompts, len(held_out))))


# ---------------------------------------------------------------- training


@dataclass
class RLHFRun:
    """A run ready to train (`rlhf_trainer`), and what its report needs: the scorer, the
    held-out prompts, the checkpoint to resume from, the stop callback."""

    trainer: RLOOTrainer | GRPOTrainer
    tokenizer: PreTrainedTokenizerBase
    scorer: Callable[..., list[float]]
    held_out: Dataset
    checkpoint: str | None
    stop: StopTraining


def rlhf_trainer(
    args: RLHFArguments,
    lora: LoraArguments | None = None,
    reward: Callable[..., list[float]] | None = None,
) -> RLHFRun:
    """TRL's trainer over the policy, the scorer and the prompts (what `train_policy` trains;
    the tests read each option's effect off it). Every input is checked before any training.
    `lora`: --lora's options (with --lora, TRL trains PEFT adapters and its reference model is
    the policy with its adapters disabled); `reward`: a TRL reward function to use in place of
    --reward-model's scorer."""
    output_dir = check_output_folder(args.output_dir, "--output-dir")
    checkpoint = last_checkpoint(output_dir, args.resume, RESULTS_FILE)
    policy, tokenizer = load_policy(args.model)
    scorer = reward or ScoringModel(
        args.reward_model, args.reward_label, args.reward_score, tokenizer
    )
    train, held_out = training_prompts(args)
    stop = StopTraining(args.budget_minutes)
    trainer_class, _ = ALGORITHMS[args.algorithm]
    trainer = trainer_class(
        model=policy,
        reward_funcs=scorer,
        args=rlhf_config(args, output_dir / CHECKPOINTS),
        train_dataset=train,
        processing_class=tokenizer,
        callbacks=[stop],
        peft_config=lora_config(lora, policy.config, "CAUSAL_LM") if lora else None,
    )
    show_metrics_in_progress_bar(trainer, ("reward", "kl", "entropy"))
    return RLHFRun(trainer, tokenizer, scorer, held_out, checkpoint, stop)


def rlhf_config(args: RLHFArguments, checkpoints: Path) -> RLOOConfig | GRPOConfig:
    """TRL's configuration of the run, from egbert's options."""
    device = training_device()
    _, config_class = ALGORITHMS[args.algorithm]
    return config_class(
        output_dir=str(checkpoints),
        num_train_epochs=args.epochs,
        max_steps=args.max_steps or -1,
        learning_rate=args.lr,
        per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=args.grad_accum,
        num_generations=args.group_size,
        max_completion_length=args.max_completion_length,
        temperature=args.temperature,
        top_k=args.top_k,
        beta=args.kl_coef,
        warmup_steps=args.warmup_steps,
        max_grad_norm=args.max_grad_norm,
        seed=args.seed,
        bf16=bf16_pays_off(device) if args.bf16 is None else args.bf16,
        activation_checkpointing=args.gradient_checkpointing,
        disable_dropout=True,  # the reference's log-probabilities are read without dropout
        save_strategy="steps" if args.save_every else "epoch",
        save_steps=args.save_every or 500,
        save_total_limit=2,
        logging_steps=1,
        report_to="none",
        dataloader_num_workers=0,
        use_cpu=device == "cpu",
    )


def train_policy(
    args: RLHFArguments,
    lora: LoraArguments | None = None,
    reward: Callable[..., list[float]] | None = None,
) -> RLHFOutput:
    """Tune the policy, compare it with its start on the held-out prompts, save both reports
    and the model (see the module doc); `lora` and `reward` as rlhf_trainer's."""
    run = rlhf_trainer(args, lora, reward)
    trainer, output_dir = run.trainer, Path(args.output_dir)
    train_seconds = train_until_stopped(trainer, run.checkpoint, run.stop, output_dir)
    final = output_dir / "model"
    trainable = trainable_parameters(trainer.model)

    def save_adapters(folder: Path) -> None:  # with its base's path in adapter_config.json
        trainer.model.save_pretrained(folder)
        run.tokenizer.save_pretrained(folder)

    merged = save_adapters_and_merge(trainer.model, output_dir, save_adapters)
    policy = trainer.model if merged is None else merged
    policy.save_pretrained(final)
    run.tokenizer.save_pretrained(final)
    starting, _ = load_policy(args.model)
    report = PolicyReport(
        prompts=list(run.held_out["prompt"]),
        max_new_tokens=args.max_completion_length,
        temperature=args.temperature,
        top_k=args.top_k,
        seed=args.seed,
        validation_text=args.validation_text,
    )
    results = {
        "model": str(args.model),
        "reward_model": str(args.reward_model),
        "algorithm": args.algorithm,
        "train_prompts": len(trainer.train_dataset),
        "trainable_parameters": trainable,
        "steps": trainer.state.global_step,
        "train_seconds": round(train_seconds, 1),
        **compare_policies(starting, policy, run.tokenizer, run.scorer, report),
        "options": asdict(args),
    }
    (output_dir / RESULTS_FILE).write_text(json.dumps(results, indent=2) + "\n")
    policy_card(policy, results).save(str(final / "README.md"))
    plot_reward_and_kl(trainer.state.log_history, output_dir / PLOT_FILE)
    return RLHFOutput(results, final)


def policy_card(policy: PreTrainedModel, results: dict[str, Any]) -> ModelCard:
    """The tuned policy's card: how to load it, the held-out comparison with its start, how
    it was trained."""
    reward = results["reward"]
    info = ModelCardInfo(
        pipeline_tag="text-generation",
        description=(
            f"`{results['model']}` tuned with egbert rlhf (TRL's {results['algorithm'].upper()}) "
            f"against the scoring model `{results['reward_model']}`. On "
            f"{results['held_out_prompts']:,} held-out prompts its mean reward went from "
            f"{reward['before']:.3f} to {reward['after']:.3f} (change {reward['change']:+.3f}, "
            f"95% paired bootstrap interval [{reward['change_low']:+.3f}, "
            f"{reward['change_high']:+.3f}]), at a KL to the start of "
            f"{results['kl_per_token']:.4f} per completion token."
        ),
    )
    training = (
        f"{results['steps']:,} steps on {results['train_prompts']:,} prompts, "
        f"{results['train_seconds'] / 60:.1f} minutes."
    )
    metrics = {"reward": reward["after"], "kl_per_token": results["kl_per_token"]}
    if perplexity := results.get("validation_perplexity"):
        metrics["validation_perplexity"] = perplexity["after"]
    return model_card(info, policy, "model", metrics, training, results["options"])


def report_lines(results: dict[str, Any]) -> list[str]:
    """The held-out comparison as the command prints it."""
    reward = results["reward"]
    lines = [
        f"held-out reward {reward['before']:.3f} -> {reward['after']:.3f}, change "
        f"{reward['change']:+.3f} [{reward['change_low']:+.3f}, {reward['change_high']:+.3f}] "
        f"on {results['held_out_prompts']:,} prompts ({results['steps']:,} steps, "
        f"{results['train_seconds']:.0f} s)",
        f"KL to the starting model {results['kl_per_token']:.4f} per completion token",
    ]
    perplexity = results.get("validation_perplexity")
    if perplexity:
        lines.append(
            f"validation perplexity {perplexity['before']:.2f} -> {perplexity['after']:.2f}"
        )
    return lines
