"""What the machine can do and how to set it up for training: the device and the Accelerator,
whether bf16 pays off, the matmul peak, glibc's allocator settings for CPU training, and the
signal handlers that stop a run gracefully.

The trainer, quickstart's step-time probe and scripts/bench.py use these, so that all three see
the same device and the same process settings.
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
import platform
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.tracking import get_available_trackers
from accelerate.utils import (
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    DistributedType,
)

from egbert.errors import ConfigError, first_line
from egbert.training.batches import Batching
from egbert.training.optimization import accumulation_text

# glibc's mallopt() parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3


def has_accelerator() -> bool:
    """A GPU (or another torch accelerator) is there to train on."""
    if hasattr(torch, "accelerator"):  # torch >= 2.6: CUDA, XPU, MPS, ...
        return torch.accelerator.is_available()
    return torch.cuda.is_available()


def training_device() -> str:
    """Where the trainer trains by default: the accelerator if there is one, else the CPU."""
    if not has_accelerator():
        return "cpu"
    if hasattr(torch, "accelerator"):
        return torch.accelerator.current_accelerator().type
    return "cuda"


def synchronize(device: str | torch.device) -> None:
    """Wait for the work queued on `device`: a timer read must count it."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@functools.cache
def matmul_gflops(device: str, dtype: torch.dtype, size: int = 256, repeats: int = 3) -> float:
    """GFLOP/s of one size x size matmul at `dtype` on `device`: the best of `repeats` timed
    calls after a warm-up one (which pays for allocations and kernel selection)."""
    # its own generator: a draw from the global one (at a run's first log record) would shift
    # the dropout masks of every later step, and only in the first run of a process
    generator = torch.Generator(device).manual_seed(0)
    matrix = torch.randn(size, size, device=device, generator=generator).to(dtype)
    torch.mm(matrix, matrix)
    best = math.inf
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        torch.mm(matrix, matrix)
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / max(best, 1e-9) / 1e9


def matmul_peak_flops(device: str, dtype: torch.dtype, repeats: int = 3) -> float:
    """FLOP/s of a large square matmul at `dtype`, the peak MFU is measured against: 8192 wide
    on a GPU (a small product falls far short of its peak), 1024 on a CPU (as fast there as
    2048, in a sixth of the time every process spends on it). Measured once per process and
    dtype (matmul_gflops caches it), so the trainer's log and scripts/bench.py divide by the
    same number."""
    size = 1024 if torch.device(device).type == "cpu" else 8192
    return matmul_gflops(str(device), dtype, size, repeats) * 1e9


# The dtype of each of Accelerate's mixed precisions (its "no": fp32)
PRECISION_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def run_matmul_peak_flops(accelerator: Accelerator) -> float:
    """All processes' matmul peak at the run's precision (measured once per process), the
    denominator of the training log's MFU."""
    dtype = PRECISION_DTYPES.get(accelerator.mixed_precision, torch.float32)
    return matmul_peak_flops(accelerator.device.type, dtype) * accelerator.num_processes


def bf16_pays_off(device: str) -> bool:
    """Whether bf16 autocast makes training faster on this device.

    CPUs without native bf16 instructions (AVX512-BF16 or AMX; e.g. AVX2-only AMD EPYC) emulate
    bf16 matmuls hundreds of times slower than fp32. On Linux the CPU's flags say which it is;
    elsewhere a matmul is timed (on a busy machine that can answer either way).
    """
    if device == "cuda":
        # natively (compute capability 8.0 on: A100, H100, ...): a T4 or V100 only emulates it
        return torch.cuda.is_bf16_supported(including_emulation=False)
    if device != "cpu":
        return True  # other accelerators: trust the user's --bf16
    flags = cpu_flags()
    if flags:
        return bool({"avx512_bf16", "amx_bf16"} & flags)
    return matmul_gflops("cpu", torch.bfloat16) > matmul_gflops("cpu", torch.float32)


@contextmanager
def inference_precision(
    model: torch.nn.Module, bf16: bool | None, fp16: bool = False
) -> Iterator[bool]:
    """fp16 autocast on the model's device if `fp16`; else bf16 autocast if `bf16`, or (None)
    where the device runs bf16 faster than fp32; yields whether bf16 is on. For evaluation,
    embedding and generation: the model as it is, its outputs in the autocast dtypes."""
    device = next(model.parameters()).device.type
    if fp16:
        if bf16:
            raise ConfigError("--bf16 and --fp16 are two mixed precisions: choose one")
        with torch.autocast(device, dtype=torch.float16):
            yield False
        return
    enabled = bf16_pays_off(device) if bf16 is None else bf16
    with torch.autocast(device, dtype=torch.bfloat16, enabled=enabled):
        yield enabled


