"""One-time work of specfsm.hf, outside a request and announced when it writes to disk:
``load_model`` converting a GGUF file (a tiny Llama stands in for it) says once on
stderr where the converted copy goes and its size, and is silent when it reuses it; the
output projection's padding (``evaluate.HeadRows``) is measured when a generator is
built, kept beside the converted copy (announced), read back by a later load instead of
measured again, and measured again where what it depends on (the thread count) changed
or the file is unreadable. Nothing is written for a model from anywhere else."""

from __future__ import annotations

import json
import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_helpers import tiny_llama  # noqa: E402

from specfsm.hf import loading  # noqa: E402
from specfsm.hf.evaluate import HeadRows  # noqa: E402
from specfsm.hf.generate import SpeculativeGenerator  # noqa: E402

VOCAB = 64


@pytest.fixture(autouse=True)
def one_thread():
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def _tiny_model():
    return tiny_llama(VOCAB)


def _tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="t0")


def _said(err: str) -> int:
    """How many lines specfsm wrote on stderr (transformers' progress bars aside)."""
    return sum(line.startswith("specfsm:") for line in err.replace("\r", "\n").splitlines())


@pytest.fixture
def gguf(tmp_path, monkeypatch):
    """A ``.gguf`` path whose "conversion" is a tiny Llama, with specfsm's cache in
    ``tmp_path``; ``gguf.conversions`` counts the conversions."""
    monkeypatch.setenv("SPECFSM_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"GGUF stand-in")
    real_model = transformers.AutoModelForCausalLM.from_pretrained
    real_tok = transformers.AutoTokenizer.from_pretrained
    conversions = []

    def model_from(where, *args, gguf_file=None, **kw):
        if gguf_file is None:
            return real_model(where, *args, **kw)
        conversions.append(gguf_file)
        return _tiny_model()

    def tok_from(where, *args, gguf_file=None, **kw):
        return real_tok(where, *args, **kw) if gguf_file is None else _tiny_tokenizer()

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", model_from)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", tok_from)

    class Gguf:
        pass

    g = Gguf()
    g.path, g.conversions = str(path), conversions
    return g


def test_the_first_conversion_says_where_the_copy_goes_and_its_size(gguf, capsys):
    model, tok, info = loading.load_model(gguf.path)
    err = capsys.readouterr().err
    conv = info["cached_to"]
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _s, fs in os.walk(conv) for f in fs)
    assert conv.startswith(os.environ["SPECFSM_CACHE"]) and os.path.isfile(os.path.join(conv, "config.json"))
    assert info["cached_bytes"] == size > 0
    assert _said(err) == 1 and f"saved a float32 copy of tiny.gguf ({loading._megabytes(size)}) to {conv}" in err
    assert gguf.conversions == ["tiny.gguf"]
    again, tok2, info2 = loading.load_model(gguf.path)
    assert _said(capsys.readouterr().err) == 0  # reused: nothing written, nothing said
    assert gguf.conversions == ["tiny.gguf"] and info2["source"] == f"converted copy {conv}"
    assert torch.equal(again.get_output_embeddings().weight, model.get_output_embeddings().weight)
    assert tok2 is not None and tok2("t3 t5")["input_ids"] == [3, 5]


@pytest.fixture
def measured(monkeypatch):
    """``HeadRows.measure`` replaced by a fixed padding, each call counted."""
    calls = []

    def measure(cls, head, repeat=3):
        calls.append(head)
        return {2: 4, 3: 4}

    monkeypatch.setattr(HeadRows, "measure", classmethod(measure))
    return calls


