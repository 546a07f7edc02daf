"""Spec-Bench in ``specfsm generate``: its question file as a prompts file, each turn of a
multi-turn question answered after the model's own answer, ``--per-category``, and the
per-group table and ``--json`` keys. A tiny Llama with a word-level tokenizer and a chat
template stands in for a chat model (no downloads); every answer is checked against
``model.generate`` on the prompt Spec-Bench's protocol builds."""

from __future__ import annotations

import json
import os

import pytest

from specfsm.hf.compare import converse
from specfsm.hf.prompts import (
    SPEC_BENCH_GROUPS,
    NextTurn,
    chat_ids,
    load_prompts,
    next_turns,
    per_category,
    spec_bench_group,
)
from specfsm.serving.workload import WorkloadError

SPEC_BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "spec_bench", "question.jsonl")
WORDS = ["<user>", "<assistant>", "</s>"] + [f"w{i}" for i in range(40)]
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} </s> {% endfor %}"
            "{% if add_generation_prompt %}<assistant> {% endif %}")


def _line(qid, category, *turns):
    return json.dumps({"question_id": qid, "category": category, "turns": list(turns)})


def _file(tmp_path, lines, name="q.jsonl"):
    f = tmp_path / name
    f.write_text("\n".join(lines) + "\n")
    return str(f)


# -- the format -------------------------------------------------------------------------
def test_spec_bench_lines_are_turns_named_by_category_and_id(tmp_path):
    path = _file(tmp_path, [_line(81, "writing", "write it", "now shorter"), _line(91, "translation", "translate"),
                            json.dumps({"turns": ["a", "b", "c"], "name": "mine", "kind": "k"})])
    a, b, c = load_prompts(path)
    assert (a.name, a.kind, a.turns) == ("writing-81", "writing", ["write it", "now shorter"])
    assert a.messages == [{"role": "user", "content": "write it"}]  # the first turn's prompt
    assert (b.name, b.kind, b.turns) == ("translation-91", "translation", ["translate"])
    assert (c.name, c.kind, c.turns) == ("mine", "k", ["a", "b", "c"])


@pytest.mark.parametrize("bad, why", [
    ({"turns": []}, "'turns' must be a non-empty list"),
    ({"turns": ["a", ""]}, "'turns' must be a non-empty list"),
    ({"turns": "a"}, "'turns' must be a non-empty list"),
    ({"turns": ["a", 3]}, "'turns' must be a non-empty list"),
    ({"turns": ["a"], "text": "b"}, "exactly one of"),
    ({"turns": ["a"], "category": 5}, "'category' must be a string"),
])
def test_bad_turns_lines_are_reported_by_line(tmp_path, bad, why):
    path = _file(tmp_path, [_line(1, "qa", "fine"), json.dumps(bad)])
    with pytest.raises(WorkloadError) as e:
        load_prompts(path)
    assert f"{path}:2: " in str(e.value) and why in str(e.value) and f"{path}:1:" not in str(e.value)


def test_per_category_keeps_the_first_of_each_kind_in_file_order(tmp_path):
    lines = [_line(i, cat, "q") for i, cat in enumerate(["qa", "qa", "rag", "qa", "rag", "rag", "math"])]
    specs = load_prompts(_file(tmp_path, lines))
    assert [s.name for s in per_category(specs, 2)] == ["qa-0", "qa-1", "rag-2", "rag-4", "math-6"]
    assert [s.name for s in per_category(specs, 1)] == ["qa-0", "rag-2", "math-6"]


def test_the_groups_are_the_leaderboards():
    cats = [c for cs in SPEC_BENCH_GROUPS.values() for c in cs]
    assert len(cats) == len(set(cats)) == 13
    assert list(SPEC_BENCH_GROUPS) == ["multi-turn", "translation", "summarization", "qa", "math_reasoning", "rag"]
    assert spec_bench_group("coding") == "multi-turn" and spec_bench_group("rag") == "rag"
    assert spec_bench_group("poetry") is None and spec_bench_group(None) is None


