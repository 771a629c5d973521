"""The trainer's batches: its data loaders, a streamed data set's position for resume, and what a
batch holds that the log counts (real tokens, padded length).

Map-style training data is shuffled by Accelerate's seedable sampler, or with --group-by-length
in transformers' length-grouped order (either way epoch e's order is a function of seed + e, so
any epoch can be replayed on resume). A streaming
`datasets.IterableDataset` is split between the processes (each reads its own shards,
`split_dataset_by_node`; no batches dispatched from rank 0), and a checkpoint keeps each process's
position in it (`IterableDataset.state_dict()`), from which a resume goes on instead of replaying
the batches already trained. Collators must not draw from the global RNG (the loader runs one
batch ahead, so that stream would shift on resume); seed per example or per epoch instead, as
egbert's collators do.
"""

from __future__ import annotations

import dataclasses
import json
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import datasets
import torch
from accelerate import Accelerator
from accelerate.data_loader import prepare_data_loader, skip_first_batches
from accelerate.utils.memory import should_reduce_batch_size
from datasets.distributed import split_dataset_by_node
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler
from transformers.trainer_pt_utils import get_length_grouped_indices

from egbert.errors import ConfigError, DataError, TrainingError


@dataclasses.dataclass
class TrainingData:
    """What a Trainer trains and evaluates on.

    train: a map-style dataset (shuffled each epoch) or an IterableDataset (streamed).
    collator: list of examples -> dict of tensors, the keyword arguments of model(...); its
        `set_epoch(epoch)`, where it has one, is called each epoch.
    eval: one evaluation set, or {name: set} (each one's metrics prefixed `name_`); None: none.
    eval_collator: the evaluation sets' collator (None: `collator`).
    """

    train: Dataset | IterableDataset
    collator: Callable[[list[Any]], dict[str, Any]]
    eval: Dataset | dict[str, Dataset] | None = None
    eval_collator: Callable[[list[Any]], dict[str, Any]] | None = None


@dataclasses.dataclass(frozen=True)
class Batching:
    """How a run batches its data: the TrainingArguments fields of these names (what
    --auto-find-batch-size changes of them is BatchFitter's)."""

    batch_size: int
    grad_accum: int
    batch_ramp_to: int | None
    seed: int
    num_workers: int | None
    group_by_length: bool


def loader_workers(num_workers: int | None, device: torch.device) -> int:
    """--num-workers, else 2 on a GPU (collating beside the step pays there) and 0 on the CPU
    (where workers take cores from the step itself; docs/performance.md)."""
    if num_workers is not None:
        return num_workers
    return 0 if device.type == "cpu" else 2


def loader_options(batching: Batching, collator: Callable, device: torch.device) -> dict:
    """What every loader of a run shares: batch size, collator, workers, pinning and seed."""
    return {
        "batch_size": batching.batch_size,
        "collate_fn": collator,
        "num_workers": loader_workers(batching.num_workers, device),
        # pinned batches let Accelerate copy them to the GPU without waiting for the step before
        "pin_memory": device.type == "cuda",
        # The loader draws its workers' base seed from this generator, not the global RNG,
        # which must advance only with the model's own random ops (dropout) for exact resume.
        "generator": torch.Generator().manual_seed(batching.seed),
    }


