"""``specfsm`` command line behaviour: ``--version``, the ``--plot`` path checks and
errors, "n/a" for statistics with no data, ``--requests`` beyond the workload, the
progress bar's redraws, singular and plural, kernels picked per run without rebinding
module globals, and every numeric option's range checked when the options are parsed."""

from __future__ import annotations

import io
import json
import sys
import types

import pytest

import specfsm
from specfsm import _impl, cli
from specfsm.cli import orchestrate, summary as summary_mod
from specfsm.cli.progress import Progress

from test_replay import edit_traces, write_jsonl

# the implementation this process runs on: replay measures it in-process (the twin beside
# the compiled core runs in a child process, out of reach of a test's monkeypatch)
ACTIVE = "python" if _impl.NO_EXTENSIONS else "compiled"

FAST = ["--impl", ACTIVE, "--repeat", "1"]


def _workload(tmp_path, n=1):
    return write_jsonl(tmp_path / "w.jsonl", edit_traces(n))


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"specfsm {specfsm.__version__}"


@pytest.fixture
def spy_replay(monkeypatch):
    """Records whether the replay ran."""
    calls = []
    real = orchestrate.replay

    def spy(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(cli, "replay", spy)
    return calls


@pytest.fixture
def fake_matplotlib(monkeypatch):
    """A matplotlib that imports but cannot draw (the real one is optional)."""
    monkeypatch.setitem(sys.modules, "matplotlib", types.ModuleType("matplotlib"))


@pytest.mark.parametrize("case", ["directory", "missing parent", "not png"])
def test_plot_path_is_checked_before_the_replay(tmp_path, capsys, spy_replay, fake_matplotlib, case):
    path = _workload(tmp_path)
    target = {
        "directory": tmp_path,
        "missing parent": tmp_path / "nowhere" / "acc.png",
        "not png": tmp_path / "acc.jpg",
    }[case]
    assert cli.main(["replay", "--workload", path, "--plot", str(target), *FAST]) == 2
    err = capsys.readouterr().err
    assert f"--plot {target}" in err and "Traceback" not in err
    assert not spy_replay  # refused before any replay work
    assert not (tmp_path.parent / (tmp_path.name + ".png")).exists()  # no <dir>.png
    assert not (tmp_path / "acc.jpg").exists()


def test_plot_without_matplotlib_is_refused_before_the_replay(tmp_path, capsys, spy_replay, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    path = _workload(tmp_path)
    assert cli.main(["replay", "--workload", path, "--plot", str(tmp_path / "a.png"), *FAST]) == 2
    assert "--plot needs matplotlib" in capsys.readouterr().err
    assert not spy_replay


def test_a_plotting_error_keeps_the_printed_results(tmp_path, capsys, fake_matplotlib):
    """The fake matplotlib passes the check and fails in the drawing: the table is printed
    anyway, then the plot error, with exit status 2."""
    path = _workload(tmp_path, 2)
    png = tmp_path / "acc.png"
    assert cli.main(["replay", "--workload", path, "--plot", str(png), *FAST]) == 2
    out, err = capsys.readouterr()
    assert "identity: all 2 speculative outputs" in out
    assert f"--plot {png}: the plot was not written" in err and "Traceback" not in err
    assert "written to" not in out
    assert cli.main(["replay", "--workload", path, "--plot", str(png), "--json", *FAST]) == 2
    assert json.loads(capsys.readouterr().out)["identical"] is True


def _no_drafts_summary(tmp_path, capsys, *extra):
    """--k 1 with a drafter that never drafts: no verify rounds, so no acceptance."""
    path = write_jsonl(tmp_path / "w.jsonl", [{"prompt": [1, 2, 3], "output": [4, 5, 6]}])
    assert cli.main(["replay", "--workload", path, "--drafter", "prompt", "--ngram", "3", *FAST, *extra]) == 0
    return capsys.readouterr().out


def test_statistics_without_data_are_null_in_json(tmp_path, capsys):
    s = json.loads(_no_drafts_summary(tmp_path, capsys, "--json"))
    assert s["verifies"] == 0
    assert s["mean_accepted_length"] is None and s["mean_draft_length"] is None
    assert s["per_request"][0]["mean_accepted_length"] is None


def test_statistics_without_data_read_n_a(tmp_path, capsys):
    out = _no_drafts_summary(tmp_path, capsys)
    line = next(x for x in out.splitlines() if "mean accepted length" in x)
    assert "n/a" in line and "0.00" not in line


def test_acceptance_of_an_undrafted_position_reads_n_a():
    s = {
        "workload": {"source": "w"},
        "settings": {"drafter": "ngram", "ngram": [2, 4], "k": 2, "rule": "exact", "batch": 1},
        "requests": 1, "prompt_tokens": 1, "output_tokens": 1, "evaluations_greedy": 1,
        "evaluations_speculative": 0, "evaluation_ratio": None, "tokens_per_evaluation": None,
        "verifies": 1, "rollbacks": 0, "mean_accepted_length": 1.0, "mean_draft_length": 1.0,
        "acceptance_by_position": [1.0, None], "control_us_per_token": {"python": 1.0},
        "skipped": {}, "runs": {"python": 1}, "identical": True, "mismatches": {},
    }
    text = summary_mod.format_summary(s)
    assert "1: 100%  2: n/a" in text
    assert "n/a; n/a tokens per evaluation" in text


def test_requests_beyond_the_workload_say_so(tmp_path, capsys):
    path = _workload(tmp_path, 2)
    assert cli.main(["replay", "--workload", path, "--requests", "5", *FAST]) == 0
    out, err = capsys.readouterr()
    note = "--requests 5: the workload holds 2 requests"
    assert note in err and note in out
    assert cli.main(["replay", "--workload", path, "--requests", "5", "--json", *FAST]) == 0
    assert any(note in n for n in json.loads(capsys.readouterr().out)["notes"])
    assert cli.main(["replay", "--workload", path, "--requests", "2", *FAST]) == 0
    assert "note" not in capsys.readouterr().err


def test_progress_bar_leaves_no_residue_of_a_longer_label():
    stream = io.StringIO()
    bar = Progress(4, stream, True)
    bar.phase("a very long label that runs past the old padding")
    bar.phase("short")
    bar.close()
    frames = stream.getvalue().split("\r")
    long_frame = next(f for f in frames if "very long" in f)
    short_frame = next(f for f in frames if "short" in f)
    assert len(short_frame) >= len(long_frame)  # padded over the longer line
    assert short_frame.rstrip().endswith("short")
    assert frames[-2].strip() == "" and len(frames[-2]) >= len(long_frame)  # close clears it


def test_one_request_is_singular(tmp_path, capsys):
    path = _workload(tmp_path, 1)
    assert cli.main(["replay", "--workload", path, "--batch", "1", *FAST]) == 0
    out = capsys.readouterr().out
    assert "batches of 1 request\n" in out
    assert "identity: the speculative output equals its plain greedy output" in out
    assert "1 requests" not in out and "all 1 " not in out


def test_plural_forms():
    assert summary_mod.plural(1, "request") == "1 request"
    assert summary_mod.plural(2, "request") == "2 requests"
    assert summary_mod.plural(1200, "request") == "1,200 requests"


def test_replay_leaves_the_kernel_globals_alone(tmp_path, capsys, monkeypatch):
    """Each run names its implementation: replay never rebinds ``specfsm._impl``'s
    kernels (a rebinding would be seen by this spy's assignment)."""
    seen = []
    real_setattr = type(_impl).__setattr__

    class Watch(types.ModuleType):
        def __setattr__(self, name, value):
            seen.append(name)
            real_setattr(self, name, value)

    monkeypatch.setattr(_impl, "__class__", Watch)
    path = _workload(tmp_path, 2)
    assert cli.main(["replay", "--workload", path, "--repeat", "1", "--drafter", "prompt"]) == 0
    assert cli.main(["replay", "--workload", path, "--repeat", "1", "--drafter", "ngram"]) == 0
    assert not [n for n in seen if n in ("common_prefix", "prompt_lookup", "settle")]
    assert not hasattr(cli, "routed")


# -- each sub-command's own usage, --methods before the model, counts ---------------
@pytest.mark.parametrize("command", ["replay", "generate", "record"])
def test_an_unknown_option_prints_the_sub_command_s_usage(capsys, command):
    """It printed the top level's usage (``usage: specfsm [-h] [--version] COMMAND``)."""
    with pytest.raises(SystemExit) as e:
        cli.main([command, "--frobnicate"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: specfsm {command} ")
    assert f"specfsm {command}: error: unrecognized arguments: --frobnicate" in err
    with pytest.raises(SystemExit):
        cli.main(["--frobnicate", command])  # an option of the top level's: its usage
    assert capsys.readouterr().err.startswith("usage: specfsm [-h]")


def test_generate_refuses_an_unknown_method_before_the_model_loads(capsys, monkeypatch):
    from specfsm.hf import loading

    def no_load(*a, **kw):  # pragma: no cover - the point is that it is never called
        raise AssertionError("the model was loaded before --methods was checked")

    monkeypatch.setattr(loading, "load_model", no_load)
    with pytest.raises(SystemExit) as e:
        cli.main(["generate", "--methods", "greedy,bogus"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "usage: specfsm generate" in err
    assert "unknown method 'bogus'" in err and "choose from greedy, pld, specfsm" in err
    with pytest.raises(SystemExit):
        cli.main(["generate", "--methods", ","])
    assert "name at least one of greedy, pld, specfsm" in capsys.readouterr().err
    from specfsm.hf import cli as hf_cli

    assert hf_cli.parse_methods("specfsm, greedy,specfsm") == ["specfsm", "greedy"]


def test_generate_summary_counts_agree_with_their_nouns():
    from specfsm.hf import cli as hf_cli

    s = {
        "model": {"name": "tiny"}, "threads": 1, "prompt_tokens": [1],
        "settings": {"max_new_tokens": 1, "batch": 1, "k": 3, "drafter": "suffix", "pld_k": 10, "requests": 1},
        "methods": {m: {"tokens_per_s": 1.0, "speedup_vs_greedy": 1.0, "forwards": 1, "tokens_per_forward": 1.0,
                        "outside_us_per_token": 1.0} for m in ("greedy", "specfsm")},
        "identity": {"specfsm": {"identical": True, "mismatches": []}},
    }
    text = hf_cli.format_generate(s)
    assert "1 request (1 prompt token), up to 1 new token, batch 1, 1 torch thread" in text
    assert "identity: the specfsm (suffix, k 3) output equals plain greedy's" in text
    assert "1 requests" not in text and "all 1 " not in text and "1 tokens" not in text
    s["settings"].update(requests=2, max_new_tokens=256)
    s["prompt_tokens"], s["threads"] = [3, 4], 2
    text = hf_cli.format_generate(s)
    assert "2 requests (7 prompt tokens), up to 256 new tokens, batch 1, 2 torch threads" in text
    assert "identity: all 2 specfsm (suffix, k 3) outputs equal plain greedy's" in text


def test_embedded_requests_beyond_this_python_s_modules_say_how_many_there_are(tmp_path, capsys, monkeypatch):
    """The embedded workload holds one request per usable standard-library module (74 on
    CPython 3.11): ``--requests`` picks that many evenly spaced, and beyond it says so."""
    from specfsm.serving import workload as wl

    for i in range(3):  # three usable "modules"
        (tmp_path / f"mod{i}.py").write_text(("def f%d():\n    return f%d()\n" % (i, i)) * 300)
    monkeypatch.setattr(cli, "stdlib_workload", lambda n=None: wl.stdlib_workload(n, root=str(tmp_path)))
    assert cli.main(["replay", "--requests", "5", *FAST]) == 0
    out, err = capsys.readouterr()
    note = ("--requests 5: the embedded workload holds 3 requests on this Python (one per usable "
            "standard-library module); replaying all of them")
    assert note in err and note in out
    assert cli.main(["replay", "--requests", "2", *FAST]) == 0
    assert "note" not in capsys.readouterr().err
    assert wl.DEFAULT_REQUESTS == 24


def test_help_states_the_request_counts_and_the_empty_prompt_rule(capsys):
    with pytest.raises(SystemExit):
        cli.main(["replay", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "default 24; 74 modules on CPython 3.11" in text
    assert "the CLI refuses it as bad input" in text
    with pytest.raises(SystemExit):
        cli.main(["generate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "default 4; 67 modules on CPython 3.11" in text
    assert "the state machine itself accepts an empty prompt" in text


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the counts the help states are CPython 3.11's")
def test_the_stated_counts_are_this_python_s():
    from specfsm.hf.prompts import edit_prompts
    from specfsm.serving.workload import stdlib_workload

    assert len(stdlib_workload()) == 24
    assert len(stdlib_workload(1000)) == 74
    assert len(edit_prompts(1000)) == 67


# -- every numeric option is range-checked when the options are parsed -------------------
# A value outside an option's range (the limit of the code the value reaches: the batch's
# k_max, its capacity, a suffix index's length, ...) is a usage error, exit status 2, on one
# line after the sub-command's usage naming the option and the range, before any work:
# before the replay starts and before the model loads.
from specfsm._cli_args import (  # noqa: E402
    COUNT_MAX,
    MAX_BATCH,
    MAX_K,
    MAX_MATCH,
    MAX_NEW_TOKENS,
    MAX_SEED,
    MAX_THREADS,
    MAX_TREE_K,
    int_range,
)
from specfsm.cli.options import build_parser  # noqa: E402

HUGE = "1" + "0" * 23

#: (command, option) -> (lowest, highest) accepted
RANGES = {
    ("replay", "--k"): (1, MAX_K),
    ("replay", "--requests"): (1, COUNT_MAX),
    ("replay", "--batch"): (1, MAX_BATCH),
    ("replay", "--repeat"): (1, COUNT_MAX),
    ("generate", "--k"): (0, MAX_K),
    ("generate", "--batch"): (1, MAX_BATCH),
    ("generate", "--pld-k"): (1, MAX_K),
    ("generate", "--threads"): (1, MAX_THREADS),
    ("generate", "--batch-rounds"): (1, COUNT_MAX),
    ("generate", "--requests"): (1, COUNT_MAX),
    ("generate", "--per-category"): (1, COUNT_MAX),
    ("generate", "--max-new-tokens"): (1, MAX_NEW_TOKENS),
    ("record", "--threads"): (1, MAX_THREADS),
    ("record", "--requests"): (1, COUNT_MAX),
    ("record", "--per-category"): (1, COUNT_MAX),
    ("record", "--max-new-tokens"): (1, MAX_NEW_TOKENS),
}
#: options whose value holds numbers inside a larger form: how to write one number there
FORMS = {
    ("replay", "--ngram"): ("{}", "2:{}", (1, MAX_MATCH)),
    ("replay", "--rule"): ("minrun:{}", None, (1, MAX_K)),
    ("generate", "--pld-ks"): ("{}", "10,{}", (1, MAX_K)),
}
#: options that take no number
NOT_NUMERIC = {("generate", "--methods"), ("generate", "--compare-drafters")}


@pytest.fixture
def no_model(monkeypatch):
    """A model loader that must not be reached, and a replay that must not start."""
    from specfsm.hf import loading

    def refuse(*a, **kw):
        raise AssertionError("the model was loaded before the options were checked")

    def no_replay(*a, **kw):
        raise AssertionError("the replay started before the options were checked")

    monkeypatch.setattr(loading, "load_model", refuse)
    monkeypatch.setattr(cli, "replay", no_replay)


def _usage_error(capsys, argv, option):
    """Run ``argv`` through ``cli.main``; assert a usage error naming ``option`` on one line
    (after the sub-command's usage) and return that line."""
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2, argv
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert lines[0].startswith(f"usage: specfsm {argv[0]} ")
    assert all(line.startswith(" ") for line in lines[1:-1]), err  # the usage's own lines
    assert lines[-1].startswith(f"specfsm {argv[0]}: error: argument {option}: "), err
    return lines[-1]


def _numeric_options():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.choices and "replay" in a.choices)
    for command, p in sub.choices.items():
        for action in p._actions:
            if action.type is not None:
                yield command, action.option_strings[-1]


def test_every_numeric_option_has_a_stated_range():
    found = set(_numeric_options()) - NOT_NUMERIC
    assert found == set(RANGES) | set(FORMS)


@pytest.mark.parametrize("command, option", sorted(RANGES))
@pytest.mark.parametrize("value", ["high", "low", HUGE, "-1", "", "1e3", "1.5", "abc", " ", "0x10", "9" * 5000])
def test_a_numeric_option_out_of_range_is_a_usage_error(capsys, no_model, command, option, value):
    lo, hi = RANGES[(command, option)]
    value = {"high": str(hi + 1), "low": str(lo - 1)}.get(value, value)
    line = _usage_error(capsys, [command, f"{option}={value}"], option)
    assert f"between {lo} and {hi}, got " in line
    assert len(line) < 300  # a long value is shortened, not repeated whole


@pytest.mark.parametrize("command, option", sorted(FORMS))
@pytest.mark.parametrize("which", ["high", "low", "huge"])
def test_a_number_inside_an_option_out_of_range_is_a_usage_error(capsys, no_model, command, option, which):
    alone, after, (lo, hi) = FORMS[(command, option)]
    n = {"high": hi + 1, "low": lo - 1, "huge": int(HUGE)}[which]
    for form in filter(None, (alone, after)):
        line = _usage_error(capsys, [command, f"{option}={form.format(n)}"], option)
        assert f"between {lo} and {hi}, got " in line


@pytest.mark.parametrize("drafter", ["suffix", "suffix-tree", "suffix-shared", "ngram", "prompt"])
def test_replay_k_beyond_the_batch_is_a_usage_error_for_every_drafter(capsys, no_model, drafter):
    line = _usage_error(capsys, ["replay", "--drafter", drafter, "--k", str(MAX_K + 1)], "--k")
    assert line.endswith(f"must be between 1 and {MAX_K}, got '{MAX_K + 1}'")


@pytest.mark.parametrize("argv, option", [
    (["generate", "--k", "5000"], "--k"),
    (["generate", "--max-new-tokens", "100000000000000000000000"], "--max-new-tokens"),
    (["generate", "--threads", "100000000000000000000"], "--threads"),
    (["record", "--threads", "100000000000000000000"], "--threads"),
])
def test_generate_refuses_a_bad_number_before_the_model_loads(capsys, no_model, argv, option):
    _usage_error(capsys, argv, option)


@pytest.mark.parametrize("extra", [["--drafter", "suffix-tree"], ["--compare", "--compare-drafters", "suffix,suffix-tree"]])
def test_generate_k_past_the_largest_tree_is_a_usage_error_before_the_model_loads(capsys, no_model, extra):
    assert cli.main(["generate", "--k", str(MAX_TREE_K + 1), *extra]) == 2
    err = capsys.readouterr().err
    assert err == (f"specfsm generate: --k must be between 0 and {MAX_TREE_K} with the suffix-tree "
                   f"drafter (its largest tree), got {MAX_TREE_K + 1}\n")


def test_generate_k_past_the_largest_tree_is_fine_without_trees(capsys, monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from specfsm.hf import loading

    def stub(*a, **kw):
        raise loading.ModelNotFound("stub loader: reached")

    monkeypatch.setattr(loading, "load_model", stub)
    for argv in (["--k", str(MAX_TREE_K + 1)], ["--k", str(MAX_TREE_K), "--drafter", "suffix-tree"],
                 ["--k", str(MAX_TREE_K + 1), "--compare-drafters", "suffix-tree"]):  # ignored without --compare
        assert cli.main(["generate", "--requests", "1", *argv]) == 2
        assert capsys.readouterr().err.strip().endswith("stub loader: reached")


def test_replay_ngram_beyond_the_index_s_lengths_is_a_usage_error(tmp_path, capsys, spy_replay):
    assert cli.main(["replay", "--workload", _workload(tmp_path), "--drafter", "ngram", "--ngram", "1:5000", *FAST]) == 2
    err = capsys.readouterr().err
    assert err == "specfsm replay: --ngram 1:5000: an NgramIndex keeps at most 4096 n-gram lengths, got min_n=1, max_n=5000\n"
    assert not spy_replay


@pytest.mark.parametrize("drafter", ["suffix", "suffix-tree", "ngram"])
def test_replay_runs_at_the_largest_k(tmp_path, capsys, drafter):
    assert cli.main(["replay", "--workload", _workload(tmp_path), "--drafter", drafter, "--k", str(MAX_K), *FAST]) == 0


def test_the_largest_values_parse():
    p = build_parser()
    a = p.parse_args(["replay", "--k", str(MAX_K), "--batch", str(MAX_BATCH), "--requests", str(COUNT_MAX),
                      "--repeat", str(COUNT_MAX), "--ngram", f"1:{MAX_MATCH}", "--rule", f"minrun:{MAX_K}"])
    assert (a.k, a.batch, a.requests, a.repeat, a.ngram, a.rule) == (
        MAX_K, MAX_BATCH, COUNT_MAX, COUNT_MAX, (1, MAX_MATCH), ("minrun", MAX_K))
    assert p.parse_args(["replay", "--rule", f"speculative:{MAX_SEED}"]).rule == ("speculative", MAX_SEED)
    g = p.parse_args(["generate", "--k", "0", "--batch", str(MAX_BATCH), "--pld-k", str(MAX_K), "--threads",
                      str(MAX_THREADS), "--max-new-tokens", str(MAX_NEW_TOKENS), "--pld-ks", f"1,{MAX_K}"])
    assert (g.k, g.batch, g.pld_k, g.threads, g.max_new_tokens, g.pld_ks) == (
        0, MAX_BATCH, MAX_K, MAX_THREADS, MAX_NEW_TOKENS, [1, MAX_K])
    assert p.parse_args(["generate", "--k", "adaptive"]).k == "adaptive"


def test_the_bounds_are_the_code_s_limits():
    from specfsm.drafting._checks import MAX_SUFFIX_TOKENS
    from specfsm.drafting._tree_checks import MAX_TREE_NODES
    from specfsm.machine._checks import MAX_DRAFT, MAX_SLOTS

    assert (MAX_K, MAX_BATCH, MAX_NEW_TOKENS, MAX_TREE_K, MAX_MATCH) == (
        MAX_DRAFT, MAX_SLOTS, MAX_SUFFIX_TOKENS, MAX_TREE_NODES, MAX_SUFFIX_TOKENS)
    from specfsm import BatchState

    BatchState(1, MAX_K)  # the largest --k a batch takes
    with pytest.raises(ValueError, match="k_max"):
        BatchState(1, MAX_K + 1)


def test_int_range():
    import argparse

    t = int_range(2, 5)
    assert [t("2"), t("5"), t(" 3 ")] == [2, 5, 3]
    for bad, msg in [("1", "must be between 2 and 5, got '1'"), ("6", "must be between 2 and 5, got '6'"),
                     ("2.0", "must be an integer between 2 and 5, got '2.0'"),
                     ("", "must be an integer between 2 and 5, got ''")]:
        with pytest.raises(argparse.ArgumentTypeError) as e:
            t(bad)
        assert str(e.value) == msg
    with pytest.raises(argparse.ArgumentTypeError) as e:
        t("7" * 100)
    assert str(e.value) == f"must be between 2 and 5, got '{'7' * 40}' ... (100 characters)"
    with pytest.raises(ValueError, match="lo <= hi"):
        int_range(3, 2)


@pytest.mark.parametrize("argv", [["replay", "--drafter", "suffix-tree", "--k", "4097"],
                                  ["generate", "--k", "5000"]])
def test_the_installed_command_reports_a_bad_number_in_one_line(tmp_path, argv):
    import subprocess

    if argv[0] == "generate":  # refused for --k, before the missing model is looked for
        argv = [*argv, "--model", str(tmp_path / "no-model")]
    r = subprocess.run([sys.executable, "-m", "specfsm", *argv], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and not r.stdout
    assert "Traceback" not in r.stderr
    assert r.stderr.splitlines()[-1].startswith(f"specfsm {argv[0]}: error: argument --k: ")
    assert [line for line in r.stderr.splitlines() if "error" in line] == r.stderr.splitlines()[-1:]
