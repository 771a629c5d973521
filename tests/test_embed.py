"""Embedding extraction on real models: egbert's bert, gpt and elmo (tiny, random weights, saved
as a pretraining run leaves them), the real all-MiniLM-L6-v2 and tiny GPT-2 checkpoints, and the
`egbert embed` command, including the match with sentence-transformers."""

from __future__ import annotations

import csv
import io
import itertools
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from model_calls import model_calls
from option_coverage import proves
from safetensors.numpy import load_file
from test_pretrain_run import logged
from transformers import AutoModel, AutoTokenizer

from egbert import cli
from egbert.arguments import parse_args
from egbert.commands.embed import main
from egbert.embedding import COMBINES, POOLS, embed, load_model
from egbert.embedding.options import EMBED_ARGUMENTS
from egbert.errors import CheckpointError, ConfigError, DataError
from egbert.models.bert import EgbertBertConfig, EgbertBertForPreTraining
from egbert.models.elmo import EgbertElmoConfig, EgbertElmoForBidirectionalLM
from egbert.models.gpt import EgbertGPTConfig, EgbertGPTForCausalLM

TEXTS = [
    "The castle was rebuilt in the twelfth century.",
    "Rain.",
    ("Who rebuilt the castle?", "The king's engineers rebuilt it after the siege."),
    "An unremarkable, extraordinarily overlong sentence about the history of the river valley "
    "and the villages that grew up along it.",
]
FAMILIES = ["bert", "gpt", "elmo"]
WIDTH = 32  # hidden size of the tiny bert and gpt; 2 * 16 for elmo's [forward; backward]


def tiny_pretraining_model(family: str, vocab_size: int, pad_id: int):
    torch.manual_seed(0)
    transformer = dict(
        vocab_size=vocab_size,
        hidden_size=WIDTH,
        num_hidden_layers=4,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        pad_token_id=pad_id,
    )
    if family == "bert":
        return EgbertBertForPreTraining(EgbertBertConfig(**transformer))
    if family == "gpt":
        return EgbertGPTForCausalLM(EgbertGPTConfig(**transformer))
    config = EgbertElmoConfig(
        vocab_size=vocab_size,
        hidden_size=WIDTH // 2,
        cell_size=32,
        num_hidden_layers=2,
        pad_token_id=pad_id,
    )
    return EgbertElmoForBidirectionalLM(config)


