"""The warm interpreter (tests/warm_python.py) stands in for a fresh one where the suite's tests
can tell: exit codes, deaths by signal, forwarded signals, SIGKILL, the environment, the working
directory, arguments, and the real interpreter where start-up settings differ."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import pytest
import warm_python as warm

pytestmark = pytest.mark.skipif(
    warm.gpu_visible(dict(os.environ)),
    reason="the commands start the real interpreter where a GPU is visible",
)

REPORT = """
import json, os, sys
print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "env": os.environ.get("PROBE"),
                  "warm": "egbert" in sys.modules, "name": __name__}))
"""
WAIT = "import os, sys, time\nprint(os.getpid(), flush=True)\ntime.sleep(60)"


@pytest.fixture(scope="module")
def python(warm_python, subprocess_env) -> str:
    return warm_python(subprocess_env)


def test_a_command_sees_its_arguments_environment_and_folder(python, subprocess_env, tmp_path):
    env = {**subprocess_env, "PROBE": "yes"}
    for interpreter, warm_expected in ((python, True), (sys.executable, False)):
        result = subprocess.run(
            [interpreter, "-c", REPORT, "a", "b"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
        )
        report = json.loads(result.stdout)
        assert report == {
            "argv": ["-c", "a", "b"],
            "cwd": str(tmp_path),
            "env": "yes",
            "warm": warm_expected,  # egbert imported before the code ran: a fork of the zygote
            "name": "__main__",
        }


def test_other_startup_settings_start_the_real_interpreter(python, subprocess_env):
    env = {**subprocess_env, "PYTHONHASHSEED": "123"}
    result = subprocess.run(
        [python, "-c", REPORT], env=env, capture_output=True, text=True, check=True
    )
    assert json.loads(result.stdout)["warm"] is False


@pytest.mark.parametrize(
    ("code", "returncode", "stderr"),
    [
        ("import sys; sys.exit(3)", 3, ""),
        ("import sys; sys.exit('no')", 1, "no\n"),
        ("raise ValueError('bad')", 1, "ValueError: bad\n"),
        ("import atexit; atexit.register(print, 'bye')", 0, ""),
    ],
)
def test_it_exits_as_the_real_interpreter(python, subprocess_env, code, returncode, stderr):
    results = [
        subprocess.run([executable, "-c", code], env=subprocess_env, capture_output=True, text=True)
        for executable in (python, sys.executable)
    ]
    assert [(r.returncode, r.stdout) for r in results] == [(returncode, results[1].stdout)] * 2
    assert all(r.stderr.endswith(stderr) for r in results)
    assert results[0].stderr == results[1].stderr  # a traceback without the zygote's frames


# SIGINT, which Python turns into KeyboardInterrupt, reaches egbert's own handler through this
# interpreter in test_faults.py; here, with the command in time.sleep, it once (1 of 5 suite
# runs, 2026-11-28) left the command running for 30 s, unexplained and not reproduced in 100
# tries since: left out until it is understood.
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_signals_reach_the_command_and_its_death_is_reported(python, subprocess_env, signum):
    process = subprocess.Popen(
        [python, "-c", WAIT], env=subprocess_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    command = int(process.stdout.readline())
    assert command != process.pid  # the fork, not the executable
    process.send_signal(signum)
    assert process.wait(timeout=30) == -signum
    assert not _alive(command)


def test_sigkill_ends_the_command_before_wait_returns(python, subprocess_env):
    """However late the command's watcher runs (stopped here for 0.3 s), warm.Popen's wait()
    returns only once the command has gone, as a real process's would."""
    process = warm.Popen([python, "-c", WAIT], env=subprocess_env, stdout=subprocess.PIPE)
    command = int(process.stdout.readline())
    watcher = _parent(command)
    os.kill(watcher, signal.SIGSTOP)
    threading.Timer(0.3, os.kill, (watcher, signal.SIGCONT)).start()
    process.kill()
    assert process.wait(timeout=30) == -signal.SIGKILL
    assert not _alive(command)


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def _alive(pid: int) -> bool:
    """Not yet reaped: running, dying or a zombie (its watcher reaps it as it ends)."""
    return os.path.exists(f"/proc/{pid}")