def train_loader(
    dataset: Dataset | IterableDataset,
    batching: Batching,
    collator: Callable,
    device: torch.device,
) -> DataLoader:
    """The training batches: a map-style dataset shuffled (Accelerate's seedable sampler, once
    prepared) or length-grouped (--group-by-length), a streaming one in order (its length
    checked first: optimization.check_run_length)."""
    options = loader_options(batching, collator, device)
    if isinstance(dataset, IterableDataset):
        if batching.group_by_length:
            raise ConfigError("--group-by-length needs map-style data: drop --streaming")
        if isinstance(dataset, datasets.IterableDataset):
            if workers := batching.num_workers:
                raise ConfigError(
                    f"--num-workers {workers} with a stream: its position for --resume is kept "
                    "by the main process's reader; drop --num-workers (each training process "
                    "already reads its own shards)"
                )
            options["num_workers"] = 0
        return DataLoader(dataset, **options)
    if len(dataset) == 0:
        raise DataError("the training data set is empty; check the training files")
    if batching.group_by_length:
        step = batching.batch_size * batching.grad_accum
        sampler = LengthGroupedEpochs(example_lengths(dataset), step, batching.seed)
        return DataLoader(dataset, sampler=sampler, **options)
    return DataLoader(dataset, shuffle=True, **options)


class LengthGroupedEpochs(Sampler[int]):
    """--group-by-length: each epoch's order is transformers' length-grouped one (the Trainer's
    train_sampling_strategy="group_by_length": shuffled, cut into groups of 50 steps' examples,
    each sorted by length, the longest step first), shuffled by a generator seeded with
    seed + epoch as Accelerate's seedable sampler is. Grouped by whole steps (batch x
    accumulation), so that --auto-find-batch-size's halved batches keep the order."""

    def __init__(self, lengths: list[int], step_examples: int, seed: int) -> None:
        self.lengths, self.step_examples, self.seed = lengths, step_examples, seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(
            get_length_grouped_indices(self.lengths, self.step_examples, generator=generator)
        )


def example_lengths(dataset: Dataset) -> list[int]:
    """The token count of each training example, for --group-by-length."""
    if isinstance(dataset, datasets.Dataset) and "input_ids" in dataset.column_names:
        return [len(ids) for ids in dataset["input_ids"]]
    first = dataset[0]
    if not isinstance(first, dict) or "input_ids" not in first:
        raise ConfigError(
            "--group-by-length sorts examples by their input_ids, which this training data "
            "lacks; drop --group-by-length"
        )
    return [len(dataset[i]["input_ids"]) for i in range(len(dataset))]


def eval_loader(
    dataset: Dataset, batching: Batching, collator: Callable, accelerator: Accelerator
) -> DataLoader:
    """An evaluation or prediction set's batches, in order, split between the processes."""
    options = loader_options(batching, collator, accelerator.device)
    return accelerator.prepare(DataLoader(dataset, **options))


class StreamPosition:
    """Where a streamed data set stands after the batches trained so far.

    The loader runs ahead of training (Accelerate fetches one batch early), so the stream's own
    `state_dict()` is ahead too. This wraps the loader's collator: each batch it makes records
    the stream's state at that point, and `consumed(n)` takes the states of the n batches just
    trained, in order; `trained` is then the state to resume from, which `save` writes into a
    checkpoint (one file per process) and `load` restores.
    """

    def __init__(self, stream: datasets.IterableDataset, collator: Callable) -> None:
        self.stream, self.collator = stream, collator
        self.pending: deque[dict[str, Any]] = deque()
        self.trained: dict[str, Any] | None = None

    def __call__(self, examples: list[Any]) -> dict[str, Any]:
        batch = self.collator(examples)
        self.pending.append(self.stream.state_dict())
        return batch

    def restart(self) -> None:
        """A new pass over the stream: batches made ahead by the last one are not trained."""
        self.pending.clear()

    def consumed(self, batches: int) -> None:
        for _ in range(batches):
            self.trained = self.pending.popleft()

    @staticmethod
    def file(checkpoint: Path, process_index: int) -> Path:
        return checkpoint / f"stream_position_{process_index}.json"

    def save(self, checkpoint: Path, process_index: int) -> None:
        if self.trained is not None:
            text = json.dumps(self.trained)
            self.file(checkpoint, process_index).write_text(text, encoding="utf-8")

    def load(self, checkpoint: Path, process_index: int) -> bool:
        """Go on from the checkpoint's position; False when it holds none (a checkpoint of a
        run that was not streamed, resumed with --resume-anyway)."""
        path = self.file(checkpoint, process_index)
        if not path.is_file():
            return False
        self.stream.load_state_dict(json.loads(path.read_text(encoding="utf-8")))
        return True