@pytest.fixture(scope="module")
def family_dirs(tiny_tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Each family's pretraining model (with its LM head) saved with the trained tokenizer."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    dirs = {}
    for family in FAMILIES:
        out = tmp_path_factory.mktemp(f"tiny-{family}")
        model = tiny_pretraining_model(family, len(tokenizer), tokenizer.pad_token_id)
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        dirs[family] = out
    return dirs


@pytest.fixture(scope="module")
def loaded(family_dirs: dict, minilm_dir: Path, tiny_gpt2_dir: Path) -> dict:
    """name -> (base model, tokenizer): the three tiny families, MiniLM and the stock tiny GPT-2."""
    dirs = {**family_dirs, "minilm": minilm_dir, "gpt2": tiny_gpt2_dir}
    return {name: load_model(path, "cpu") for name, path in dirs.items()}


def run(loaded: dict, name: str, texts=TEXTS, **options):
    """`embed` with a loaded model; per-token results unless a test pools (pool=...)."""
    model, tokenizer = loaded[name]
    return embed(model, texts, tokenizer=tokenizer, **{"pool": "none", **options})


def hidden_states(loaded: dict, name: str, text: str) -> tuple[torch.Tensor, ...]:
    """The model's own hidden_states for one unpadded text: (embeddings, layer 1..N)."""
    model, tokenizer = loaded[name]
    inputs = tokenizer(text, return_tensors="pt")
    with torch.inference_mode():
        outputs = model(
            input_ids=inputs["input_ids"],
            attention_mask=inputs["attention_mask"],
            output_hidden_states=True,
        )
    return tuple(layer[0] for layer in outputs.hidden_states)  # each (seq, dim)


# ---------------------------------------------------------------------------------------------
# The library


@pytest.mark.parametrize("name", [*FAMILIES, "minilm"])
def test_shapes_for_every_combine_and_pool(loaded: dict, name: str):
    width = 384 if name == "minilm" else WIDTH
    layers = (-1, -2, -3)
    for combine in COMBINES:
        chosen = (-1,) if combine == "none" else layers
        dim = width * len(chosen) if combine in ("concat", "none") else width
        for pool in POOLS:
            result = run(loaded, name, layers=chosen, combine=combine, pool=pool)
            if pool != "none":
                assert result.shape == (len(TEXTS), dim) and result.dtype == np.float32
                continue
            assert len(result) == len(TEXTS)
            for item in result:
                assert item.vectors.shape == (len(item.tokens), dim)
                assert len(item.offsets) == len(item.sequence_ids) == len(item.tokens)


@pytest.mark.parametrize("name", [*FAMILIES, "minilm"])
def test_padding_never_changes_a_vector(loaded: dict, name: str):
    short = TEXTS[1]  # padded to the longest text when batched with the others
    for pool in ("mean", "cls", "last"):
        alone = run(loaded, name, [short], layers=(-1, -2), pool=pool)[0]
        batched = run(loaded, name, TEXTS, layers=(-1, -2), pool=pool)[1]
        np.testing.assert_allclose(alone, batched, atol=1e-5)
    alone = run(loaded, name, [short], layers=(-1,), combine="none")[0]
    batched = run(loaded, name, TEXTS, layers=(-1,), combine="none")[1]
    np.testing.assert_allclose(alone.vectors, batched.vectors, atol=1e-5)


@pytest.mark.parametrize("name", [*FAMILIES, "minilm", "gpt2"])
def test_layer_indices_pick_hidden_states(loaded: dict, name: str):
    text = TEXTS[0]
    states = hidden_states(loaded, name, text)
    last = run(loaded, name, [text], layers=(-1,), combine="none")[0]
    np.testing.assert_allclose(last.vectors, states[-1].numpy(), atol=1e-5)
    embeddings = run(loaded, name, [text], layers=(0,), combine="none")[0]
    np.testing.assert_allclose(embeddings.vectors, states[0].numpy(), atol=1e-5)
    assert len(last.tokens) == states[-1].shape[0]


def test_concat_of_the_last_four_is_the_manual_concatenation(loaded: dict):
    text = TEXTS[3]
    states = hidden_states(loaded, "minilm", text)
    manual = torch.cat([states[-1], states[-2], states[-3], states[-4]], dim=-1).numpy()
    tokens = run(loaded, "minilm", [text])[0]  # defaults: the last four layers, concatenated
    np.testing.assert_allclose(tokens.vectors, manual, atol=1e-5)
    pooled = run(loaded, "minilm", [text], pool="mean")[0]
    np.testing.assert_allclose(pooled, manual.mean(0), atol=1e-5)


def test_sum_mean_scalar_mix_and_the_pools_by_hand(loaded: dict):
    text = TEXTS[0]
    states = torch.stack(hidden_states(loaded, "minilm", text)[-2:]).numpy()  # (2, seq, dim)
    for combine, manual in [
        ("sum", states.sum(0)),
        ("mean", states.mean(0)),
        ("scalar-mix", states.mean(0)),  # untrained: equal weights, gamma 1
    ]:
        tokens = run(loaded, "minilm", [text], layers=(-1, -2), combine=combine)[0]
        np.testing.assert_allclose(tokens.vectors, manual, atol=1e-5)
        for pool, expected in [("cls", manual[0]), ("last", manual[-1]), ("mean", manual.mean(0))]:
            pooled = run(loaded, "minilm", [text], layers=(-1, -2), combine=combine, pool=pool)
            np.testing.assert_allclose(pooled[0], expected, atol=1e-5)
    unit = run(loaded, "minilm", [text], pool="mean", normalize=True)
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, atol=1e-6)


