"""The trainer's batches at unit level (egbert/training/batches.py): the loaders' options for a
CPU and a GPU run, the refusals word for word, the length-grouped order, a stream's position.
The end-to-end proofs (resume, streaming, --auto-find-batch-size) are in test_trainer.py,
test_pretrain_streaming.py and test_fit_the_gpu.py; these check what a CPU run cannot reach
through them (a GPU's loader options) and what they leave loose (the words of an error)."""

from __future__ import annotations

import datasets
import pytest
import torch
from accelerate import Accelerator
from transformers.trainer_pt_utils import get_length_grouped_indices

from egbert.config import TrainingArguments
from egbert.errors import ConfigError, DataError, TrainingError
from egbert.training.batches import (
    BatchFitter,
    Batching,
    LengthGroupedEpochs,
    StreamPosition,
    example_lengths,
    fitted_message,
    loader_options,
    stream_loader,
    train_loader,
)
from egbert.training.optimization import RunLength, check_run_length
from egbert.training.trainer import options_for

CPU, GPU = torch.device("cpu"), torch.device("cuda")


def arguments(**options) -> TrainingArguments:
    return TrainingArguments(output_dir="unused", **options)


def batching(**options) -> Batching:
    """The Batching of a run with these options (TrainingArguments' defaults for the rest)."""
    return options_for(Batching, arguments(**options))


def checked_loader(dataset, options: TrainingArguments) -> torch.utils.data.DataLoader:
    """The training batches as the Trainer's data stage makes them: the run's length checked
    first."""
    streaming = isinstance(dataset, torch.utils.data.IterableDataset)
    check_run_length(options_for(RunLength, options), options.batch_ramp_to, streaming)
    return train_loader(dataset, options_for(Batching, options), list, CPU)


def numbered_stream(count: int = 10, shards: int = 1) -> datasets.IterableDataset:
    """Examples {"n": 0} to {"n": count - 1} in order, in `shards` shards of equal size."""
    size = count // shards

    def rows(shards: list[int]):
        for shard in shards:
            yield from ({"n": shard * size + i} for i in range(size))

    return datasets.IterableDataset.from_generator(rows, gen_kwargs={"shards": list(range(shards))})


def numbers(rows) -> list[int]:
    return [row["n"] for row in rows]


def test_a_gpu_runs_loader_collates_in_two_pinned_workers_and_a_cpu_runs_in_the_process():
    """docs/training.md: --num-workers defaults to 2 on a GPU and 0 on the CPU; batches are
    pinned on a GPU only; the loader's generator is seeded with --seed."""
    examples = [{"input_ids": [1, 2]}] * 4
    on_gpu = train_loader(examples, batching(), list, GPU)
    on_cpu = train_loader(examples, batching(), list, CPU)
    assert (on_gpu.num_workers, on_gpu.pin_memory) == (2, True)
    assert (on_cpu.num_workers, on_cpu.pin_memory) == (0, False)
    assert train_loader(examples, batching(num_workers=1), list, CPU).num_workers == 1
    assert train_loader(examples, batching(num_workers=0), list, GPU).num_workers == 0
    options = loader_options(batching(seed=123, batch_size=5), list, CPU)
    assert options["batch_size"] == 5 and options["collate_fn"] is list
    assert options["generator"].initial_seed() == 123


class TorchStream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter([{"input_ids": [1, 2]}] * 4)