def split_stream(
    stream: datasets.IterableDataset, rank: int, world_size: int
) -> datasets.IterableDataset:
    """This process's part of a stream: whole shards when there are at least as many as
    processes (each process reads and tokenizes only its own), else every world_size-th example
    (each process reads the whole stream)."""
    if stream.num_shards >= world_size and stream.num_shards % world_size:
        # split_dataset_by_node would fall back to every world_size-th example here; shards
        # read whole are cheaper, even if some processes get one more than others.
        return stream.shard(num_shards=world_size, index=rank, contiguous=False)
    return split_dataset_by_node(stream, rank=rank, world_size=world_size)


def stream_loader(
    stream: datasets.IterableDataset,
    batching: Batching,
    collator: Callable,
    accelerator: Accelerator,
    message: Callable[[str], None],
) -> tuple[DataLoader, StreamPosition]:
    """The batches of this process's part of the stream, on its device, and its position. Not
    through `accelerator.prepare`, which would split the stream again (or with
    dispatch_batches have rank 0 read all of it)."""
    processes = accelerator.num_processes
    if processes > 1:
        if stream.num_shards < processes:
            message(
                f"egbert: the stream has {stream.num_shards} shard(s) for {processes} processes: "
                "each reads all of it and keeps its share of the examples (more files, or larger "
                "ones, make more shards)"
            )
        stream = split_stream(stream, accelerator.process_index, processes)
    position = StreamPosition(stream, collator)
    loader = train_loader(stream, batching, position, accelerator.device)
    prepared = prepare_data_loader(
        loader,
        device=accelerator.device,
        num_processes=1,  # already split
        process_index=0,
        put_on_device=True,
        dispatch_batches=False,
    )
    return prepared, position


def real_tokens(batch: dict[str, Any]) -> torch.Tensor | int:
    """Real tokens in a batch: the attention mask's sum (left on the device: reading it would
    stall the step), else the size of input_ids."""
    if batch.get("attention_mask") is not None:
        return batch["attention_mask"].sum()
    if "input_ids" in batch:
        return batch["input_ids"].numel()
    return 0


def padded_length(batch: dict[str, Any]) -> int:
    """The batch's padded length (a shape, known on the host), which the attention FLOPs scale
    with; 0 for a batch without input_ids."""
    ids = batch.get("input_ids")
    return ids.shape[-1] if ids is not None else 0


def batch_size(batch: dict[str, Any]) -> int:
    return next(value.size(0) for value in batch.values() if isinstance(value, torch.Tensor))


def epochs_done(epoch: int, batches_in_epoch: int, loader: DataLoader) -> float:
    """Epochs trained, the current one's share of batches included (the last step of a run
    ends its epoch before the epoch count moves on); a stream, which has no length: `epoch`."""
    try:
        share = batches_in_epoch / len(loader)
    except TypeError:
        return epoch
    done = round(epoch + share, 4)
    return int(done) if done.is_integer() else done


def training_batches(
    accelerator: Accelerator,
    dataset: Dataset | datasets.IterableDataset,
    batching: Batching,
    collator: Callable,
    message: Callable[[str], None],
) -> tuple[DataLoader, StreamPosition | None]:
    """The training batches and a stream's position (None for map-style data): a stream is
    split between the processes by stream_loader (its loader is not prepared again), map-style
    data by Accelerate's prepare (prepare_training)."""
    if isinstance(dataset, datasets.IterableDataset):
        return stream_loader(dataset, batching, collator, accelerator, message)
    return train_loader(dataset, batching, collator, accelerator.device), None


