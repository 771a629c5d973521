"""A warm Python for the suite's subprocesses: a real process per command, without the seconds
of imports.

Many tests start `python -m egbert.cli ...` on purpose: to kill it, to signal it, to run a
script of scripts/ as a user would. Each such interpreter spent ~6 s importing torch and
transformers (docs/testing.md, "Where the time goes"), about half of the suite's time. Here one
server process per environment (the "zygote") imports egbert and its dependencies once; a
command is then a fork of it, a new process with its own pid, exit status, signals, file
descriptors, environment and working directory, that runs the command as `python` would run it
(`-m MODULE`, `-c CODE` or a script path, as `__main__`).

`start(env)` starts a zygote for `env` and returns the path of a small executable that stands
where `sys.executable` stood: it sends its arguments, environment, working directory and its
stdin/stdout/stderr to the zygote, forwards the signals it gets (SIGTERM, SIGINT, ...) to the
forked command, and exits as the command exited (by the same signal where it was killed).
SIGKILL cannot be forwarded: the zygote's watcher kills the command as soon as the executable
is gone.

What a fork does not reproduce, and where the executable runs the real interpreter instead:
- settings read once as an interpreter starts (PYTHON*, OMP_*, HF_*, locale, malloc, ...): a
  request whose values of those differ from its zygote's runs the real interpreter;
- interpreter options other than -m, -c and a script (-u, -X, -W, -I, ...);
- a process's own hash seed: every fork shares its zygote's. Tests that compare fresh
  interpreters (tests/test_same_seed.py, the tokenizer's three processes) start sys.executable;
- a GPU: CUDA is not fork-safe once initialized, so where an NVIDIA GPU is visible to the
  commands, they start the real interpreter.

This module imports only the standard library at its top: the executable starts in
milliseconds."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
from pathlib import Path

# Environment variables a Python process or its libraries read once, at start or import.
STARTUP_SETTINGS = (
    "PYTHON", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "MALLOC_", "LD_", "LC_", "LANG", "HOME",
    "TMPDIR", "XDG_", "HF_", "TRANSFORMERS", "TORCH", "PYTORCH", "CUDA", "NCCL", "TOKENIZERS",
    "DATASETS", "ACCELERATE", "MPL",
)  # fmt: skip
FORWARDED_SIGNALS = (
    signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
)  # fmt: skip
HEADER = struct.Struct("!Q")  # the request's length, sent with the three descriptors


def startup_settings(env: dict[str, str]) -> dict[str, str]:
    # PYTHON alone names the scripts' interpreter (scripts/gpu_*.sh), not a setting of Python's
    return {
        key: value
        for key, value in env.items()
        if key.startswith(STARTUP_SETTINGS) and key != "PYTHON"
    }


def socket_path(folder: Path | str, env: dict[str, str]) -> Path:
    """One zygote per set of startup settings."""
    text = json.dumps(sorted(startup_settings(env).items()))
    return Path(folder) / f"{hashlib.sha1(text.encode()).hexdigest()[:16]}.sock"


# ---------------------------------------------------------------- the executable (client side)


def run_as_python(folder: str) -> None:
    """Stand in for `python ARGS`: through a zygote where one serves this environment."""
    arguments = sys.argv[1:]
    path = socket_path(folder, dict(os.environ))
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if not _servable(arguments):
            raise ConnectionRefusedError
        connection.connect(str(path))
    except (FileNotFoundError, ConnectionRefusedError):  # no zygote serves this environment
        os.execv(sys.executable, [sys.executable, *arguments])
    request = {"argv": arguments, "env": dict(os.environ), "cwd": os.getcwd(), "pid": os.getpid()}
    payload = json.dumps(request).encode()
    socket.send_fds(connection, [HEADER.pack(len(payload))], [0, 1, 2])
    connection.sendall(payload)
    _forward_signals_then_exit_alike(connection.makefile("r"))


def _servable(arguments: list[str]) -> bool:
    return bool(arguments) and (arguments[0] in ("-m", "-c") or not arguments[0].startswith("-"))


def _forward_signals_then_exit_alike(replies) -> None:
    pending: list[int] = []
    command: list[int] = []

    def forward(signum, frame):
        if command:
            os.kill(command[0], signum)
        else:
            pending.append(signum)

    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, forward)
    command.append(int(replies.readline()))
    for signum in pending:
        os.kill(command[0], signum)
    status = int(replies.readline())
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    os._exit(os.waitstatus_to_exitcode(status))


# ---------------------------------------------------------------- the zygote (server side)


def serve(path: str) -> dict | None:
    """Import, then fork one process per request. Returns only in a forked command process,
    with its request; returns None when the process that started the zygote is gone."""
    _import_egbert()
    threads = _other_threads()
    if threads:  # a fork keeps only the forking thread, and locks the others held
        print(f"warm_python: threads started while importing: {threads}", file=sys.stderr)
        return None
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the watchers are reaped by the kernel
    parent = os.pidfd_open(os.getppid())
    sys.stderr.flush()
    print("ready", flush=True)
    while True:
        readable, _, _ = select.select([listener, parent], [], [])
        if parent in readable:
            return None
        connection, _ = listener.accept()
        if os.fork() == 0:
            listener.close()
            os.close(parent)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            return _watch(connection, Path(path).parent)
        connection.close()


def _other_threads() -> list[str]:
    """The process's threads but this one, by name, but for jemalloc's background thread
    (pyarrow's allocator): jemalloc's fork handlers take its locks across a fork."""
    others = [task for task in os.listdir("/proc/self/task") if int(task) != os.getpid()]
    names = [Path(f"/proc/self/task/{task}/comm").read_text().strip() for task in others]
    return [name for name in names if name != "jemalloc_bg_thd"]


def _import_egbert() -> None:
    """What the commands import, once; none of it runs a torch operation or starts a thread."""
    import importlib
    import pkgutil

    import egbert

    for module in pkgutil.walk_packages(egbert.__path__, "egbert."):
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)


def _watch(connection: socket.socket, folder: Path) -> dict | None:
    """In the watcher: fork the command; report its pid and, at its end, its wait status. Kill
    it if the executable that asked for it is gone (SIGKILL reaches the executable only). While
    the command lives, FOLDER/<executable's pid>.command exists (`wait_for_command`)."""
    header, descriptors, _, _ = socket.recv_fds(connection, HEADER.size, 3)
    (length,) = HEADER.unpack(header)
    payload = b""
    while len(payload) < length:
        payload += connection.recv(length - len(payload))
    request = json.loads(payload)
    try:
        asker = os.pidfd_open(request["pid"])
    except ProcessLookupError:  # killed before it was served
        os._exit(0)
    alive = folder / f"{request['pid']}.command"
    alive.touch()
    pid = os.fork()
    if pid == 0:
        connection.close()
        os.close(asker)
        for number, descriptor in enumerate(descriptors):
            os.dup2(descriptor, number)
            os.close(descriptor)
        return request
    for descriptor in descriptors:
        os.close(descriptor)
    command = os.pidfd_open(pid)
    with contextlib.suppress(OSError):  # the executable is gone: the select below sees it
        connection.sendall(f"{pid}\n".encode())
    readable, _, _ = select.select([command, asker], [], [])
    if command not in readable:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    alive.unlink()
    with contextlib.suppress(OSError):  # the executable is gone
        connection.sendall(f"{status}\n".encode())
    os._exit(0)


def wait_for_command(executable: str, pid: int, timeout: float = 60.0) -> None:
    """After the executable with `pid` ended (a SIGKILL ends it at once): wait until the command
    it stood for has ended too, as it would have with a real interpreter. Nothing to wait for
    where `executable` is not a warm one."""
    import time

    alive = Path(executable).parent / f"{pid}.command"
    deadline = time.monotonic() + timeout
    while alive.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the command of process {pid} still runs after {timeout} s")
        time.sleep(0.001)


def run_request(request: dict) -> None:
    """Run `python ARGV` in this process as a fresh interpreter would, for what it can see, and
    exit as it would."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    code, interrupted = 0, False
    try:
        _run_main(request["argv"], request["cwd"])
    except SystemExit as exit:
        code = _exit_code(exit.code)
    except KeyboardInterrupt as error:
        _print_traceback(error)
        interrupted = True
    except BaseException as error:
        _print_traceback(error)
        code = 1
    _finalize(code, interrupted)


def _print_traceback(error: BaseException) -> None:
    """As the interpreter prints it: from the program's first frame, not this file's."""
    frames = error.__traceback__
    while frames is not None and frames.tb_frame.f_code.co_filename == __file__:
        frames = frames.tb_next
    sys.excepthook(type(error), error.with_traceback(frames), frames)


def _run_main(argv: list[str], cwd: str) -> None:
    import runpy
    import types

    option, *rest = argv
    if option == "-m":
        module, *arguments = rest
        sys.argv = [module, *arguments]  # runpy puts the module's file in argv[0]
        sys.path[0] = cwd
        # run afresh as __main__, as `python -m` does (runpy warns where it was imported)
        sys.modules.pop(module, None)
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    elif option == "-c":
        code, *arguments = rest
        sys.argv = ["-c", *arguments]
        sys.path[0] = ""
        main = sys.modules["__main__"] = types.ModuleType("__main__")
        exec(compile(code, "<string>", "exec"), main.__dict__)
    else:
        sys.argv = [option, *rest]
        sys.path[0] = str(Path(option).resolve().parent)
        runpy.run_path(option, run_name="__main__")


def _exit_code(code) -> int:
    if code is None or isinstance(code, int):
        return code or 0
    print(code, file=sys.stderr)
    return 1


def _finalize(code: int, interrupted: bool) -> None:
    """What an interpreter's exit does that a program can see (its other threads joined, the
    atexit functions, the standard streams flushed; an uncaught Ctrl-C ends it by SIGINT),
    without tearing down the modules: that took ~1.7 s of each command."""
    import atexit
    import threading

    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = code or 120  # as Python's exit where a stream cannot be flushed
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


# ---------------------------------------------------------------- the test side


class Popen(subprocess.Popen):
    """subprocess.Popen, whose wait() and poll() report the end of the command a warm
    executable stands for, not only the executable's (which a SIGKILL ends at once)."""

    def wait(self, timeout=None):
        code = super().wait(timeout)
        wait_for_command(self.args[0], self.pid)
        return code

    def poll(self):
        code = super().poll()
        if code is not None:
            wait_for_command(self.args[0], self.pid)
        return code