def test_last_pool_takes_the_last_real_token_of_gpt(loaded: dict):
    states = hidden_states(loaded, "gpt", TEXTS[0])
    pooled = run(loaded, "gpt", TEXTS, layers=(-1,), combine="none", pool="last")
    np.testing.assert_allclose(pooled[0], states[-1][-1].numpy(), atol=1e-5)


def test_tokens_keep_offsets_into_their_own_text(loaded: dict):
    result = run(loaded, "minilm", TEXTS, layers=(-1,), combine="none")
    pair = result[2]
    assert pair.tokens[0] == "[CLS]" and pair.sequence_ids[0] is None
    for token, (start, end), sequence_id in zip(
        pair.tokens, pair.offsets, pair.sequence_ids, strict=True
    ):
        if sequence_id is not None:
            source = TEXTS[2][sequence_id].lower()
            assert source[start:end] == token.removeprefix("##")
    assert {0, 1} <= set(pair.sequence_ids)


@pytest.mark.parametrize("name", ["minilm", "bert", "gpt2"])
def test_word_level_averages_the_pieces_of_each_word(loaded: dict, name: str):
    text = "An unremarkable, extraordinarily overlong sentence."
    pieces = run(loaded, name, [text], layers=(-1,), combine="none")[0]
    words = run(loaded, name, [text], layers=(-1,), combine="none", word_level=True)[0]
    assert words.tokens == [
        "An",
        "unremarkable",
        ",",
        "extraordinarily",
        "overlong",
        "sentence",
        ".",
    ]
    assert [text[start:end] for start, end in words.offsets] == words.tokens
    assert len(pieces.tokens) > len(words.tokens)  # some words were split into pieces
    _, tokenizer = loaded[name]
    word_ids = tokenizer(text).word_ids()
    for word, vector in enumerate(words.vectors):
        positions = [p for p, w in enumerate(word_ids) if w == word]
        np.testing.assert_allclose(vector, pieces.vectors[positions].mean(0), atol=1e-6)


def test_long_inputs_are_truncated_with_a_count_or_windowed(loaded: dict):
    long_text = " ".join(["the river valley and its villages"] * 30)  # ~180 tokens, limit 64
    with pytest.warns(UserWarning, match="1 of 2 inputs were longer than 64 tokens"):
        truncated = run(loaded, "bert", [long_text, "short"], layers=(-1,), combine="none")
    assert len(truncated[0].tokens) == 64

    windowed = run(loaded, "bert", [long_text, "short"], layers=(-1,), combine="none", stride=16)
    full = loaded["bert"][1](long_text).encodings[0]
    assert windowed[0].tokens == full.tokens and windowed[0].offsets == full.offsets
    pooled = run(loaded, "bert", [long_text], pool="mean", stride=16)
    # Two float32 sums of ~180 vectors in different orders: agree to float32 rounding, not 1e-6.
    np.testing.assert_allclose(
        pooled[0], run(loaded, "bert", [long_text], stride=16)[0].vectors.mean(0), atol=1e-5
    )

    # a text that fits in one window gets exactly the unwindowed vectors
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*inputs were longer than")
        short = run(loaded, "bert", [TEXTS[0]], layers=(-1,), combine="none", stride=8)[0]
    plain = run(loaded, "bert", [TEXTS[0]], layers=(-1,), combine="none")[0]
    np.testing.assert_allclose(short.vectors, plain.vectors, atol=1e-6)


def test_window_tokens_come_from_the_window_with_most_context(loaded: dict):
    """Window 1 holds text tokens 0..61 and window 2 tokens 46..107 (stride 16, 62 per window):
    token 50 sits 11 tokens from window 1's end and 4 from window 2's start, so it comes from
    window 1; token 58 (3 from the end of window 1, 12 into window 2) comes from window 2."""
    model, tokenizer = loaded["bert"]
    long_text = " ".join(["the river valley and its villages"] * 30)
    stitched = run(loaded, "bert", [long_text], layers=(-1,), combine="none", stride=16)[0]
    windows = tokenizer(
        long_text, truncation=True, max_length=64, stride=16, return_overflowing_tokens=True
    )
    first, second = (
        run(
            loaded,
            "bert",
            [tokenizer.decode(windows["input_ids"][w][1:-1])],
            layers=(-1,),
            combine="none",
        )[0]
        for w in (0, 1)
    )
    np.testing.assert_allclose(stitched.vectors[1 + 50], first.vectors[1 + 50], atol=1e-5)
    np.testing.assert_allclose(stitched.vectors[1 + 58], second.vectors[1 + 58 - 46], atol=1e-5)