def requested_precision(
    model: torch.nn.Module, bf16: bool, fp16: bool
) -> AbstractContextManager[bool | None]:
    """The autocast `bf16` or `fp16` asks for (inference_precision); where neither is given,
    none of its own, so that an autocast the caller opened stays on (embed and generate, whose
    flags mean "this precision", not "this precision or float32")."""
    return inference_precision(model, bf16, fp16) if bf16 or fp16 else nullcontext()


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (Linux); empty where there is none."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def setup_lines(accelerator: Accelerator, batching: Batching) -> list[str]:
    """What a run says of its setup when it starts: processes, device, precision, batch (and a
    warning when bf16 would be slower than fp32 here)."""
    lines = [
        f"egbert: training on {accelerator.num_processes} process(es) "
        f"({accelerator.distributed_type.value}, {accelerator.device}, mixed precision "
        f"{accelerator.mixed_precision}); batch {batching.batch_size} x "
        f"{accumulation_text(batching)} x {accelerator.num_processes} processes"
    ]
    if accelerator.mixed_precision == "bf16":
        warning = slow_bf16_warning(accelerator.device.type)
        lines += [warning] if warning else []
    return lines


def slow_bf16_warning(device: str) -> str | None:
    """A warning to print when bf16 would make training on `device` slower, else None."""
    if bf16_pays_off(device):
        return None
    bf16 = matmul_gflops(device, torch.bfloat16)
    fp32 = matmul_gflops(device, torch.float32)
    return (
        f"egbert: warning: bf16 is slower than fp32 on this {device} (matmul {bf16:,.1f} "
        f"against {fp32:,.1f} GFLOP/s: no native bf16 instructions); drop --bf16 to train faster"
    )