@pytest.mark.parametrize(
    ("data", "options", "error", "message"),
    [
        (
            numbered_stream,
            {},
            ConfigError,
            "streaming training data has no length; give --max-steps, or --budget-minutes "
            "without --epochs",
        ),
        (
            TorchStream,
            {"budget_minutes": 1.0, "epochs": 2},
            ConfigError,
            "streaming training data has no length; give --max-steps, or --budget-minutes "
            "without --epochs",
        ),
        (
            numbered_stream,
            {"max_steps": 3, "group_by_length": True},
            ConfigError,
            "--group-by-length needs map-style data: drop --streaming",
        ),
        (
            numbered_stream,
            {"max_steps": 3, "num_workers": 2},
            ConfigError,
            "--num-workers 2 with a stream: its position for --resume is kept by the main "
            "process's reader; drop --num-workers (each training process already reads its own "
            "shards)",
        ),
        (
            lambda: [{"input_ids": [1]}],
            {"batch_ramp_to": 8, "batch_size": 2},
            ConfigError,
            "--batch-ramp-to 8 needs a run length: --budget-minutes or --max-steps",
        ),
        (list, {}, DataError, "the training data set is empty; check the training files"),
    ],
)
def test_the_loaders_refusals_word_for_word(data, options, error, message):
    with pytest.raises(error) as raised:
        checked_loader(data(), arguments(**options))
    assert str(raised.value) == message


def test_a_stream_is_read_in_order_by_the_main_process_unless_it_is_a_torch_one():
    """A datasets stream keeps its position in the main process (StreamPosition): no workers,
    even on a GPU; a plain torch IterableDataset takes the workers asked for."""
    on_gpu = train_loader(numbered_stream(), batching(), list, GPU)
    assert on_gpu.num_workers == 0 and on_gpu.pin_memory
    stream = checked_loader(numbered_stream(4), arguments(max_steps=3, batch_size=3))
    assert [numbers(batch) for batch in stream] == [[0, 1, 2], [3]]
    torch_stream = checked_loader(TorchStream(), arguments(max_steps=3, num_workers=1))
    assert torch_stream.num_workers == 1
    budgeted = checked_loader(numbered_stream(), arguments(budget_minutes=1.0))
    assert budgeted.num_workers == 0


# ---------------------------------------------------------------- --group-by-length


def test_each_epochs_order_is_transformers_length_grouped_one_seeded_with_seed_plus_epoch():
    lengths = [3, 17, 5, 9, 1, 12, 7, 30, 2, 8, 4, 11] * 20
    sampler = LengthGroupedEpochs(lengths, step_examples=6, seed=11)
    assert len(sampler) == len(lengths)

    def transformers_order(seed: int) -> list[int]:
        generator = torch.Generator().manual_seed(seed)
        return get_length_grouped_indices(lengths, 6, generator=generator)

    orders = [list(sampler)]  # before any set_epoch: epoch 0's
    for epoch in (0, 1, 2, 5):
        sampler.set_epoch(epoch)
        orders.append(list(sampler))
    assert orders == [transformers_order(11 + epoch) for epoch in (0, 0, 1, 2, 5)]
    assert len({tuple(order) for order in orders}) == 4  # every epoch its own order


def test_the_group_is_a_steps_examples_batch_times_accumulation():
    examples = [{"input_ids": [0] * length} for length in [3, 17, 5, 9, 1, 12, 7, 30] * 25]
    options = batching(group_by_length=True, batch_size=2, grad_accum=3, seed=4)
    loader = train_loader(examples, options, list, CPU)
    lengths = [len(example["input_ids"]) for example in examples]
    generator = torch.Generator().manual_seed(4)
    assert list(loader.sampler) == get_length_grouped_indices(lengths, 6, generator=generator)


def test_example_lengths_are_the_input_ids_of_a_data_set_or_of_each_example():
    rows = [{"input_ids": [1, 2, 3]}, {"input_ids": [4]}, {"input_ids": [5, 6]}]
    assert example_lengths(datasets.Dataset.from_list(rows)) == [3, 1, 2]
    assert example_lengths(rows) == [3, 1, 2]
    assert example_lengths(rows[:1]) == [3]


@pytest.mark.parametrize(
    "data",
    [
        datasets.Dataset.from_list([{"text": "a b"}]),
        [{"text": "a b"}],
        [([1, 2], 0)],
    ],
    ids=["a-data-set-of-text", "examples-without-input-ids", "tuples"],
)
def test_group_by_length_refuses_data_without_input_ids_in_one_line(data):
    with pytest.raises(ConfigError) as raised:
        example_lengths(data)
    assert str(raised.value) == (
        "--group-by-length sorts examples by their input_ids, which this training data lacks; "
        "drop --group-by-length"
    )