def test_user_mistakes_raise_one_line_errors(loaded: dict, tmp_path: Path):
    with pytest.raises(ConfigError, match=r"layer 5 does not exist .* 0\.\.4 .* -1\.\.-5"):
        run(loaded, "bert", layers=(5,))
    with pytest.raises(ConfigError, match=r"layer -4 does not exist .* 2 layers"):
        run(loaded, "elmo", layers=(-1, -2, -3, -4))
    with pytest.raises(ConfigError, match="exactly one layer"):
        run(loaded, "minilm", combine="none")
    with pytest.raises(ConfigError, match="pool='none'"):
        run(loaded, "minilm", pool="mean", word_level=True)
    with pytest.raises(ConfigError, match="pairs"):
        run(loaded, "minilm", stride=8)
    with pytest.raises(ConfigError, match="single string"):
        run(loaded, "minilm", "one text")
    with pytest.raises(DataError, match="no texts"):
        run(loaded, "minilm", [])
    with pytest.raises(DataError, match="text 2 of the input has no tokens"):
        run(loaded, "gpt2", ["fine", ""], layers=(-1,), pool="mean")
    with pytest.raises(CheckpointError, match="not found"):
        embed(tmp_path / "missing", ["text"])


@pytest.mark.parametrize("family", FAMILIES)
def test_a_pretraining_checkpoint_dir_embeds_with_its_base_model(family_dirs: dict, family: str):
    """`embed(dir)` loads the base model out of a saved pretraining model, LM head and all."""
    model, tokenizer = load_model(family_dirs[family], "cpu")
    from_dir = embed(family_dirs[family], TEXTS[:2], layers=(-1,), combine="none", pool="mean")
    lm = tiny_pretraining_model(family, len(tokenizer), tokenizer.pad_token_id).eval()
    inputs = tokenizer(TEXTS[0], return_tensors="pt")
    with torch.inference_mode():
        states = lm(
            input_ids=inputs["input_ids"],
            attention_mask=inputs["attention_mask"],
            output_hidden_states=True,
        ).hidden_states
    np.testing.assert_allclose(from_dir[0], states[-1][0].mean(0).numpy(), atol=1e-5)


def test_loading_a_pretraining_model_keeps_transformers_load_report_off_stderr(family_dirs: dict):
    """The base model out of a bert pretraining model leaves its MLM and NSP heads behind, as
    egbert means it to: transformers' report of them (a warning at every such load) is not
    for the user to act on. Nor is "The following layers were not sharded", which transformers
    says of a model without a tensor-parallel plan when modeling_utils' logger has a level of
    its own (as quieting the report by its level gave it)."""
    loggers = ("transformers.modeling_utils", "transformers.distributed.tensor_parallel")
    with logged(*loggers) as records:
        load_model(family_dirs["bert"], "cpu")
    assert [record.getMessage()[:80] for record in records] == []


# ---------------------------------------------------------------------------------------------
# The command line


