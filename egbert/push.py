"""Upload a model folder to the Hugging Face Hub (`egbert push`).

    egbert push --repo-id USER/NAME --folder runs/gpt-small [--private] [--revision BRANCH]
        [--commit-message TEXT] [--dry-run]

Only what a Hub model repository holds goes up: weights, config, generation config, tokenizer
files, the README.md model card and the modeling *.py files (the code that loads the model
without egbert). A folder with training leftovers (checkpoints/, optimizer states, logs) is
refused: they are large, and a repository is for the model. A run directory can be given as it
is: its model/ subfolder, where the trainer puts the final model, is what goes up.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field
from pathlib import Path

from huggingface_hub import HfApi
from huggingface_hub.errors import HfHubHTTPError, HFValidationError, LocalTokenNotFoundError
from huggingface_hub.utils import validate_repo_id

from egbert.errors import CheckpointError, ConfigError, first_line
from egbert.hub import check_hub_reachable

# What a Hub model repository holds, as file name patterns (top level only).
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "pytorch_model*.bin",
    "pytorch_model.bin.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "README.md",
    "*.py",
)
WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin")
# What training leaves beside a model: checkpoints, optimizer and scheduler states, RNG states,
# logs. Their presence means the folder is a run, not a model.
LEFTOVER_DIRS = ("checkpoint*", "logs", "runs", "tensorboard", "wandb")
LEFTOVER_FILES = (
    "optimizer*",
    "scheduler*",
    "random_states*",
    "scaler.pt",
    "trainer_state.json",
    "training_args.bin",
    "*.log",
    "*.jsonl",
    "events.out.tfevents*",
)


@dataclass
class PushPlan:
    """What `push_to_hub` uploads: the model folder and its files (names, sizes in bytes)."""

    folder: Path
    files: dict[str, int]


def matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in patterns)


def plan_upload(folder: str | os.PathLike) -> PushPlan:
    """The model folder to upload (`folder`, or its model/ subfolder for a run directory) and the
    files of it that go up; CheckpointError for a folder with no model or with training leftovers.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: no such folder; pass a model folder with --folder")
    if (folder / "model" / "config.json").is_file():
        folder = folder / "model"  # a run directory: the final model is in model/
    entries = sorted(folder.iterdir())
    leftovers = [
        entry.name + ("/" if entry.is_dir() else "")
        for entry in entries
        if matches(entry.name, LEFTOVER_DIRS if entry.is_dir() else LEFTOVER_FILES)
    ]
    if leftovers:
        raise CheckpointError(
            f"{folder} holds training leftovers ({', '.join(leftovers)}), not only a model; push "
            "the run's model/ folder, or save the model alone with save_pretrained and push that"
        )
    files = {
        entry.name: entry.stat().st_size
        for entry in entries
        if entry.is_file() and matches(entry.name, MODEL_FILES)
    }
    has_weights = any(matches(name, WEIGHT_FILES) for name in files)
    if "config.json" not in files or not has_weights:
        raise CheckpointError(
            f"{folder} is not a model folder (it needs config.json and the weights, e.g. "
            "model.safetensors); pass the folder a run or save_pretrained wrote"
        )
    return PushPlan(folder, files)


def check_token(api: HfApi) -> None:
    """Fail before anything is uploaded when no token is set or the Hub refuses it (otherwise
    the upload itself would be the first to find out)."""
    try:
        api.whoami()
    except LocalTokenNotFoundError:
        raise ConfigError(
            "no Hugging Face token found; log in with `hf auth login` or set HF_TOKEN"
        ) from None
    except HfHubHTTPError as error:
        raise ConfigError(f"the Hub refused the token: {first_line(error)}") from None


@dataclass
class PushArguments:
    """The options of `egbert push`, the arguments of `push_to_hub`."""

    _argument_group_name = None  # among the parser's own options

    repo_id: str = field(metadata={"help": "Hub repository, USER/NAME"})
    folder: str = field(metadata={"help": "model folder or run directory"})
    private: bool = field(default=False, metadata={"help": "create the repository private"})
    revision: str | None = field(
        default=None, metadata={"help": "branch to push to (default: main)"}
    )
    commit_message: str | None = field(default=None, metadata={"help": "commit message on the Hub"})
    dry_run: bool = field(
        default=False, metadata={"help": "print the files that would go up, upload nothing"}
    )


def push_to_hub(
    folder: str | os.PathLike,
    repo_id: str,
    private: bool = PushArguments.private,
    revision: str | None = PushArguments.revision,
    commit_message: str | None = PushArguments.commit_message,
    dry_run: bool = PushArguments.dry_run,
) -> PushPlan:
    """Upload the model in `folder` (a model folder, or a run directory with a model/ subfolder)
    to the Hub repository `repo_id` ("USER/NAME"), creating it (private if asked) and the branch
    `revision` when missing. With `dry_run`, only work out what would go up. Returns the plan."""
    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise ConfigError(f"--repo-id {repo_id!r} is not a repository id: {error}") from None
    if "/" not in repo_id:
        raise ConfigError(f"--repo-id {repo_id!r} needs its owner: USER/NAME or ORG/NAME")
    plan = plan_upload(folder)
    if dry_run:
        return plan
    check_hub_reachable(instead="pass --dry-run to list the files only")
    api = HfApi()
    check_token(api)
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        if revision is not None:
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        api.upload_folder(
            repo_id=repo_id,
            folder_path=plan.folder,
            allow_patterns=list(plan.files),
            revision=revision,
            commit_message=commit_message or f"Upload {plan.folder.name} with egbert push",
        )
    except HfHubHTTPError as error:
        raise ConfigError(f"the Hub refused the upload to {repo_id}: {first_line(error)}") from None
    return plan


def describe(plan: PushPlan, repo_id: str, dry_run: bool) -> str:
    verb = "would upload" if dry_run else "uploaded"
    total = sum(plan.files.values())
    lines = [
        f"{verb} {len(plan.files)} files ({total / 1e6:.1f} MB) from {plan.folder} to {repo_id}:"
    ]
    lines += [f"  {name}  ({size:,} bytes)" for name, size in plan.files.items()]
    return "\n".join(lines)