# ---------------------------------------------------------------- a stream's position


def test_a_streams_position_is_that_of_the_batches_trained_not_of_those_made_ahead(tmp_path):
    stream = numbered_stream()
    position = StreamPosition(stream, numbers)
    batches = iter(train_loader(stream, batching(batch_size=2), position, CPU))
    assert [next(batches), next(batches), next(batches)] == [[0, 1], [2, 3], [4, 5]]
    position.consumed(2)  # the third batch was made ahead, not trained
    position.save(tmp_path, 3)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["stream_position_3.json"]

    resumed = numbered_stream()
    assert StreamPosition(resumed, numbers).load(tmp_path, 3)
    assert numbers(resumed) == [4, 5, 6, 7, 8, 9]
    assert not StreamPosition(numbered_stream(), numbers).load(tmp_path, 0)  # no file: False


def test_a_new_pass_drops_the_batches_the_last_one_made_ahead(tmp_path):
    stream = numbered_stream(4)
    position = StreamPosition(stream, numbers)
    loader = train_loader(stream, batching(batch_size=3), position, CPU)
    assert list(loader) == [[0, 1, 2], [3]]
    position.consumed(1)  # the pass ended with [3] made but not trained
    position.restart()
    first = next(iter(loader))
    position.consumed(1)  # the new pass's first batch, not the old pass's [3]
    position.save(tmp_path, 0)
    resumed = numbered_stream(4)
    StreamPosition(resumed, numbers).load(tmp_path, 0)
    assert first == [0, 1, 2] and numbers(resumed) == [3]


def test_a_stream_not_trained_yet_saves_no_position(tmp_path):
    StreamPosition(numbered_stream(), numbers).save(tmp_path, 0)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- --auto-find-batch-size


CUDA_OOM = "CUDA out of memory. Tried to allocate 2.00 GiB"
CPU_OOM = "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: 8 GB"


@pytest.fixture
def accelerator(one_thread_and_fresh_accelerate) -> Accelerator:
    return Accelerator(cpu=True)


def test_an_out_of_memory_halves_the_batch_and_any_other_error_is_raised_again(accelerator):
    examples = [{"input_ids": [i]} for i in range(8)]
    fitter = BatchFitter(accelerator, examples, list, auto_find_batch_size=True)
    for message in (CUDA_OOM, CPU_OOM):  # what accelerate's should_reduce_batch_size knows
        for batch, half in ((8, 4), (6, 3)):
            halved = fitter.halved(RuntimeError(message), batch)
            assert halved == half and type(halved) is int
    switched_off = BatchFitter(accelerator, examples, list, auto_find_batch_size=False)
    for error, which in [
        (RuntimeError("shapes cannot be multiplied"), fitter),
        (RuntimeError(CUDA_OOM), switched_off),  # the option off
    ]:
        with pytest.raises(RuntimeError) as raised:
            which.halved(error, 8)
        assert raised.value is error
    odd = RuntimeError(CUDA_OOM)
    with pytest.raises(TrainingError) as raised:
        fitter.halved(odd, 5)
    assert raised.value.__cause__ is odd
    assert str(raised.value) == (
        "out of memory at batch 5, which --auto-find-batch-size cannot halve into equal batches; "
        "pass an even --batch-size"
    )


def test_a_fitted_batch_takes_the_same_examples_a_step_in_the_same_order(accelerator):
    examples = [{"input_ids": [i]} for i in range(24)]
    options = batching(batch_size=8, grad_accum=2, seed=3)
    fitter = BatchFitter(accelerator, examples, list, auto_find_batch_size=True)
    fitted, loader = fitter.fit(options, 2)
    assert (fitted.batch_size, fitted.grad_accum, fitted.seed) == (2, 8, 3)
    whole = accelerator.prepare(train_loader(examples, options, list, accelerator.device))
    batches = list(loader)
    in_twos = [row for batch in batches for row in batch]
    assert [len(batch) for batch in batches] == [2] * 12
    assert in_twos == [row for batch in whole for row in batch]  # the seeded order, unchanged
    assert sorted(row["input_ids"][0] for row in in_twos) == list(range(24))