def test_cli_writes_npy_safetensors_and_jsonl(family_dirs: dict, tmp_path: Path):
    model_dir = family_dirs["bert"]
    source = tmp_path / "input.txt"
    lines = [t if isinstance(t, str) else f"{t[0]} ||| {t[1]}" for t in TEXTS]
    source.write_text("\n".join(lines * 3) + "\n", encoding="utf-8")
    expected = embed(model_dir, TEXTS * 3, layers=(-1, -2), pool="cls", normalize=True)
    common = ["--model", str(model_dir), "--input", str(source), "--layers", "-1,-2"]
    common += ["--pool", "cls", "--normalize", "--batch-size", "2"]

    main([*common, "--output", str(tmp_path / "out.npy")])
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), expected, atol=1e-6)

    main([*common, "--output", str(tmp_path / "out.safetensors")])
    tensors = load_file(tmp_path / "out.safetensors")
    np.testing.assert_allclose(tensors["embeddings"], expected, atol=1e-6)

    main([*common, "--output", str(tmp_path / "out.jsonl")])
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").open()]
    np.testing.assert_allclose([r["vector"] for r in records], expected, atol=1e-6)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["input.txt", "out.npy", "out.safetensors", "out.jsonl"]
    )  # no temp files left


def last_four_mean(model_dir: Path, text: str) -> np.ndarray:
    """embed's default vector by its definition: the mean over the text's tokens of the last
    four layers' hidden states concatenated (the last first), from transformers' AutoModel."""
    states, _ = model_states(model_dir, text)
    return torch.cat([states[-1], states[-2], states[-3], states[-4]], dim=-1).mean(0).numpy()


def test_the_library_and_the_command_share_their_defaults(family_dirs: dict, tmp_path: Path):
    """Mean pooling of the last four layers concatenated, in batches of 64, both ways."""
    model_dir = family_dirs["bert"]
    source = tmp_path / "input.txt"
    source.write_text("\n".join(TEXTS[:2]) + "\n", encoding="utf-8")
    main(["--model", str(model_dir), "--input", str(source), "--output", str(tmp_path / "o.npy")])
    expected = np.stack([last_four_mean(model_dir, text) for text in TEXTS[:2]])
    assert expected.shape == (2, 4 * WIDTH)
    np.testing.assert_allclose(np.load(tmp_path / "o.npy"), expected, atol=1e-5)
    np.testing.assert_allclose(embed(model_dir, TEXTS[:2]), expected, atol=1e-5)
    argv = ["--model", "m", "--input", "i", "--output", "o"]
    _, parser_defaults, _ = parse_args(EMBED_ARGUMENTS, argv, "egbert embed", "")
    assert (parser_defaults.pool, parser_defaults.batch_size) == ("mean", 64)
    assert parser_defaults.layers is None  # the model's last four layers, or all of fewer


def test_the_default_layers_are_the_last_four_or_all_of_a_shallower_model(
    family_dirs: dict, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture
):
    """docs/commands.md's `echo "a sentence" | egbert embed --model DIR --input - --output -`
    on a model of two layers (the tiny preset's depth): both, concatenated."""
    monkeypatch.setattr("sys.stdin", io.StringIO("a sentence\n"))
    cli.main(["embed", "--model", str(family_dirs["elmo"]), "--input", "-", "--output", "-"])
    vector = json.loads(capfd.readouterr().out)["vector"]
    expected = embed(family_dirs["elmo"], ["a sentence"], layers=(-1, -2), pool="mean")
    assert len(vector) == 2 * WIDTH
    np.testing.assert_allclose(vector, expected[0], atol=1e-6)


def test_cli_reads_stdin_and_writes_jsonl_to_stdout(
    family_dirs: dict, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture
):
    """`echo "a sentence" | egbert embed --model M --input - --output -`: one JSON line on
    stdout, everything else on stderr."""
    monkeypatch.setattr("sys.stdin", io.StringIO("a sentence\n"))
    cli.main(["embed", "--model", str(family_dirs["gpt"]), "--input", "-", "--output", "-"])
    out, err = capfd.readouterr()
    lines = out.splitlines()
    assert len(lines) == 1, out
    expected = last_four_mean(family_dirs["gpt"], "a sentence")
    np.testing.assert_allclose(json.loads(lines[0])["vector"], expected, atol=1e-5)
    assert "wrote 1 embeddings to stdout" in err