def keep_freed_memory_in_process(device: torch.device | str) -> None:
    """Make glibc's malloc keep freed memory for reuse instead of handing it back to the OS,
    for training on a CPU (`device`; on a GPU the tensors are not malloc's).

    A CPU training step allocates and frees the same large tensors every step (activations,
    the LM head's logits chunks and gradients). glibc serves blocks above its mmap threshold
    (adaptive, at most 32 MiB) with fresh mmap'd pages and trims the heap's free top above its
    trim threshold, so every step paid page faults to get zeroed memory back. With both raised
    to 1 GiB, egbert's mini bf16 step took 10-15% less time (bert 355 to 306-319 ms, gpt 665 to
    569-594 ms, 2-core EPYC) at the same peak memory. Models that allocate many large tensors of
    varying sizes can fragment the heap instead: the dense-logits bert peaked 44% higher. A
    process-wide setting, as glibc's MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ would
    make it; where the user set either of those, or off Linux with glibc, it does nothing."""
    if torch.device(device).type != "cpu":
        return
    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return
    if {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"} & os.environ.keys():
        return
    mallopt = ctypes.CDLL(None).mallopt
    mallopt(M_MMAP_THRESHOLD, 2**30)
    mallopt(M_TRIM_THRESHOLD, 2**30)


# The package each tracker of --report-to needs (Accelerate's trackers, by name).
TRACKER_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
TRACKER_PACKAGES |= {"trackio": "trackio"}


def check_trackers_installed(report_to: list[str]) -> None:
    """Refuse a tracker whose package is missing: Accelerate would drop it with a warning and
    the run would go untracked, which its user learns only after it."""
    available = {str(tracker) for tracker in get_available_trackers()}
    for name in report_to:
        if name != "none" and name not in available:
            package = TRACKER_PACKAGES.get(name, name)
            raise ConfigError(
                f"--report-to {name}: the {package} package is not installed; "
                f"pip install {package}, or leave {name} out of --report-to"
            )


@dataclass(frozen=True)
class AcceleratorOptions:
    """What a run's Accelerator is made with: the TrainingArguments fields of these names (the
    last four only to refuse what DeepSpeed would get wrong: check_deepspeed_options)."""

    use_cpu: bool
    bf16: bool | None
    fp16: bool
    seed: int
    report_to: list[str]
    ddp_find_unused_parameters: bool
    grad_accum: int
    skip_nonfinite: int
    resume: bool
    batch_ramp_to: int | None


def mixed_precision(bf16: bool | None, fp16: bool) -> str | None:
    """Accelerate's mixed_precision of a run: --fp16 or --bf16 (--bf16 false: fp32), else None:
    the launch config's (ACCELERATE_MIXED_PRECISION), and without one fp32."""
    if fp16:
        return "fp16"
    if bf16 is None:
        return None
    return "bf16" if bf16 else "no"


def check_bf16_supported(bf16: bool | None, device: str) -> None:
    """Refuse --bf16 on a GPU without bf16 (T4, V100, P100), which would emulate it slowly or
    not at all, naming what such a card trains with."""
    if bf16 and device == "cuda" and not bf16_pays_off(device):
        raise ConfigError(
            f"--bf16: this GPU ({torch.cuda.get_device_name()}) has no bf16; train with --fp16 "
            "(fp16 with loss scaling) instead"
        )


def scale_fp16_losses_on_cpu(accelerator: Accelerator) -> None:
    """Give a CPU run in fp16 what Accelerate gives a GPU's: float16 autocast around the
    model's forward and a dynamic loss scale (torch.amp.GradScaler("cpu")) that its backward,
    clipping, optimizer step and save_state/load_state then use as they do on a GPU.
    Accelerate 1.15 does neither on the CPU (an fp16 run there trained in fp32, unscaled), and
    so the GPU's fp16 path is tested on the CPU too."""
    if accelerator.mixed_precision != "fp16" or accelerator.device.type != "cpu":
        return
    accelerator.native_amp = True  # prepare() wraps the forward in torch.autocast("cpu", fp16)
    accelerator.scaler = torch.amp.GradScaler("cpu")


def loss_scale(accelerator: Accelerator) -> float | None:
    """fp16's current loss scale (None in other precisions). It falls only when a step's
    gradients overflowed, and the scaler skipped that update."""
    return None if accelerator.scaler is None else accelerator.scaler.get_scale()


def step_unless_overflowed(optimizer: torch.optim.Optimizer, accelerator: Accelerator) -> bool:
    """The prepared optimizer's step; False where fp16's gradients overflowed, so that its
    scaler skipped the update (the loss scale fell; a fused AdamW skips inside its kernel,
    which Accelerate's `optimizer_step_was_skipped` does not see)."""
    scale = loss_scale(accelerator)
    optimizer.step()
    return scale is None or loss_scale(accelerator) >= scale


def start_trackers(accelerator: Accelerator, report_to: list[str], config: dict[str, Any]) -> None:
    """Start the run's trackers (--report-to) with its options as hyperparameters; one that
    cannot start (its folder, its server, its login) is a one-line ConfigError."""
    try:
        accelerator.init_trackers("egbert", config=config)
    except Exception as error:  # each tracker's library fails in its own way
        # end_training would close them, the one that failed half-made included
        accelerator.trackers.clear()
        raise ConfigError(
            f"--report-to {' '.join(report_to)}: a tracker could not start "
            f"({first_line(error)}); fix that or pass --report-to none"
        ) from None


def make_accelerator(options: AcceleratorOptions, output_dir: Path) -> Accelerator:
    """The run's Accelerator: the device (the CPU when none is there or --use-cpu), the precision
    (--bf16 or --fp16, else the launch config's), the seedable sampler and the trackers of
    --report-to."""
    check_trackers_installed(options.report_to)
    trackers = [name for name in options.report_to if name != "none"]
    on_cpu = options.use_cpu or not has_accelerator()
    if options.bf16 and not on_cpu:
        check_bf16_supported(options.bf16, training_device())
    accelerator = Accelerator(
        # On a machine without GPUs, cpu=True is what makes Accelerate run data-parallel under
        # torchrun (MULTI_CPU, gloo); without it every process trains alone.
        cpu=on_cpu,
        mixed_precision=mixed_precision(options.bf16, options.fp16),
        # We step the scheduler once per optimizer update ourselves; Accelerate would step it
        # num_processes times per update.
        step_scheduler_with_optimizer=False,
        # dispatch_batches=False: every process reads its own batches, also of a stream (by
        # default rank 0 would read all of it and send each process its share).
        dataloader_config=DataLoaderConfiguration(
            use_seedable_sampler=True,
            data_seed=options.seed,
            dispatch_batches=False,
            # a blocking copy of the next batch would wait for the step queued before it
            non_blocking=not on_cpu,
        ),
        log_with=trackers or None,
        project_dir=str(output_dir / "logs"),
        kwargs_handlers=[
            DistributedDataParallelKwargs(find_unused_parameters=options.ddp_find_unused_parameters)
        ],
    )
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        check_deepspeed_options(options)
    scale_fp16_losses_on_cpu(accelerator)
    return accelerator


def check_deepspeed_options(options: AcceleratorOptions) -> None:
    """DeepSpeed steps the optimizer inside `backward` and keeps its own schedule state: the
    trainer's non-finite skipping, accumulation, batch ramp and the resume of its schedule are
    not verified there, so they are refused rather than silently wrong."""
    refused = {
        "--grad-accum > 1 (set gradient_accumulation_steps in the DeepSpeed config)": (
            options.grad_accum > 1
        ),
        "--skip-nonfinite (DeepSpeed updates inside backward)": options.skip_nonfinite > 0,
        "--resume": options.resume,
        "--batch-ramp-to": options.batch_ramp_to is not None,
    }
    named = [option for option, given in refused.items() if given]
    if named:
        raise ConfigError(
            f"with DeepSpeed egbert does not support {', '.join(named)}; drop it, or train with "
            "DDP or FSDP (configs/accelerate/ddp.yaml, fsdp.yaml)"
        )


@contextmanager
def stop_on_signals(request_stop: Callable[[int], None]) -> Iterator[None]:
    """SIGINT / SIGTERM call `request_stop(signum)` the first time; a second one exits now."""
    received: list[int] = []

    def handler(signum: int, frame: object) -> None:
        if received:
            sys.stderr.write("egbert: second signal, exiting now\n")
            sys.stderr.flush()
            os._exit(128 + signum)
        received.append(signum)
        sys.stderr.write(
            f"\negbert: {signal.Signals(signum).name}: stopping after this step and saving a "
            "checkpoint (send it again to exit at once)\n"
        )
        sys.stderr.flush()
        request_stop(signum)

    previous = {}
    if threading.current_thread() is threading.main_thread():  # else leave them be
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, handler_before in previous.items():
            signal.signal(signum, handler_before)
