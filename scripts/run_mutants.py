"""Run mutmut's mutants of one module fast: torch and the rest imported once, a fork per mutant.

`make mutation` runs each survivor against every test mutmut maps to its function, end-to-end
trainings included, in a fresh process: about 3 minutes a survivor here. This driver reads the
mutants `mutmut run` generated (`mutants/`, the module's `.meta` file and the test mapping in
`mutmut-stats.json`), imports the heavy libraries once and forks a child per mutant that runs
pytest in-process with MUTANT_UNDER_TEST set (mutmut's trampolines read it on every call):

1. the tests the mapping names for the mutant's function (those that call it), then the listed
   tests it does not know (written after the mapping was made);
2. for a mutant those leave alive, the whole of the --tests files (not with --mapped-only: the
   tests step 1 leaves out do not call the function, so step 2 kills little and costs the
   whole files' time a survivor).

Two children at a time, each under a time limit; results go to a JSON file ({name: [outcome,
exit code, stage]}) that a rerun continues. The mutants and mapping must be current: run
`make mutation MODULES=...` (or `mutmut run`) once first, at least until it has generated them.

    python scripts/run_mutants.py evaluation/probe --tests tests/test_probe.py --out probe.json
    python scripts/run_mutants.py evaluation/probe --tests tests/test_probe.py --out after.json \\
        --mutants-dir /tmp/mutants-copy --only NAME1,NAME2

`--mutants-dir` takes a copy of `mutants/` whose tests/ were replaced by newer ones: how the
survivors of a run are checked against the tests written for them.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("module", help="the module's path under egbert/, e.g. evaluation/probe")
    parser.add_argument("--tests", required=True, help="comma-separated test files (stage 2)")
    parser.add_argument("--out", required=True, type=Path, help="results JSON (continued)")
    parser.add_argument("--mutants-dir", type=Path, default=Path("mutants"))
    parser.add_argument("--only", default="", help="comma-separated mutant names to run")
    parser.add_argument(
        "--mapped-only",
        action="store_true",
        help="stop at step 1: a survivor is not run against the whole files (faster)",
    )
    parser.add_argument("--jobs", type=int, default=2, help="children at a time (default: 2)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per child")
    return parser.parse_args()


def collected_tests(mutants_dir: Path, files: list[str]) -> set[str]:
    """The test ids pytest collects from `files` in the mutants copy."""
    listing = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n0", "-p", "no:cacheprovider"]
        + files,
        cwd=mutants_dir, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return {line for line in listing.stdout.splitlines() if "::" in line}


def start_child(name: str, tests: list[str]) -> int:
    pid = os.fork()
    if pid:
        return pid
    os.environ["MUTANT_UNDER_TEST"] = name
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    try:
        code = pytest.main(["-q", "-x", "-n", "0", "-p", "no:cacheprovider", *tests])
    except BaseException:
        code = 99
    os._exit(int(code))


def main() -> None:
    args = parse_args()
    mutants_dir = args.mutants_dir.resolve()
    files = args.tests.split(",")
    environment = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    environment |= {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "MUTANT_UNDER_TEST": ""}
    os.environ.update(environment)
    if "EGBERT_DATA" not in os.environ:
        sys.exit("set EGBERT_DATA: without the data the tests that read it skip and kill nothing")
    meta = json.loads((mutants_dir / "egbert" / f"{args.module}.py.meta").read_text())
    stats = json.loads((mutants_dir / "mutmut-stats.json").read_text())
    mapping = stats["tests_by_mangled_function_name"]
    existing = collected_tests(mutants_dir, files)
    unmapped = sorted(existing - {test for tests in mapping.values() for test in tests})

    os.chdir(mutants_dir)
    sys.path.insert(0, str(mutants_dir))
    import sklearn  # noqa: F401  the children inherit these imports
    import torch  # noqa: F401
    import transformers  # noqa: F401

    import egbert  # noqa: F401

    done = json.loads(args.out.read_text()) if args.out.exists() else {}
    only = set(filter(None, args.only.split(",")))
    queue = [(name, 1) for name in meta["exit_code_by_key"] if name not in done]
    queue = [(name, stage) for name, stage in queue if not only or name in only]
    print(f"{len(queue)} mutants to run; {len(unmapped)} tests not in the mapping", flush=True)

    def stage_tests(name: str, stage: int) -> list[str]:
        if stage == 2:
            return files
        function = name.rsplit("__mutmut_", 1)[0]
        return [test for test in mapping.get(function, []) if test in existing] + unmapped

    running: dict[int, tuple[str, int, float]] = {}
    while queue or running:
        while queue and len(running) < args.jobs:
            name, stage = queue.pop(0)
            running[start_child(name, stage_tests(name, stage))] = (name, stage, time.time())
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            for child, (_, _, started) in running.items():
                if time.time() - started > args.timeout:
                    os.kill(child, signal.SIGKILL)
            time.sleep(0.05)
            continue
        name, stage, _ = running.pop(pid)
        code = os.waitstatus_to_exitcode(status)
        if code == 4:
            sys.exit(f"pytest could not run the tests of {name} (exit 4): a test id not found?")
        if code in (0, 5) and stage == 1 and not args.mapped_only:
            queue.insert(0, (name, 2))
            continue
        outcome = "survived" if code in (0, 5) else "killed" if code > 0 else "timeout"
        done[name] = [outcome, code, stage]
        if outcome == "survived":
            print("survived", name, flush=True)
        args.out.write_text(json.dumps(done, indent=0))
    print(dict(Counter(result[0] for result in done.values())))


if __name__ == "__main__":
    main()