def test_output_to_a_file_from_python_streams_any_iterable(family_dirs: dict, tmp_path: Path):
    """`embed(..., output=...)` from Python: a generator into .npy (listed first: the header
    needs the count) and into .jsonl, per-token, in chunks."""
    model_dir = family_dirs["bert"]
    texts = TEXTS * 5
    written = embed(model_dir, (t for t in texts), output=tmp_path / "v.npy", batch_size=2)
    assert written == tmp_path / "v.npy"
    np.testing.assert_allclose(np.load(written), embed(model_dir, texts), atol=1e-6)
    embed(model_dir, iter(texts), output=tmp_path / "t.jsonl", pool="none", layers=(-1,))
    records = [json.loads(line) for line in (tmp_path / "t.jsonl").open()]
    assert len(records) == len(texts) and np.array(records[1]["vectors"]).shape[1] == WIDTH
    with pytest.raises(ConfigError, match="go to .jsonl"):
        embed(model_dir, texts, output=tmp_path / "t.npy", pool="none")
    with pytest.raises(DataError, match="no texts"):
        embed(model_dir, iter([]), output=tmp_path / "e.jsonl")
    assert not (tmp_path / "e.jsonl").exists()


def test_cli_token_level_jsonl_from_jsonl_pairs(family_dirs: dict, tmp_path: Path):
    model_dir = family_dirs["gpt"]
    source = tmp_path / "pairs.jsonl"
    rows = [{"premise": "A man sleeps.", "hypothesis": "Nobody sleeps."}] * 2
    source.write_text("\n".join(json.dumps(row) for row in rows) + "\n\n", encoding="utf-8")
    output = tmp_path / "words.jsonl"
    main(["--model", str(model_dir), "--input", str(source), "--output", str(output),
          "--text-field", "premise", "--pair-field", "hypothesis", "--layers", "-1",
          "--combine", "none", "--pool", "none", "--word-level"])  # fmt: skip
    records = [json.loads(line) for line in output.open()]
    assert len(records) == 2
    assert records[0]["tokens"] == ["A", "man", "sleeps", ".", "Nobody", "sleeps", "."]
    assert records[0]["sequence_ids"] == [0, 0, 0, 0, 1, 1, 1]
    assert np.array(records[0]["vectors"]).shape == (7, WIDTH)


def test_cli_errors_are_one_line_and_leave_no_file(family_dirs: dict, tmp_path: Path, capsys):
    source = tmp_path / "in.txt"
    source.write_text("one\ntwo\n", encoding="utf-8")
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    model = str(family_dirs["bert"])
    cases = [
        (["--model", str(tmp_path / "nope"), "--input", str(source)], "model directory"),
        (["--model", model, "--input", str(empty)], "is empty"),
        (["--model", model, "--input", str(source), "--layers", "-9"], "layer -9 does not exist"),
        (["--model", model, "--input", str(source), "--output", "x.csv"], "unknown extension"),
        (["--model", model, "--input", str(source), "--pool", "none"], "go to .jsonl"),
    ]
    for args, message in cases:
        if "--output" not in args:
            args = [*args, "--output", str(tmp_path / "out.npy")]
        with pytest.raises(SystemExit) as exit_info:
            cli.main(["embed", *args])
        assert message in str(exit_info.value) and "\n" not in str(exit_info.value)
    bad = tmp_path / "bad.jsonl"  # fails in the second chunk, after rows were written
    bad.write_text('{"text": "fine"}\n' * 40 + '{"other": 1}\n', encoding="utf-8")
    with pytest.raises(DataError, match="line 41: no text field 'text'"):
        main(["--model", model, "--input", str(bad), "--output", str(tmp_path / "out.npy"),
              "--batch-size", "2"])  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "empty.txt", "in.txt"]