def test_a_stream_cannot_fit_its_batch(accelerator):
    with pytest.raises(ConfigError) as raised:
        BatchFitter(accelerator, numbered_stream(), list, auto_find_batch_size=True)
    assert str(raised.value) == "--auto-find-batch-size needs map-style data: drop --streaming"
    BatchFitter(accelerator, numbered_stream(), list, auto_find_batch_size=False)  # no refusal


def test_the_fitted_batch_is_said_in_one_line_found_now_or_before():
    fitted = batching(batch_size=2, grad_accum=4)
    assert fitted_message(fitted, 6, found_before=False) == (
        "egbert: out of memory at batch 4; --auto-find-batch-size goes on with batch 2 x 4 "
        "accumulation from step 7 (the same 8 examples a step)"
    )
    assert fitted_message(fitted, 6, found_before=True) == (
        "egbert: --auto-find-batch-size: going on with the batch 2 x 4 accumulation found (the "
        "same 8 examples a step)"
    )


# ---------------------------------------------------------------- a stream's loader


def numbered_tensors(rows) -> dict[str, torch.Tensor]:
    return {"n": torch.tensor(numbers(rows))}


def test_one_process_reads_the_whole_stream_in_order_on_its_device(accelerator, tmp_path):
    messages = []
    options = batching(batch_size=4)
    loader, position = stream_loader(
        numbered_stream(), options, numbered_tensors, accelerator, messages.append
    )
    batches = [batch["n"] for batch in loader]
    assert [batch.tolist() for batch in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert {batch.device for batch in batches} == {accelerator.device} and messages == []
    position.consumed(1)
    position.save(tmp_path, 0)
    resumed = numbered_stream()
    StreamPosition(resumed, numbers).load(tmp_path, 0)
    assert numbers(resumed) == list(range(4, 10))


class SecondOfTwoProcesses:
    """What stream_loader reads of an Accelerator, for the second of two processes: one
    process cannot hold a real Accelerator of two (test_torchrun.py runs two, in processes of
    their own, which mutation testing does not reach)."""

    num_processes, process_index, device = 2, 1, torch.device("cpu")


@pytest.mark.usefixtures("one_thread_and_fresh_accelerate")  # prepare_data_loader's state
def test_each_process_reads_its_part_of_the_stream_and_a_stream_of_too_few_shards_is_said():
    messages = []

    def second_process_reads(stream: datasets.IterableDataset) -> list[int]:
        options = batching(batch_size=2)
        second = SecondOfTwoProcesses()
        loader, _ = stream_loader(stream, options, numbered_tensors, second, messages.append)
        return [n for batch in loader for n in batch["n"].tolist()]

    # shards 1 and 3 of 0-3, each whole: split_dataset_by_node's deal of 4 shards to 2
    assert second_process_reads(numbered_stream(12, 4)) == [3, 4, 5, 9, 10, 11]
    assert second_process_reads(numbered_stream(6, 2)) == [3, 4, 5]
    assert messages == []  # a shard for each process
    assert second_process_reads(numbered_stream(6)) == [1, 3, 5]  # every 2nd
    assert messages == [
        "egbert: the stream has 1 shard(s) for 2 processes: each reads all of it and keeps its "
        "share of the examples (more files, or larger ones, make more shards)"
    ]


def test_several_processes_cannot_fit_their_batch():
    with pytest.raises(ConfigError) as raised:
        BatchFitter(SecondOfTwoProcesses(), [{"input_ids": [1]}], list, auto_find_batch_size=True)
    assert str(raised.value) == (
        "--auto-find-batch-size works on one process; with several, find the batch on one first "
        "and pass it as --batch-size"
    )
    BatchFitter(SecondOfTwoProcesses(), [{"input_ids": [1]}], list, auto_find_batch_size=False)