@pytest.mark.skipif(not os.path.isfile(SPEC_BENCH), reason="../shared/spec_bench/question.jsonl is not beside the checkout")
def test_the_real_question_file_reads_as_it_is():
    specs = load_prompts(SPEC_BENCH)
    assert len(specs) == 480
    assert all(spec_bench_group(s.kind) is not None for s in specs)
    five = per_category(specs, 5)
    assert len(five) == 65 and sum(len(s.turns) for s in five) == 65 + 40  # MT-bench's are two turns


# -- turns ----------------------------------------------------------------------------------
class _Tok:
    """A tokenizer that templates by message lengths and decodes ids as words."""

    chat_template = "yes"

    def __init__(self):
        self.seen = []

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        self.seen.append(messages)
        return [len(m["content"]) for m in messages] + [0]

    def decode(self, ids, skip_special_tokens):
        assert skip_special_tokens
        return " " + " ".join(f"t{i}" for i in ids) + " \n"


def test_next_turn_templates_the_model_s_own_answers():
    tok = _Tok()
    nxt = NextTurn(["first?", "second?", "third!"], tok)
    assert nxt([[1, 2]]) == [6, 5, 7, 0]
    assert tok.seen[-1] == [{"role": "user", "content": "first?"}, {"role": "assistant", "content": "t1 t2"},
                            {"role": "user", "content": "second?"}]
    assert nxt([[1], [3]])[-2:] == [6, 0] and nxt([[1], [2], [3]]) is None
    assert chat_ids(tok, [{"role": "user", "content": "abc"}]) == [3, 0]


def test_converse_answers_turn_by_turn_after_each_request_s_own_answers():
    calls = []

    def decode(ps):
        calls.append([list(p) for p in ps])
        return [[sum(p) % 7, len(calls)] for p in ps]

    follows = [lambda a: None if len(a) > 1 else [9] + a[-1], None, lambda a: [len(a)] if len(a) < 3 else None]
    answers, seconds = converse(decode, [[1], [2], [3]], follows)
    assert calls == [[[1], [2], [3]], [[9, 1, 1], [1]], [[2]]]
    assert answers == [[[1, 1], [4, 2]], [[2, 1]], [[3, 1], [1, 2], [2, 3]]]
    assert seconds >= 0


def test_next_turns_only_for_requests_of_several_turns(tmp_path):
    specs = load_prompts(_file(tmp_path, [_line(1, "stem", "a", "b"), _line(2, "qa", "c"), json.dumps({"text": "d"})]))
    a, b, c = next_turns(specs, _Tok())
    assert isinstance(a, NextTurn) and a.turns == ["a", "b"] and b is None and c is None


# -- on a model -----------------------------------------------------------------------------
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from hf_helpers import one_thread  # noqa: E402, F401 (a module-wide fixture)
from hf_helpers import reference as _greedy  # noqa: E402
from hf_helpers import run_cli as _run  # noqa: E402