def test_cli_matches_sentence_transformers_on_sst2(minilm_dir: Path, data_dir: Path, tmp_path):
    """The acceptance check: mean pooling of the last layer, normalized, as all-MiniLM-L6-v2's
    sentence-transformers pipeline (which truncates at max_seq_length 256)."""
    from sentence_transformers import SentenceTransformer

    with (data_dir / "glue" / "SST-2" / "dev.tsv").open(encoding="utf-8", newline="") as handle:
        rows = csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        sentences = [row["sentence"] for row in itertools.islice(rows, 200)]
    source = tmp_path / "sst2.txt"
    source.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    output = tmp_path / "sst2.npy"
    main(["--model", str(minilm_dir), "--input", str(source), "--output", str(output),
          "--pool", "mean", "--layers", "-1", "--combine", "none", "--normalize",
          "--max-length", "256"])  # fmt: skip
    ours = np.load(output)
    reference = SentenceTransformer(str(minilm_dir), device="cpu").encode(
        sentences, normalize_embeddings=True, batch_size=64
    )
    cosine = (ours * reference).sum(1)
    assert ours.shape == (200, 384)
    assert cosine.min() >= 0.9999


# ---------------------------------------------------------------------------------------------
# The command's options, against the model's own hidden states


def model_states(model_dir: Path, *texts: str, max_length: int | None = None):
    """(hidden_states, word_ids) of one text or pair run alone through transformers' AutoModel."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir).eval()
    inputs = tokenizer(
        *texts, truncation=max_length is not None, max_length=max_length, return_tensors="pt"
    )
    with torch.no_grad():
        outputs = model(**inputs, output_hidden_states=True)
    return [layer[0] for layer in outputs.hidden_states], inputs.word_ids()


@proves(
    "embed", "--model", "--input", "--output", "--layers", "--combine", "--pool", "--max-length",
    "--batch-size", "--text-field", "--pair-field", "--encoding",
)  # fmt: skip
def test_cli_pools_the_layers_it_names_of_the_pairs_it_reads(family_dirs: dict, tmp_path: Path):
    """Latin-1 JSONL pairs, cut to 12 tokens: the mean of layers -1 and -3 at the last real
    token ([SEP]) of each pair, in batches of 2."""
    rows = [
        {"first": "Un café à Paris, déjà vu.", "second": "The crème brûlée was très bon."},
        {"first": "Rain.", "second": "Snow."},
        {"first": "The castle was rebuilt in the twelfth century.", "second": "It fell."},
    ]
    source = tmp_path / "pairs.jsonl"
    text = "".join(json.dumps({"id": 1, **row}, ensure_ascii=False) + "\n" for row in rows)
    source.write_bytes(text.encode("latin-1"))
    output, model_dir = tmp_path / "vectors.npy", family_dirs["bert"]
    with model_calls() as calls:
        main(["--model", str(model_dir), "--input", str(source), "--output", str(output),
              "--text-field", "first", "--pair-field", "second", "--encoding", "latin-1",
              "--layers", "-1,-3", "--combine", "mean", "--pool", "last", "--max-length", "12",
              "--batch-size", "2"])  # fmt: skip
    vectors = np.load(output)
    assert vectors.shape == (3, WIDTH)
    for row, vector in zip(rows, vectors, strict=True):
        states, _ = model_states(model_dir, row["first"], row["second"], max_length=12)
        np.testing.assert_allclose(vector, (states[-1][-1] + states[-3][-1]) / 2, atol=1e-5)
    full, _ = model_states(model_dir, rows[0]["first"], rows[0]["second"])
    assert len(full[0]) > 12  # the first pair was cut
    assert sorted(call.batch_size for call in calls) == [1, 2]


@proves("embed", "--word-level", "--normalize", "--stride")
def test_cli_word_vectors_are_unit_means_of_their_pieces_over_windows(
    family_dirs: dict, tmp_path: Path
):
    """Per word, the mean of its pieces' vectors in layer -2, at unit length; a text longer than
    --max-length 24 is embedded whole, in windows overlapping by --stride 4, not cut."""
    text = "An unremarkable, overlong sentence."
    long_text = " ".join(["the river valley and its villages"] * 6)
    source, output = tmp_path / "texts.txt", tmp_path / "words.jsonl"
    source.write_text(f"{text}\n{long_text}\n", encoding="utf-8")
    model_dir = family_dirs["bert"]
    main(["--model", str(model_dir), "--input", str(source), "--output", str(output),
          "--layers", "-2", "--combine", "none", "--pool", "none", "--word-level", "--normalize",
          "--max-length", "24", "--stride", "4"])  # fmt: skip
    short, long = (json.loads(line) for line in output.read_text(encoding="utf-8").splitlines())
    states, word_ids = model_states(model_dir, text)
    long_tokens = AutoTokenizer.from_pretrained(model_dir)(long_text)["input_ids"]
    assert len(word_ids) <= 24 < len(long_tokens)  # the first in one window, the other not
    assert short["tokens"] == ["An", "unremarkable", ",", "overlong", "sentence", "."]
    for word, vector in enumerate(short["vectors"]):
        pieces = [i for i, owner in enumerate(word_ids) if owner == word]
        expected = states[-2][pieces].mean(0)
        np.testing.assert_allclose(vector, expected / expected.norm(), atol=1e-5)
    assert long["tokens"] == long_text.split()


@proves("embed", "--device")
def test_cli_runs_the_model_on_the_device_given(family_dirs: dict, tmp_path: Path):
    source = tmp_path / "texts.txt"
    source.write_text("one text\nanother\n", encoding="utf-8")
    argv = ["--model", str(family_dirs["gpt"]), "--input", str(source), "--output"]
    argv += [str(tmp_path / "v.npy"), "--layers", "-1"]
    with model_calls() as calls:
        main([*argv, "--device", "cpu"])
    assert {call.device for call in calls} == {"cpu"}
    with model_calls() as calls, pytest.raises(NotImplementedError, match="meta"):
        main([*argv, "--device", "meta"])
    assert calls[0].device == "meta"


@proves("embed", "--bf16", "--fp16")
def test_cli_runs_the_model_under_the_autocast_given(family_dirs: dict, tmp_path: Path):
    """The model runs under bf16 (fp16) autocast, and the vectors, float32 still, are those of
    the model run under torch.autocast by hand (which embed leaves on, as the probe's --bf16
    needs); without either, in float32."""
    texts = ["one text", "another one, longer"]
    source = tmp_path / "texts.txt"
    source.write_text("\n".join(texts) + "\n", encoding="utf-8")
    output = tmp_path / "v.npy"
    argv = ["--model", str(family_dirs["bert"]), "--input", str(source), "--output", str(output)]
    argv += ["--layers", "-1", "--combine", "none"]
    with model_calls() as calls:
        main(argv)
    assert [call.autocast for call in calls] == [False]
    model, tokenizer = load_model(family_dirs["bert"], "cpu")
    for flag, dtype in (("--bf16", torch.bfloat16), ("--fp16", torch.float16)):
        with model_calls() as calls:
            main([*argv, flag])
        assert [call.dtype for call in calls] == [dtype]
        with torch.autocast("cpu", dtype=dtype):
            expected = embed(model, texts, layers=(-1,), combine="none", tokenizer=tokenizer)
        vectors = np.load(output)
        assert vectors.dtype == np.float32 and np.array_equal(vectors, expected)
    with pytest.raises(ConfigError, match="choose one"):
        embed(model, texts, tokenizer=tokenizer, bf16=True, fp16=True)


@pytest.mark.parametrize(
    ("second_line", "message"),
    [
        ('{"text": "cut off', "broken.jsonl:2: not valid JSON"),
        ('["a list"]', "broken.jsonl:2: expected a JSON object per line"),
        ('{"text": "\\ud800"}', "broken.jsonl:2: a \\\\u escape stands for half a character"),
    ],
)
def test_a_jsonl_input_line_that_is_no_object_is_named_by_file_and_line(
    family_dirs: dict, tmp_path: Path, second_line: str, message: str
):
    """The JSONL reader fine-tuning's custom tasks use (egbert.jsonl), with its messages."""
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "fine"}\n' + second_line + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=message):
        main(["--model", str(family_dirs["bert"]), "--input", str(broken), "--output",
              str(tmp_path / "out.npy")])  # fmt: skip
