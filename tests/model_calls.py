"""What a command does with its model, seen from torch: every forward of a transformers model
while `model_calls()` is open, with its batch size, its inputs' device and whether autocast was
on. Options that change no number a command prints (--batch-size, --device, --bf16) are proved
by these calls (torch's global forward hook, so the command loads and runs its model itself)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
import torch
from transformers import PreTrainedModel


@dataclass(frozen=True)
class ModelCall:
    batch_size: int
    device: str  # the device type of input_ids: cpu, cuda, meta, ...
    autocast: bool  # autocast on for that device type during the call
    dtype: torch.dtype | None = None  # autocast's dtype there, when on


@contextmanager
def model_calls() -> Iterator[list[ModelCall]]:
    """The outermost forward calls of transformers models in this block, in order."""
    calls: list[ModelCall] = []
    depth = [0]  # models running: a model's forward calls its base model's

    def entered(module: torch.nn.Module, args: tuple) -> None:
        if isinstance(module, PreTrainedModel):
            depth[0] += 1

    def left(module: torch.nn.Module, args: tuple, kwargs: dict, output) -> None:
        if not isinstance(module, PreTrainedModel):
            return
        depth[0] -= 1
        if depth[0]:
            return
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        device = input_ids.device.type
        autocast = device != "meta" and torch.is_autocast_enabled(device)  # meta has none
        dtype = torch.get_autocast_dtype(device) if autocast else None
        calls.append(ModelCall(input_ids.shape[0], device, autocast, dtype))

    hooks = [
        torch.nn.modules.module.register_module_forward_pre_hook(entered),
        # always: a forward that fails (on the meta device) is recorded too
        torch.nn.modules.module.register_module_forward_hook(
            left, with_kwargs=True, always_call=True
        ),
    ]
    try:
        yield calls
    finally:
        for hook in hooks:
            hook.remove()


def assert_bf16_and_device_are_the_options(argv: list[str]) -> None:
    """`egbert ARGV --bf16/--no-bf16/--fp16 --device cpu` runs its model on the CPU with autocast
    to bf16, off or to fp16 as asked; `--device meta` moves the model there, where autocast
    refuses to go (only the model's own device is asked)."""
    from egbert.cli import main as cli_main

    for flag, dtype in (("--bf16", torch.bfloat16), ("--no-bf16", None), ("--fp16", torch.float16)):
        with model_calls() as calls:
            cli_main([*argv, flag, "--device", "cpu"])
        expected = {("cpu", dtype is not None, dtype)}
        assert {(call.device, call.autocast, call.dtype) for call in calls} == expected
    with pytest.raises(RuntimeError, match="autocast device_type 'meta'"):
        cli_main([*argv, "--no-bf16", "--device", "meta"])