def prepare_training(
    accelerator: Accelerator,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loader: DataLoader,
    stream: StreamPosition | None,
) -> tuple[torch.nn.Module, torch.optim.Optimizer, DataLoader]:
    """Accelerate's prepare of the model, the optimizer and the training batches (a stream's,
    split by stream_loader already, as they are)."""
    if stream is not None:
        model, optimizer = accelerator.prepare(model, optimizer)
        return model, optimizer, loader
    return accelerator.prepare(model, optimizer, loader)


def epoch_batches(
    loader: DataLoader,
    collator: Callable,
    epoch: int,
    skip: int,
    stream: StreamPosition | None,
) -> Iterator[dict[str, Any]]:
    """The rest of `epoch`: its seeded order, minus the `skip` batches already trained (a
    stream goes on from its restored position instead)."""
    for component in (loader, collator):
        if hasattr(component, "set_epoch"):
            component.set_epoch(epoch)
    if stream is not None:
        stream.restart()
    elif skip:
        loader = skip_first_batches(loader, skip)
    return iter(loader)


class BatchFitter:
    """--auto-find-batch-size: after an out-of-memory in a training step, the same examples
    each step in batches half as large, twice as many of them (--grad-accum doubled), so that
    the batch of a step, the steps of an epoch and the schedule stay as they were; the step is
    tried again from its first example. The seedable sampler's order does not depend on the
    batch size, so the position in the epoch is the batches trained so far, doubled. For one
    process on map-style data: a stream's position, and other processes waiting in a
    collective, would not go back with it."""

    def __init__(
        self,
        accelerator: Accelerator,
        dataset: Dataset | IterableDataset,
        collator: Callable,
        auto_find_batch_size: bool,
    ) -> None:
        self.accelerator, self.dataset, self.collator = accelerator, dataset, collator
        self.enabled = auto_find_batch_size
        if auto_find_batch_size and isinstance(dataset, IterableDataset | datasets.IterableDataset):
            raise ConfigError("--auto-find-batch-size needs map-style data: drop --streaming")
        if auto_find_batch_size and accelerator.num_processes > 1:
            raise ConfigError(
                "--auto-find-batch-size works on one process; with several, find the batch on "
                "one first and pass it as --batch-size"
            )

    def halved(self, error: RuntimeError, batch_size: int) -> int:
        """The batch size after `error` in a training step on batches of `batch_size`: half of
        it when the error is an out-of-memory that --auto-find-batch-size may answer; else
        `error` again."""
        if not (self.enabled and should_reduce_batch_size(error)):
            raise error
        if batch_size % 2:
            raise TrainingError(
                f"out of memory at batch {batch_size}, which --auto-find-batch-size cannot "
                "halve into equal batches; pass an even --batch-size"
            ) from error
        return batch_size // 2

    def fit(self, batching: Batching, size: int) -> tuple[Batching, DataLoader]:
        """The batching and the training batches of batches of `size` (a divisor of
        batching.batch_size), accumulated to the same examples a step."""
        factor = batching.batch_size // size
        batching = dataclasses.replace(
            batching, batch_size=size, grad_accum=batching.grad_accum * factor
        )
        loader = train_loader(self.dataset, batching, self.collator, self.accelerator.device)
        return batching, self.accelerator.prepare(loader)


def fitted_message(batching: Batching, step: int, found_before: bool) -> str:
    """What a run says when it trains on in the batches --auto-find-batch-size fitted: found
    now, after an out-of-memory, or `found_before` it (a resumed run)."""
    size, accumulation = batching.batch_size, batching.grad_accum
    fitted = f"batch {size} x {accumulation} accumulation"
    same = f"the same {size * accumulation} examples a step"
    if found_before:
        return f"egbert: --auto-find-batch-size: going on with the {fitted} found ({same})"
    return (
        f"egbert: out of memory at batch {size * 2}; --auto-find-batch-size goes on "
        f"with {fitted} from step {step + 1} ({same})"
    )
