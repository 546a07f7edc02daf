"""``specfsm replay`` end to end, the embedded workload and the JSONL loader."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest

import specfsm
from specfsm import _impl, cli
from specfsm.serving.workload import (
    MAX_LINE_BYTES,
    Vocabulary,
    WorkloadError,
    load_jsonl,
    rename_edit,
    stdlib_workload,
    tokenize,
)

from reference import OverAcceptingRule

# the implementation this process runs on: replay measures it in-process (the twin beside
# the compiled core runs in a child process, out of reach of a test's monkeypatch)
ACTIVE = "python" if _impl.NO_EXTENSIONS else "compiled"

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(specfsm.__file__)))

IDENTITY = "identity: all {n} speculative outputs equal their plain greedy outputs"


def run_cli(*args: str, cwd: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [PACKAGE_ROOT, env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "specfsm", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def write_jsonl(path, lines) -> str:
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
    return str(path)


def edit_traces(n: int = 3):
    """Small recorded requests in the shape of code edits: the output copies the prompt
    with a few tokens changed."""
    out = []
    for r in range(n):
        prompt = [(7 * i + r) % 23 for i in range(60)] + [1, 2, 3, 4, 5] * 4
        output = list(prompt)
        output[10 + r] = 99
        output[41] = 98
        out.append({"prompt": prompt, "output": output, "name": f"edit {r}"})
    return out


# --------------------------------------------------------------------------------------
# the embedded workload
# --------------------------------------------------------------------------------------
def test_tokenize_is_lossless_and_vocabulary_deterministic():
    text = "def f(x):\n    return x+1  # done\n\tü = 'é'\n"
    toks = tokenize(text)
    assert "".join(toks) == text
    assert toks[:6] == ["def", " ", "f", "(", "x", ")"]
    a = Vocabulary(toks)
    b = Vocabulary(reversed(toks))
    assert a.strings == b.strings == sorted(set(toks))
    assert a.decode(a.encode(toks)) == text


def test_rename_edit_takes_the_most_used_names_ties_by_name():
    toks = tokenize("a b a c b a d c e")
    edited, mapping = rename_edit(toks, {"a", "b", "c", "d", "e"}, count=3)
    assert mapping == {"a": "a_v2", "b": "b_v2", "c": "c_v2"}
    assert "".join(edited) == "a_v2 b_v2 a_v2 c_v2 b_v2 a_v2 d c_v2 e"


def test_stdlib_workload_is_deterministic_code_edits():
    a = stdlib_workload(3)
    b = stdlib_workload(3)
    assert len(a) == 3
    assert a.details["files"] == b.details["files"]
    assert [(t.prompt, t.output) for t in a.traces] == [(t.prompt, t.output) for t in b.traces]
    for t in a.traces:
        assert len(t.prompt) == len(t.output) > 500
        assert t.prompt != t.output  # an edit happened
        changed = sum(x != y for x, y in zip(t.prompt, t.output))
        assert 0 < changed < len(t.prompt) // 10
    renames = a.details["renames"]
    assert all(1 <= len(m) <= 3 for m in renames.values())


def test_stdlib_workload_outputs_are_valid_python(tmp_path):
    w = stdlib_workload(2)
    vocab_tokens = []
    for name in w.details["files"]:
        with open(os.path.join(w.details["stdlib"], name), encoding="utf-8") as f:
            vocab_tokens += tokenize(f.read())
    # rebuild the vocabulary the same way and decode the edited sources
    for name, m in w.details["renames"].items():
        vocab_tokens += list(m.values())
    v = Vocabulary(vocab_tokens)
    for t in w.traces:
        assert v.decode(t.output).count("_v2") > 0
        ast.parse(v.decode(t.output))


def test_stdlib_workload_without_sources_says_so(tmp_path):
    with pytest.raises(WorkloadError, match="no standard-library sources found"):
        stdlib_workload(2, root=str(tmp_path))
    with pytest.raises(ValueError, match="requests must be a positive integer"):
        stdlib_workload(0)


# --------------------------------------------------------------------------------------
# the JSONL loader
# --------------------------------------------------------------------------------------
def test_load_jsonl_reads_every_line(tmp_path):
    lines = edit_traces(3)
    path = write_jsonl(tmp_path / "w.jsonl", [lines[0], "", "   ", lines[1], {**lines[2], "output": lines[2]["output"] + [77], "eos": 77, "extra": 1}])
    w = load_jsonl(path)
    assert len(w) == 3
    assert [t.name for t in w.traces] == ["edit 0", "edit 1", "edit 2"]
    assert w.traces[2].eos == 77 and w.traces[0].eos is None
    assert w.traces[1].prompt == lines[1]["prompt"]


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"output": [1]}, "missing field 'prompt'"),
        ({"prompt": [1]}, "missing field 'output'"),
        ({}, "missing field 'prompt' and 'output'"),
        ({"prompt": [1, 2.5], "output": [1]}, r"prompt\[1\] is not an integer token id: 2.5"),
        ({"prompt": [1], "output": ["7"]}, r'output\[0\] is not an integer token id: "7"'),
        ({"prompt": [1], "output": [True]}, r"output\[0\] is not an integer token id: true"),
        ({"prompt": [1], "output": [-3]}, r"output\[0\] = -3 is outside the token id range"),
        ({"prompt": [1], "output": [2**64]}, "outside the token id range"),
        ({"prompt": [1], "output": []}, "'output' is empty"),
        ({"prompt": [], "output": [1]}, "'prompt' is empty"),
        ({"prompt": 5, "output": [1]}, "'prompt' must be a list of token ids, got int"),
        ({"prompt": [1], "output": [2, 0, 3], "eos": 0}, r"'eos' 0 occurs at output\[1\] before the end"),
        ({"prompt": [1], "output": [2], "eos": 2**63}, r"'eos' = 9223372036854775808 is outside the token id range"),
        ({"prompt": [1], "output": [2], "eos": 10**20}, r"'eos' = 100000000000000000000 is outside the token id range"),
        ([1, 2], "expected a JSON object, got list"),
        ("{not json", "not valid JSON"),
    ],
)
def test_bad_lines_are_named(tmp_path, bad, message):
    good = edit_traces(2)
    path = write_jsonl(tmp_path / "w.jsonl", [good[0], bad, good[1]])
    with pytest.raises(WorkloadError, match=message) as info:
        load_jsonl(path)
    assert f"{path}:2:" in str(info.value)
    assert "nothing was replayed" in str(info.value)


def test_every_bad_line_is_reported_and_nothing_is_dropped(tmp_path):
    good = edit_traces(1)[0]
    lines = [good, {"prompt": [1]}, good, {"prompt": [1], "output": []}, good, "[", good]
    path = write_jsonl(tmp_path / "w.jsonl", lines)
    with pytest.raises(WorkloadError) as info:
        load_jsonl(path)
    text = str(info.value)
    assert "has 3 bad lines" in text
    for n in (2, 4, 6):
        assert f"{path}:{n}:" in text
    for n in (1, 3, 5, 7):
        assert f"{path}:{n}:" not in text
    many = [{"prompt": [1]}] * 30
    path = write_jsonl(tmp_path / "many.jsonl", many)
    with pytest.raises(WorkloadError, match="and 10 more bad lines"):
        load_jsonl(path)


def test_unreadable_and_empty_files(tmp_path):
    with pytest.raises(WorkloadError, match="cannot read workload"):
        load_jsonl(tmp_path / "missing.jsonl")
    path = write_jsonl(tmp_path / "blank.jsonl", ["", " "])
    with pytest.raises(WorkloadError, match="holds no requests"):
        load_jsonl(path)
    (tmp_path / "bin.jsonl").write_bytes(b'{"prompt": [1], "output": [2]}\n\xff\xfe\n')
    with pytest.raises(WorkloadError, match="not UTF-8"):
        load_jsonl(tmp_path / "bin.jsonl")


# --------------------------------------------------------------------------------------
# replay, in process
# --------------------------------------------------------------------------------------
def test_replay_summary_fields_on_a_small_file(tmp_path, capsys):
    path = write_jsonl(tmp_path / "w.jsonl", edit_traces(3))
    assert cli.main(["replay", "--workload", path, "--json", "--k", "4", "--batch", "2"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["requests"] == 3 and s["identical"] is True
    assert s["output_tokens"] == 3 * 80
    assert s["evaluations_greedy"] == 3 * 80
    assert s["evaluations_speculative"] < s["evaluations_greedy"]
    assert s["evaluation_ratio"] == pytest.approx(s["evaluations_greedy"] / s["evaluations_speculative"])
    assert len(s["acceptance_by_position"]) == 4
    assert s["settings"] == {"drafter": "suffix", "ngram": [1, None], "k": 4, "rule": "exact", "batch": 2, "repeat": 3, "bonus": False}
    assert s["runs"] == ({"compiled": 3, "python": 3} if specfsm.USE_EXTENSIONS else {"python": 3})
    assert s["control_us_per_token"]["python"] > 0
    assert [r["name"] for r in s["per_request"]] == ["edit 0", "edit 1", "edit 2"]
    assert all(r["identical"] for r in s["per_request"])


@pytest.mark.skipif(not specfsm.USE_EXTENSIONS, reason="compares the compiled core with the twin; on the twin run it would compare the twin with itself")
@pytest.mark.parametrize("drafter", ["prompt", "ngram"])
def test_replay_compiled_and_twin_take_the_same_decisions(tmp_path, capsys, drafter):
    path = write_jsonl(tmp_path / "w.jsonl", edit_traces(3))
    assert cli.main(["replay", "--workload", path, "--json", "--drafter", drafter, "--repeat", "1"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["runs"] == {"compiled": 1, "python": 1}
    assert s["implementations_agree"] is True and s["identical"] is True
    assert s["control_us_per_token"]["compiled"] > 0 and s["control_us_per_token"]["python"] > 0


def test_replay_never_reports_a_partial_build_as_compiled(tmp_path, capsys, monkeypatch):
    """With one kernel module on the twin, ``--impl compiled`` is refused (exit 2, naming
    the module and its import error) and ``--impl both`` measures the twin alone."""
    real = _impl.extensions()
    broken = ImportError("simulated: undefined symbol in accept")
    fake = {
        name: (st._replace(compiled=False, module=_impl.TWINS[name], error=broken) if name == "accept"
               else st._replace(compiled=True, module=f"specfsm._core.{name}", error=None))
        for name, st in real.items()
    }
    monkeypatch.setattr(_impl, "NO_EXTENSIONS", False)
    monkeypatch.setattr(_impl, "extensions", lambda: fake)
    kinds, skipped = cli.available_kinds()
    assert kinds == ["python"]
    assert "only partly built" in skipped["compiled"] and "specfsm._core.accept" in skipped["compiled"]
    path = write_jsonl(tmp_path / "w.jsonl", edit_traces(1))
    assert cli.main(["replay", "--workload", path, "--impl", "compiled"]) == 2
    err = capsys.readouterr().err
    assert "--impl compiled" in err and "simulated: undefined symbol in accept" in err
    assert cli.main(["replay", "--workload", path, "--json", "--repeat", "1"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["runs"] == {"python": 1} and s["control_us_per_token"]["compiled"] is None
    # nothing compiled at all: "not built"
    monkeypatch.setattr(_impl, "extensions", lambda: {n: st._replace(compiled=False, error=broken) for n, st in fake.items()})
    assert cli.available_kinds() == (["python"], {"compiled": "not built"})


def test_replay_table_and_rules(tmp_path, capsys):
    path = write_jsonl(tmp_path / "w.jsonl", edit_traces(3))
    assert cli.main(["replay", "--workload", path, "--rule", "minrun:3", "--requests", "2"]) == 0
    out = capsys.readouterr().out
    assert IDENTITY.format(n=2) in out
    for label in (
        "target evaluations, plain greedy",
        "target evaluations, speculative",
        "mean accepted length",
        "acceptance by draft position",
        "control plane, python twin",
    ):
        assert label in out
    assert "rule minrun:3" in out and "first 2 replayed" in out


@pytest.mark.parametrize("rule, text", [("exact", "exact"), ("minrun:2", "minrun:2"), ("speculative:5", "speculative:5"), ("speculative", "speculative:0"), ("typical", "typical")])
@pytest.mark.parametrize("drafter", ["prompt", "ngram"])
def test_replay_runs_every_rule_end_to_end(tmp_path, capsys, rule, text, drafter):
    """Every acceptance rule replays the recording exactly: the teacher-forced target's rows
    are one-hot at the recorded token, so sampling accepts a drafted token only where the
    recording has it and resamples the recorded token where it does not."""
    path = write_jsonl(tmp_path / "w.jsonl", edit_traces(2))
    assert cli.main(["replay", "--workload", path, "--json", "--drafter", drafter, "--rule", rule, "--repeat", "1"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["identical"] is True and s["settings"]["rule"] == text
    assert s["evaluations_speculative"] < s["evaluations_greedy"]


@pytest.mark.parametrize("drafter", ["ngram", "suffix"])
def test_replay_bonus_row_saves_evaluations(tmp_path, capsys, drafter):
    path = write_jsonl(tmp_path / "w.jsonl", edit_traces(3))
    args = ["replay", "--workload", path, "--json", "--drafter", drafter, "--repeat", "1"]
    assert cli.main(args) == 0
    plain = json.loads(capsys.readouterr().out)
    assert cli.main(args + ["--bonus"]) == 0
    bonus = json.loads(capsys.readouterr().out)
    assert bonus["identical"] is True and bonus["settings"]["bonus"] is True
    assert bonus["evaluations_speculative"] < plain["evaluations_speculative"]
    assert cli.main(["replay", "--workload", path, "--bonus", "--drafter", "prompt"]) == 2
    assert "--bonus runs on the batch API" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["speculative:x", "speculative:-1", "typical:3", "sampling"])
def test_replay_refuses_bad_rules(tmp_path, capsys, bad):
    path = write_jsonl(tmp_path / "w.jsonl", edit_traces(1))
    with pytest.raises(SystemExit) as exc:
        cli.main(["replay", "--workload", path, "--rule", bad])
    assert exc.value.code == 2
    assert "--rule" in capsys.readouterr().err


def test_replay_usage_errors(tmp_path, capsys):
    path = write_jsonl(tmp_path / "w.jsonl", edit_traces(1))
    assert cli.main(["replay", "--workload", path, "--drafter", "prompt", "--ngram", "1:3"]) == 2
    assert "--drafter prompt takes one n-gram length" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["replay", "--rule", "minrun:0"])
    with pytest.raises(SystemExit):
        cli.main(["replay", "--k", "0"])
    assert cli.main([]) == 2


def test_plot_needs_matplotlib(tmp_path, capsys):
    path = write_jsonl(tmp_path / "w.jsonl", edit_traces(1))
    png = tmp_path / "acc.png"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert cli.main(["replay", "--workload", path, "--plot", str(png)]) == 2
        assert "--plot needs matplotlib" in capsys.readouterr().err
        assert not png.exists()
    else:
        assert cli.main(["replay", "--workload", path, "--plot", str(png)]) == 0
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_progress_bar_goes_to_stderr_only(tmp_path, capsys):
    path = write_jsonl(tmp_path / "w.jsonl", edit_traces(2))
    assert cli.main(["replay", "--workload", path, "--progress", "--json"]) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)  # stdout stays machine-readable
    assert "[" in captured.err and "/" in captured.err


def test_a_target_that_breaks_identity_exits_1(tmp_path, capsys, monkeypatch):
    """The identity line can fail: an acceptance rule that keeps one row too many makes
    the speculative output differ, and replay says so with exit status 1."""

    monkeypatch.setattr(cli.orchestrate, "make_rule", lambda spec: OverAcceptingRule())
    path = write_jsonl(tmp_path / "w.jsonl", edit_traces(1))
    assert cli.main(["replay", "--workload", path, "--impl", ACTIVE, "--drafter", "prompt"]) == 1
    err = capsys.readouterr().err
    assert "IDENTITY FAILED" in err and "past a rejected draft token" in err
    assert cli.main(["replay", "--workload", path, "--impl", ACTIVE]) == 1  # the default drafter
    assert "IDENTITY FAILED" in capsys.readouterr().err


# --------------------------------------------------------------------------------------
# replay, end to end in a subprocess
# --------------------------------------------------------------------------------------
def test_replay_end_to_end_embedded_workload(tmp_path):
    proc = run_cli("replay", "--requests", "2", "--json", cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout)
    for key in (
        "requests",
        "prompt_tokens",
        "output_tokens",
        "evaluations_greedy",
        "evaluations_speculative",
        "mean_accepted_length",
        "acceptance_by_position",
        "control_us_per_token",
        "identical",
    ):
        assert key in s
    assert s["requests"] == 2 and s["identical"] is True
    assert s["workload"]["source"].startswith("embedded")
    assert len(s["workload"]["files"]) == 2
    assert 0 < s["evaluations_speculative"] < s["evaluations_greedy"] == s["output_tokens"]
    assert set(s["control_us_per_token"]) == {"compiled", "python"}
    # the subprocess inherits this run's SPECFSM_NO_EXTENSIONS
    if _impl.NO_EXTENSIONS:
        assert s["control_us_per_token"]["compiled"] is None and "compiled" in s["skipped"]
    else:
        assert s["control_us_per_token"]["compiled"] > 0 and s["skipped"] == {}


def test_replay_end_to_end_table_and_bad_file(tmp_path):
    path = write_jsonl(tmp_path / "w.jsonl", edit_traces(3))
    proc = run_cli("replay", "--workload", path, "--requests", "2", cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert IDENTITY.format(n=2) in proc.stdout
    assert proc.stderr == ""  # no progress bar when stderr is not a terminal

    bad = write_jsonl(tmp_path / "bad.jsonl", [edit_traces(1)[0], {"prompt": [1, 2], "output": [3, "x"]}])
    proc = run_cli("replay", "--workload", bad, cwd=str(tmp_path))
    assert proc.returncode == 2
    assert f"{bad}:2: output[1] is not an integer token id" in proc.stderr
    assert proc.stdout == ""


def test_ngram_drafter_replay(tmp_path, capsys):
    path = write_jsonl(tmp_path / "w.jsonl", edit_traces(3))
    assert cli.main(["replay", "--workload", path, "--drafter", "ngram", "--json"]) == 0
    ngram = json.loads(capsys.readouterr().out)
    assert ngram["identical"] is True and ngram["settings"]["ngram"] == [2, 4]
    # one n-gram length with prefer="latest" drafts exactly what prompt lookup drafts
    assert cli.main(["replay", "--workload", path, "--drafter", "ngram", "--ngram", "3", "--json"]) == 0
    a = json.loads(capsys.readouterr().out)
    assert cli.main(["replay", "--workload", path, "--drafter", "prompt", "--ngram", "3", "--json"]) == 0
    b = json.loads(capsys.readouterr().out)
    for key in ("evaluations_speculative", "accepted_by_position", "drafted_by_position", "rollbacks"):
        assert a[key] == b[key]


# --------------------------------------------------------------------------------------
# unreadable workloads: a message with file:line and exit status 2, never a traceback
# --------------------------------------------------------------------------------------
GOOD = json.dumps({"prompt": [1, 2, 3], "output": [4, 5]})


@pytest.mark.parametrize(
    "bad, message",
    [
        ("[" * 200_000, "nested too deeply"),
        ('{"prompt": [' + "[" * 200_000, "nested too deeply"),
        ('{"prompt": [' + "7" * 5000 + '], "output": [1]}', "not readable JSON (Exceeds the limit"),
        ('{"prompt": [1], "output": [1], "eos": ' + "9" * 10_000 + "}", "not readable JSON"),
        ('{"prompt": [1e999], "output": [1]}', "prompt[0] is not an integer token id: Infinity"),
        ('{"prompt": [NaN], "output": [1]}', "prompt[0] is not an integer token id: NaN"),
        ('{"prompt": [' + "9" * 4000 + '], "output": [1]}', "is outside the token id range"),
    ],
    ids=["deep-array", "deep-in-field", "long-int", "long-int-eos", "infinity", "nan", "huge-id"],
)
def test_unreadable_lines_are_named_with_their_line_number(tmp_path, capsys, bad, message):
    path = write_jsonl(tmp_path / "w.jsonl", [GOOD, bad, GOOD])
    with pytest.raises(WorkloadError) as err:
        load_jsonl(path)
    assert f"{path}:2: " in str(err.value) and message in str(err.value)
    assert ":1:" not in str(err.value) and ":3:" not in str(err.value)
    assert len(str(err.value)) < 1000  # the bad value is quoted short, not echoed whole
    assert cli.main(["replay", "--workload", path, "--impl", ACTIVE]) == 2
    captured = capsys.readouterr()
    assert f"{path}:2: " in captured.err and captured.out == ""


def test_lines_over_the_limit_are_refused_without_reading_them_whole(tmp_path):
    limit = 1000
    long = '{"prompt": [' + ", ".join(["1"] * 400) + '], "output": [1]}'
    assert len(long) > limit
    exact = '{"prompt": [1], "output": [1], "name": "' + "x" * (limit - 42) + '"}'
    assert len(exact) == limit
    path = write_jsonl(tmp_path / "w.jsonl", [GOOD, long, exact, "x" * (5 * limit), GOOD])
    with pytest.raises(WorkloadError) as err:
        load_jsonl(path, max_line_bytes=limit)
    text = str(err.value)
    assert f"{path}:2: line longer than {limit} bytes" in text
    assert f"{path}:4: line longer than {limit} bytes" in text
    assert ":3:" not in text and ":5:" not in text and "has 2 bad lines" in text
    # the same file reads under a higher limit, except for the line that is not JSON
    with pytest.raises(WorkloadError, match=r":4: not valid JSON") as err:
        load_jsonl(path, max_line_bytes=10 * limit)
    assert "has 1 bad line " in str(err.value)
    # a last line with no newline that is one byte over the limit
    p2 = tmp_path / "nonl.jsonl"
    p2.write_text(GOOD + "\n" + exact + " ")
    with pytest.raises(WorkloadError, match=r"nonl.jsonl:2: line longer than 1000 bytes"):
        load_jsonl(p2, max_line_bytes=limit)
    p2.write_text(GOOD + "\n" + exact)
    assert len(load_jsonl(p2, max_line_bytes=limit)) == 2


def test_an_unbounded_line_is_read_in_bounded_chunks(tmp_path, monkeypatch):
    """No read asks for more than the limit plus one byte (or the skip chunk), so a line
    of any length is never held in memory whole."""
    import io

    from specfsm.serving import workload as wl

    sizes = []
    real_open = open

    class Spy(io.BufferedReader):
        def readline(self, size=-1):
            sizes.append(size)
            return super().readline(size)

    def spy_open(file, mode="r", *args, **kwargs):
        if mode == "rb":
            return Spy(io.FileIO(file, "r"))
        return real_open(file, mode, *args, **kwargs)

    path = tmp_path / "w.jsonl"
    with open(path, "w") as f:
        f.write(GOOD + "\n")
        f.write("1" * (3 << 20) + "\n")
        f.write(GOOD + "\n")
    monkeypatch.setattr(wl, "open", spy_open, raising=False)
    with pytest.raises(WorkloadError, match=r":2: line longer than 4096 bytes"):
        load_jsonl(path, max_line_bytes=4096)
    assert sizes and all(0 < s <= (1 << 20) for s in sizes)


def test_bad_utf8_is_named_and_the_rest_is_still_checked(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_bytes(GOOD.encode() + b"\n" + b'{"name": "\xff"}\n' + b'{"prompt": [], "output": [1]}\n')
    with pytest.raises(WorkloadError) as err:
        load_jsonl(path)
    assert f"{path}:2: not UTF-8 text" in str(err.value)
    assert f"{path}:3: 'prompt' is empty" in str(err.value)


def test_the_line_limit_is_documented():
    assert MAX_LINE_BYTES == 64 << 20
    assert "64 MiB" in load_jsonl.__doc__ and "max_line_bytes" in load_jsonl.__doc__
    assert "64 MiB per line" in " ".join(cli._parser()._subparsers._group_actions[0].choices["replay"].format_help().split())
    with pytest.raises(ValueError, match="max_line_bytes"):
        load_jsonl("x", max_line_bytes=0)


def test_unreadable_workloads_end_to_end_exit_2_without_a_traceback(tmp_path):
    deep = write_jsonl(tmp_path / "deep.jsonl", [GOOD, "[" * 100_000])
    digits = write_jsonl(tmp_path / "digits.jsonl", ['{"prompt": [' + "1" * 5000 + '], "output": [1]}'])
    for path, line in ((deep, 2), (digits, 1)):
        proc = run_cli("replay", "--workload", path, "--impl", ACTIVE, cwd=str(tmp_path))
        assert proc.returncode == 2, proc.stderr
        assert f"{path}:{line}: " in proc.stderr and "Traceback" not in proc.stderr
        assert proc.stdout == ""


@pytest.mark.parametrize("drafter", ["suffix", "suffix-shared", "ngram", "prompt", "arctic"])
def test_replay_every_drafter_keeps_identity(tmp_path, capsys, drafter):
    if drafter == "arctic":
        from specfsm.drafting.suffix_index import arctic_available

        if not arctic_available():
            assert cli.main(["replay", "--drafter", "arctic", "--requests", "1"]) == 2
            assert "arctic-inference" in capsys.readouterr().err
            pytest.skip("arctic-inference is not installed: only its refusal is checked")
    path = write_jsonl(tmp_path / "w.jsonl", edit_traces(3))
    assert cli.main(["replay", "--workload", path, "--json", "--drafter", drafter, "--repeat", "1"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["identical"] is True and s["settings"]["drafter"] == drafter
    assert s["evaluations_speculative"] < s["evaluations_greedy"]


def test_suffix_drafter_takes_a_minimum_and_ngram_needs_a_bound(tmp_path, capsys):
    path = write_jsonl(tmp_path / "w.jsonl", edit_traces(2))
    assert cli.main(["replay", "--workload", path, "--json", "--ngram", "4", "--repeat", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["settings"]["ngram"] == [4, 4]
    assert cli.main(["replay", "--workload", path, "--repeat", "1"]) == 0
    assert "drafter suffix index (n-gram 1..)" in capsys.readouterr().out


def test_the_shipped_smollm2_workload_replays_by_name(capsys):
    """The recorded SmolLM2 outputs ship as package data and replay by name, exactly."""
    assert cli.main(["replay", "--workload", "smollm2", "--json", "--repeat", "1", "--impl", ACTIVE]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["identical"] is True and s["requests"] >= 1
    assert s["evaluations_speculative"] < s["evaluations_greedy"]
    assert "smollm2_edits.jsonl" in s["workload"]["source"]


# --------------------------------------------------------------------------------------
# large ids: an eos beyond int64, and the sampling rules on ids far past any vocabulary
# --------------------------------------------------------------------------------------
def test_an_eos_beyond_int64_is_a_named_bad_line_exit_2(tmp_path):
    """It was an OverflowError traceback from deep in the replay (exit 1)."""
    good = edit_traces(1)[0]
    path = write_jsonl(tmp_path / "w.jsonl", [good, {"prompt": [1, 2], "output": [3, 4], "eos": 2**64 + 3}])
    proc = run_cli("replay", "--workload", path, "--repeat", "1", cwd=str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert f"{path}:2: 'eos' = 18446744073709551619 is outside the token id range 0..2**63-1" in proc.stderr
    assert "Traceback" not in proc.stderr


def _big_id_traces():
    big = 2**63 - 1
    out = []
    for r in range(3):
        prompt = [big - (7 * i + r) % 23 for i in range(60)] + [big - 1, 3, big, 2**40] * 4
        output = list(prompt)
        output[10 + r] = 2**62 + r
        out.append({"prompt": prompt, "output": output + [2**50 + 7], "name": f"big {r}", "eos": 2**50 + 7})
    return out


@pytest.mark.parametrize("rule", ["speculative:3", "typical", "exact"])
def test_sampling_rules_replay_ids_far_past_any_vocabulary(tmp_path, capsys, rule):
    """Ids up to 2**63 - 1: the probability rows are sized by the ids present (it tried
    to allocate a dense row of 2**63 + 1 floats)."""
    path = write_jsonl(tmp_path / "big.jsonl", _big_id_traces())
    assert cli.main(["replay", "--workload", path, "--json", "--rule", rule, "--repeat", "1"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["identical"] is True and s["requests"] == 3
    assert s["evaluations_speculative"] < s["evaluations_greedy"]


@pytest.mark.parametrize("rule", [("speculative", 5), ("typical", 0)])
@pytest.mark.parametrize("drafter", ["suffix", "ngram", "suffix-shared", "prompt"])
def test_compact_ids_keep_the_summary_identical(rule, drafter):
    """The sampling rules replay on ids remapped to 0..V-1: on a normal workload the
    summary (all but the timings) is the one the original ids give."""
    from specfsm.cli import orchestrate

    w = load_jsonl(orchestrate.SHIPPED_WORKLOADS["smollm2"])
    w.traces = w.traces[:4]

    def run():
        s = orchestrate.replay(w, drafter=drafter, rule=rule, repeat=1, kinds=["python"])
        s.pop("control_us_per_token")
        for r in s["per_request"]:
            r.pop("control_us_per_token")
        return s

    remapped = run()
    real = orchestrate.compact_ids
    orchestrate.compact_ids = lambda workload: workload
    try:
        original = run()
    finally:
        orchestrate.compact_ids = real
    assert remapped == original
    c = real(w)
    ids = sorted({x for t in w.traces for x in (*t.prompt, *t.output)})
    assert max(x for t in c.traces for x in t.output) < len(ids)
    assert [ids[x] for x in c.traces[0].output] == w.traces[0].output


def test_the_teacher_forced_target_refuses_a_dense_vocabulary_past_its_limit():
    from specfsm.serving.workload import TeacherForcedTarget

    t = TeacherForcedTarget([1, 2**40], [5, 6])
    assert t.evaluate([1, 2**40], None) == ([2**40, 5], [1, 2])  # the exact rules need no rows
    with pytest.raises(ValueError, match=r"largest id is 1099511627776.*MAX_VOCAB=4194304"):
        t.evaluate_probs([1, 2**40], None)
    rows, probs, _ = TeacherForcedTarget([1, 2], [5, 6]).evaluate_probs([1, 2], None)
    assert probs.shape == (2, 8)  # the largest id + 2


def test_the_twin_beside_the_compiled_core_runs_in_a_child_process(tmp_path, capsys, monkeypatch):
    """With the compiled core active, ``--impl both`` measures the twin in a child process
    started with ``SPECFSM_NO_EXTENSIONS=1`` (an implementation is chosen once per
    process), and both runs take the same decisions."""
    if _impl.NO_EXTENSIONS:
        pytest.skip("SPECFSM_NO_EXTENSIONS is set: the twin is this process's implementation")
    from specfsm.cli import twin

    envs = []
    real = twin.subprocess.run

    def spy(*args, **kwargs):
        envs.append(kwargs["env"])
        return real(*args, **kwargs)

    monkeypatch.setattr(twin.subprocess, "run", spy)
    path = write_jsonl(tmp_path / "w.jsonl", edit_traces(2))
    assert cli.main(["replay", "--workload", path, "--repeat", "1", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert [e.get("SPECFSM_NO_EXTENSIONS") for e in envs] == ["1"]
    assert set(s["runs"]) == {"compiled", "python"} and s["implementations_agree"] is True