@pytest.fixture(scope="module")
def chat_checkpoint(tmp_path_factory):
    """A tiny Llama saved with a word-level tokenizer and a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path = tmp_path_factory.mktemp("tiny-chat")
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS + ["<unk>"])}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", eos_token="</s>",
                                  additional_special_tokens=["<user>", "<assistant>"])
    tok.chat_template = TEMPLATE
    tok.save_pretrained(path)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(WORDS) + 1, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    model.save_pretrained(path)
    return str(path)


def _questions(tmp_path):
    """Spec-Bench lines: two MT-bench categories (two turns) and three single-turn ones,
    two questions each, repetitive enough for drafts to be accepted."""
    def words(seed, n):
        return " ".join(f"w{(seed * 7 + (i % 5) * 3) % 40}" for i in range(n))

    lines, qid = [], 80
    for cat, turns in [("writing", 2), ("coding", 2), ("translation", 1), ("qa", 1), ("rag", 1)]:
        for j in range(2):
            qid += 1
            lines.append(_line(qid, cat, *[words(qid + t, 12 + 4 * t) for t in range(turns)]))
    return _file(tmp_path, lines)


def _template(tok, msgs):
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_generate_answers_every_turn_after_its_own_answer(chat_checkpoint, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = _questions(tmp_path)
    rc = _run(["generate", "--model", chat_checkpoint, "--prompts", path, "--per-category", "1",
               "--max-new-tokens", "8", "--k", "3", "--pld-k", "3", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["identical"] and out["settings"]["requests"] == 5
    model = AutoModelForCausalLM.from_pretrained(chat_checkpoint).eval()
    tok = AutoTokenizer.from_pretrained(chat_checkpoint)
    specs = per_category(load_prompts(path), 1)
    for m in ("greedy", "pld", "specfsm"):
        for spec, rec in zip(specs, out["outputs"][m]):
            first = _greedy(model, _template(tok, spec.messages), 8)
            if len(spec.turns) == 1:
                assert rec["output"] == first and "turns" not in rec
                continue
            reply = tok.decode(first, skip_special_tokens=True).strip()
            msgs = [{"role": "user", "content": spec.turns[0]}, {"role": "assistant", "content": reply},
                    {"role": "user", "content": spec.turns[1]}]
            second = _greedy(model, _template(tok, msgs), 8)
            assert rec["turns"] == [first, second] and rec["output"] == first + second
    # both turns counted: 3 single-turn + 2 two-turn questions, 8 tokens a turn
    assert out["methods"]["greedy"]["tokens"] == 7 * 8 and out["methods"]["greedy"]["forwards"] == 7 * 8
    # record: a line per turn, named by it
    rc = _run(["record", "--model", chat_checkpoint, "--prompts", path, "--per-category", "1", "--requests", "2",
               "--max-new-tokens", "4"])
    rec = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert rc == 0 and [r["name"] for r in rec] == ["writing-81 turn 1", "writing-81 turn 2", "coding-83 turn 1",
                                                   "coding-83 turn 2"]
    assert rec[1]["prompt"][: len(rec[0]["prompt"])] == rec[0]["prompt"]  # turn 2 follows turn 1 in the template


def test_compare_prints_spec_bench_s_table_and_json(chat_checkpoint, tmp_path, capsys):
    path = _questions(tmp_path)
    rc = _run(["generate", "--model", chat_checkpoint, "--prompts", path, "--per-category", "2",
               "--max-new-tokens", "6", "--compare", "--pld-ks", "3,5", "--batch", "2", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["identical"]
    assert list(out["by_category"]) == ["writing", "coding", "translation", "qa", "rag"]
    assert list(out["by_group"]) == ["multi-turn", "translation", "qa", "rag"]
    mt = out["by_group"]["multi-turn"]
    for m in out["methods"]:
        assert set(mt[m]) >= {"tokens_per_s", "tokens", "forwards", "identical", "vs_greedy", "tokens_per_forward"}
        assert mt[m]["tokens"] == 4 * 2 * 6  # four questions, two turns, six tokens
    assert mt["greedy"]["forwards"] == 4 * 2 * 6 and mt["greedy"]["tokens_per_forward"] == 1.0
    assert [r["turns"] for r in out["per_prompt"]] == [2] * 4 + [1] * 6
    assert all(b["methods"][m]["identical_to_single_greedy"] for b in out["batches"] for m in b["methods"])
    assert out["batches"][0]["methods"]["greedy_batched"]["tokens"] == 2 * 2 * 6
    rc = _run(["generate", "--model", chat_checkpoint, "--prompts", path, "--per-category", "1",
               "--max-new-tokens", "4", "--compare", "--pld-ks", "3"])
    text = capsys.readouterr().out
    assert rc == 0 and "Spec-Bench: speedup over greedy" in text
    for group in ("multi-turn", "translation", "qa", "rag", "overall", "slowest question"):
        assert group in text
    assert "summarization" not in text and "every output equal" in text


def test_per_category_needs_a_prompts_file(capsys):
    assert _run(["generate", "--per-category", "2"]) == 2
    assert "--per-category needs --prompts" in capsys.readouterr().err
