"""Generate text with a gpt model and stream it to stdout (`egbert generate`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, TextStreamer

import egbert.models.gpt  # noqa: F401  (registers egbert-gpt with the Auto classes)
from egbert.errors import CheckpointError, ConfigError
from egbert.families import CAUSAL_MODEL_TYPES
from egbert.model_files import ALLOW_PICKLE_HELP, load_pretrained, read_model_config
from egbert.tokenizer import check_vocab_matches, load_tokenizer, tokenizer_for_model
from egbert.training.runtime import requested_precision


def check_generative_model(model_dir: Path) -> None:
    """Raise CheckpointError unless `model_dir` holds a causal language model."""
    model_type = read_model_config(model_dir).get("model_type")
    if model_type not in CAUSAL_MODEL_TYPES:
        raise CheckpointError(
            f"{model_dir} holds a {model_type!r} model; egbert generate needs a gpt model "
            f"(model_type {' or '.join(CAUSAL_MODEL_TYPES)})"
        )


@dataclass
class GenerateArguments:
    """The options of `egbert generate` (`generate_text`'s arguments; --model is its
    model_dir), checked when built."""

    _argument_group_name = None  # among the parser's own options

    model: str = field(metadata={"help": "gpt model directory (with its tokenizer)"})
    prompt: str = field(metadata={"help": "text to continue"})
    max_new_tokens: int = field(default=50, metadata={"help": "tokens to generate"})
    temperature: float | None = field(
        default=None, metadata={"help": "sampling temperature; 0 or absent: greedy"}
    )
    top_k: int | None = field(default=None, metadata={"help": "sample from the k likeliest"})
    top_p: float | None = field(
        default=None, metadata={"help": "sample from the smallest set with this mass"}
    )
    seed: int | None = field(default=None, metadata={"help": "random seed for sampling"})
    bf16: bool = field(default=False, metadata={"help": "bf16 autocast"})
    fp16: bool = field(
        default=False, metadata={"help": "fp16 autocast, for GPUs without bf16; instead of --bf16"}
    )
    allow_pickle: bool = field(default=False, metadata={"help": ALLOW_PICKLE_HELP})

    def __post_init__(self) -> None:
        check_prompt(self.prompt)
        if self.max_new_tokens < 1:
            raise ConfigError(f"--max-new-tokens must be at least 1, got {self.max_new_tokens}")
        if self.temperature is not None and self.temperature < 0:
            raise ConfigError(f"--temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError(f"--top-k must be at least 1, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ConfigError(f"--top-p must be in (0, 1], got {self.top_p}")


def check_prompt(prompt: str | None) -> None:
    """A prompt is text (None: not given yet, as --print-config shows it)."""
    if prompt is None:
        return
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError:  # Python keeps undecodable command-line bytes as lone surrogates
        raise ConfigError(
            "--prompt holds bytes that are not valid text in the terminal's encoding; "
            "pass UTF-8 text"
        ) from None


def generate_text(
    model_dir: str | Path,
    prompt: str,
    max_new_tokens: int = GenerateArguments.max_new_tokens,
    temperature: float | None = GenerateArguments.temperature,
    top_k: int | None = GenerateArguments.top_k,
    top_p: float | None = GenerateArguments.top_p,
    seed: int | None = GenerateArguments.seed,
    stream: bool = True,
    allow_pickle: bool = GenerateArguments.allow_pickle,
    bf16: bool = GenerateArguments.bf16,
    fp16: bool = GenerateArguments.fp16,
) -> str:
    """Continue `prompt` with the gpt model in `model_dir`; temperature 0 or None means greedy.

    Prints the continuation as it is produced when `stream`; returns it either way. A pickle
    checkpoint (pytorch_model.bin) needs `allow_pickle` (then torch.load(weights_only=True)).
    `bf16` (or `fp16`, for GPUs without bf16) runs the model under that autocast. The options
    are checked as the command line's (`GenerateArguments`).
    """
    GenerateArguments(
        model=str(model_dir),
        prompt=prompt,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        bf16=bf16,
        fp16=fp16,
        allow_pickle=allow_pickle,
    )
    model_dir = Path(model_dir)
    check_generative_model(model_dir)
    model = load_pretrained(AutoModelForCausalLM, model_dir, allow_pickle=allow_pickle)
    # Folders saved before tokenizers were made per family hold one that wraps every text in
    # [CLS] ... [SEP]: re-made here for the gpt family, whatever the folder holds.
    tokenizer = tokenizer_for_model(load_tokenizer(model_dir), model.config)
    check_vocab_matches(tokenizer, model.config.vocab_size, f"the model in {model_dir}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = model.to(device).eval()
    input_ids = prompt_ids(tokenizer, prompt, model.config).to(device)
    check_room(input_ids.shape[1], max_new_tokens, model.config.max_position_embeddings)
    sampling = bool(temperature)
    # explicit values, so defaults in the model's generation_config.json do not filter silently
    options = {"temperature": temperature, "top_k": top_k or 0, "top_p": top_p or 1.0}
    if seed is not None:
        torch.manual_seed(seed)
    streamer = TextStreamer(tokenizer, skip_prompt=True) if stream else None
    pad_token_id = tokenizer.pad_token_id
    if pad_token_id is None:
        pad_token_id = tokenizer.eos_token_id
    with torch.no_grad(), requested_precision(model, bf16, fp16):
        output = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_new_tokens,
            do_sample=sampling,
            streamer=streamer,
            pad_token_id=pad_token_id,
            **(options if sampling else {}),
        )
    return tokenizer.decode(output[0, input_ids.shape[1] :], skip_special_tokens=True)


def check_room(prompt_tokens: int, max_new_tokens: int, positions: int) -> None:
    """The prompt and what is generated after it must fit the model's position table."""
    if prompt_tokens + max_new_tokens > positions:
        raise ConfigError(
            f"prompt ({prompt_tokens} tokens) + --max-new-tokens ({max_new_tokens}) exceeds "
            f"the model's {positions} positions; shorten one of them"
        )


def prompt_ids(tokenizer, prompt: str, config) -> torch.Tensor:
    """The prompt as (1, tokens) ids, encoded as `pipeline("text-generation")` encodes it; an
    empty prompt starts from bos."""
    ids = tokenizer(prompt)["input_ids"]
    if not ids:
        start = config.bos_token_id if config.bos_token_id is not None else tokenizer.bos_token_id
        if start is None:
            raise ConfigError("--prompt is empty and the model has no bos token to start from")
        ids = [start]
    return torch.tensor([ids])