def test_the_head_is_measured_once_per_machine_and_kept_beside_the_converted_copy(gguf, measured, capsys):
    model, _tok, info = loading.load_model(gguf.path)
    capsys.readouterr()
    path = loading.calibration_file(model)
    assert path == os.path.join(info["cached_to"], loading.CALIBRATION_FILE) and not os.path.exists(path)
    gen = SpeculativeGenerator(model, eos_token_id=None)
    assert measured == [model.get_output_embeddings()] and gen._head is not None and gen._head.pad == {2: 4, 3: 4}
    err = capsys.readouterr().err
    assert _said(err) == 1 and "timed the output projection by rows once" in err and path in err
    stored = json.load(open(path))
    (key, pad), = stored["head_rows"].items()
    assert pad == {"2": 4, "3": 4} and "threads 1" in key
    # a second process loads the copy: the padding is read, not measured, and nothing is said
    later, _tok, _info = loading.load_model(gguf.path)
    capsys.readouterr()
    assert later is not model and loading.calibration_file(later) == path
    gen2 = SpeculativeGenerator(later, eos_token_id=None)
    assert len(measured) == 1 and gen2._head.pad == {2: 4, 3: 4}
    assert _said(capsys.readouterr().err) == 0
    out = gen2.generate([[3, 9, 4, 7] * 4], 8)[0]
    assert len(out.tokens) == 8
    # another thread count is another measurement, kept beside the first
    torch.set_num_threads(2)
    third, _tok, _info = loading.load_model(gguf.path)
    SpeculativeGenerator(third, eos_token_id=None)
    torch.set_num_threads(1)
    assert len(measured) == 2 and len(json.load(open(path))["head_rows"]) == 2


BAD_FILES = {
    "not JSON": lambda key: "{not json",
    "not an object": lambda key: json.dumps([1, 2]),
    "another format": lambda key: json.dumps({"format": 99, "head_rows": {key: {"2": 4, "3": 4}}}),
    "a pad past TOP": lambda key: json.dumps({"format": 1, "head_rows": {key: {"2": 9}}}),
    "a pad below its rows": lambda key: json.dumps({"format": 1, "head_rows": {key: {"3": 2}}}),
    "not a table": lambda key: json.dumps({"format": 1, "head_rows": {key: [2, 4]}}),
}


@pytest.mark.parametrize("bad", sorted(BAD_FILES))
def test_an_unreadable_or_foreign_calibration_file_is_measured_again(gguf, measured, bad, capsys):
    model, _tok, _info = loading.load_model(gguf.path)
    path = loading.calibration_file(model)
    key = HeadRows._key(model.get_output_embeddings())
    with open(path, "w") as f:
        f.write(BAD_FILES[bad](key))
    gen = SpeculativeGenerator(model, eos_token_id=None)
    assert len(measured) == 1 and gen._head.pad == {2: 4, 3: 4}
    assert json.load(open(path))["head_rows"][key] == {"2": 4, "3": 4}


def test_nothing_is_written_for_a_model_from_elsewhere(tmp_path, monkeypatch, measured, capsys):
    monkeypatch.setenv("SPECFSM_CACHE", str(tmp_path / "cache"))
    model = _tiny_model()
    assert loading.calibration_file(model) is None  # built in memory
    model.save_pretrained(tmp_path / "mine")
    mine = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "mine")
    assert loading.calibration_file(mine) is None  # the user's own checkpoint directory
    before = sorted(os.listdir(tmp_path / "mine"))
    SpeculativeGenerator(mine, eos_token_id=None)
    assert len(measured) == 1 and sorted(os.listdir(tmp_path / "mine")) == before
    assert not os.path.exists(tmp_path / "cache") and _said(capsys.readouterr().err) == 0


def test_a_cache_that_cannot_be_written_keeps_the_measurement_in_the_process(gguf, measured, capsys, monkeypatch):
    model, _tok, _info = loading.load_model(gguf.path)
    capsys.readouterr()

    def refuse(*_a, **_k):
        raise PermissionError("read-only")

    monkeypatch.setattr(loading.os, "replace", refuse)
    gen = SpeculativeGenerator(model, eos_token_id=None)
    assert gen._head.pad == {2: 4, 3: 4} and _said(capsys.readouterr().err) == 0
    assert not os.path.exists(loading.calibration_file(model))
    assert not [f for f in os.listdir(os.path.dirname(loading.calibration_file(model))) if f.endswith(".tmp")]
    SpeculativeGenerator(model, eos_token_id=None)
    assert len(measured) == 1  # known in this process all the same