def start(env: dict[str, str], folder: Path) -> tuple[Path, object | None]:
    """A zygote for `env` (started now unless one serves it), and the executable that uses it:
    (executable, the zygote's Popen or None where one was running)."""
    executable = folder / "python"
    if not executable.exists():
        executable.write_text(
            f"#!{sys.executable} -IS\n"
            f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
            f"import warm_python; warm_python.run_as_python({str(folder)!r})\n"
        )
        executable.chmod(0o755)
    path = socket_path(folder, env)
    if path.exists() or gpu_visible(env):
        return executable, None
    log = path.with_suffix(".log")
    with log.open("w") as errors:
        zygote = subprocess.Popen(
            [sys.executable, __file__, str(path)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        )
    ready = zygote.stdout.readline() == "ready\n"
    if not ready or log.read_text():
        # a fresh interpreter would print what the imports printed: no fork can stand in for it
        zygote.kill()
        zygote.wait()
        path.unlink(missing_ok=True)
        raise RuntimeError(f"warm_python: no zygote for this environment:\n{log.read_text()}")
    return executable, zygote


def gpu_visible(env: dict[str, str]) -> bool:
    """An NVIDIA GPU the commands would see: CUDA is not fork-safe once initialized, and an
    import may ask it for its devices, so these commands start the real interpreter."""
    return Path("/dev/nvidiactl").exists() and env.get("CUDA_VISIBLE_DEVICES") != ""


if __name__ == "__main__":
    request = serve(sys.argv[1])
    if request is not None:
        run_request(request)
