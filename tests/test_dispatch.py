"""Which implementation is active: the compiled core by default in a built package, the
twin when SPECFSM_NO_EXTENSIONS is set or on other interpreters. Checked in fresh
subprocesses, so a silent fallback to the twin cannot hide behind this process's state."""

from __future__ import annotations

import os
import subprocess
import sys
import json
import tempfile

import pytest

import specfsm

# The subprocesses import the very package this test run imports (installed or built in
# place), from a neutral working directory so a source tree cannot shadow it.
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(specfsm.__file__)))

PROBE = (
    "import specfsm, specfsm._impl as i; "
    "print(specfsm.USE_EXTENSIONS, i.ACTIVE.common_prefix.__module__, i.ACTIVE.prompt_lookup.__module__, "
    "i.ACTIVE.settle.__module__, repr(i.IMPORT_ERROR))"
)


def run_probe(code: str, **env_changes: str | None) -> list[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [PACKAGE_ROOT, env.get("PYTHONPATH")]))
    for key, value in env_changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=tempfile.gettempdir(),
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()


def test_compiled_core_is_the_default():
    active, prefix_mod, ngram_mod, settle_mod, error = run_probe(PROBE, SPECFSM_NO_EXTENSIONS=None)
    assert active == "True", f"the compiled core did not load by default: {error}"
    assert (prefix_mod, ngram_mod, settle_mod) == (
        "specfsm._core.prefix",
        "specfsm._core.ngram",
        "specfsm._core.settle",
    )


@pytest.mark.parametrize("value", ["1", "yes", "true"])
def test_environment_variable_selects_the_twin(value):
    active, prefix_mod, ngram_mod, settle_mod, _ = run_probe(PROBE, SPECFSM_NO_EXTENSIONS=value)
    assert active == "False"
    assert (prefix_mod, ngram_mod, settle_mod) == (
        "specfsm._py.prefix",
        "specfsm._py.ngram",
        "specfsm._py.settle",
    )


@pytest.mark.parametrize("value", ["", "0", "false"])
def test_false_values_keep_the_compiled_core(value):
    assert run_probe(PROBE, SPECFSM_NO_EXTENSIONS=value)[0] == "True"


def test_other_interpreters_get_the_twin():
    code = (
        "import sys, types, numpy; "
        "sys.implementation = types.SimpleNamespace(**{**vars(sys.implementation), 'name': 'pypy'}); "
        + PROBE
    )
    assert run_probe(code, SPECFSM_NO_EXTENSIONS=None)[0] == "False"


def test_public_names():
    for name in specfsm.__all__:
        assert getattr(specfsm, name) is not None
    assert isinstance(specfsm.USE_EXTENSIONS, bool)


# A meta-path finder that makes one compiled kernel module fail to import, as a broken or
# partial build would; the rest of the core imports normally.
BLOCK = (
    "import sys\n"
    "class _Block:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name == {name!r}:\n"
    "            raise ImportError('blocked by the test: ' + name)\n"
    "        return None\n"
    "sys.meta_path.insert(0, _Block())\n"
)


def run_blocked(module: str, code: str, **env_changes: str | None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [PACKAGE_ROOT, env.get("PYTHONPATH")]))
    env.pop("SPECFSM_NO_EXTENSIONS", None)
    env.update({k: v for k, v in env_changes.items() if v is not None})
    return subprocess.run(
        [sys.executable, "-c", BLOCK.format(name=module) + code],
        env=env,
        cwd=tempfile.gettempdir(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_extensions_lists_every_kernel_module_compiled_by_default():
    code = (
        "import specfsm, specfsm._impl as i\n"
        "st = specfsm.extensions()\n"
        "print(sorted(st) == sorted(i.KERNEL_MODULES), all(s.compiled for s in st.values()),\n"
        "      all(s.module == 'specfsm._core.' + n and s.error is None for n, s in st.items()))\n"
    )
    out = run_probe(code, SPECFSM_NO_EXTENSIONS=None)
    assert out == ["True", "True", "True"]


def test_extensions_with_the_twin_switched_on():
    code = (
        "import specfsm\n"
        "st = specfsm.extensions()\n"
        "print(specfsm.USE_EXTENSIONS, any(s.compiled for s in st.values()),\n"
        "      all(s.module == 'specfsm._py.' + n and s.error is None for n, s in st.items()))\n"
    )
    assert run_probe(code, SPECFSM_NO_EXTENSIONS="1") == ["False", "False", "True"]


def test_kernel_modules_are_every_compiled_source():
    core = os.path.join(PACKAGE_ROOT, "_core")
    if not os.path.isdir(core):
        pytest.skip("the Cython sources are not next to this package (an installed build)")
    sources = sorted(n[:-4] for _, _, names in os.walk(core) for n in names if n.endswith(".pyx"))
    assert sorted(specfsm._impl.KERNEL_MODULES) == sources


@pytest.mark.parametrize("blocked", ["accept", "ngram_index", "suffix_index", "settle"])
def test_one_module_failing_to_import_is_a_partial_fallback(blocked):
    """One compiled module that does not import: USE_EXTENSIONS is False, extensions()
    names it with its import error, the others stay compiled, and one RuntimeWarning says
    so (once, even when the package is imported again). A compiled module that needs the
    blocked one (the batch state calls the compiled indexes' C entry) falls back with it."""
    needs_it = [blocked] + (["batch"] if blocked in ("ngram_index", "suffix_index") else [])
    code = (
        "import warnings, importlib\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    import specfsm\n"
        "    importlib.reload(specfsm)\n"
        "st = specfsm.extensions()\n"
        "runtime = [x for x in w if issubclass(x.category, RuntimeWarning)]\n"
        f"print(specfsm.USE_EXTENSIONS, st[{blocked!r}].compiled, st[{blocked!r}].module,\n"
        f"      'blocked' in str(st[{blocked!r}].error),\n"
        f"      all(s.compiled for n, s in st.items() if n not in {needs_it!r}),\n"
        f"      all(not st[n].compiled for n in {needs_it!r}),\n"
        f"      len(runtime), {blocked!r} in str(runtime[0].message) if runtime else None)\n"
    )
    proc = run_blocked(f"specfsm._core.{blocked}", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False", f"specfsm._py.{blocked}", "True", "True", "True", "1", "True"]


def test_replay_refuses_to_report_a_partial_build_as_compiled():
    cli = "import sys; from specfsm import cli; sys.exit(cli.main(sys.argv[1:]))"
    args = ["replay", "--requests", "1", "--repeat", "1", "--json"]
    proc = subprocess.run(
        [sys.executable, "-W", "ignore::RuntimeWarning", "-c", BLOCK.format(name="specfsm._core.accept") + cli,
         *args, "--impl", "compiled"],
        env={**os.environ, "PYTHONPATH": PACKAGE_ROOT, "SPECFSM_NO_EXTENSIONS": ""},
        cwd=tempfile.gettempdir(), capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert "--impl compiled" in proc.stderr and "only partly built" in proc.stderr
    assert "specfsm._core.accept does not import" in proc.stderr and proc.stdout == ""
    proc = subprocess.run(
        [sys.executable, "-W", "ignore::RuntimeWarning", "-c", BLOCK.format(name="specfsm._core.accept") + cli, *args],
        env={**os.environ, "PYTHONPATH": PACKAGE_ROOT, "SPECFSM_NO_EXTENSIONS": ""},
        cwd=tempfile.gettempdir(), capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout)
    assert s["control_us_per_token"]["compiled"] is None and s["runs"] == {"python": 1}
    assert "only partly built" in s["skipped"]["compiled"]


# -- a source checkout that was never built ---------------------------------------------------
def _never_built_copy(tmp_path, with_sources: bool = True):
    """A copy of the checkout's package (and, with ``with_sources``, its ``_core`` .pyx
    sources) without any compiled module: what a fresh clone looks like."""
    import shutil

    if not os.path.isdir(os.path.join(PACKAGE_ROOT, "_core")):
        pytest.skip("the Cython sources are not next to this package (an installed build)")
    ignore = shutil.ignore_patterns("*.so", "*.pyd", "__pycache__")
    shutil.copytree(os.path.join(PACKAGE_ROOT, "specfsm"), tmp_path / "specfsm", ignore=ignore)
    if with_sources:
        shutil.copytree(os.path.join(PACKAGE_ROOT, "_core"), tmp_path / "_core", ignore=ignore)
    return tmp_path


def _run_in(root, args, **env_changes):
    env = {k: v for k, v in os.environ.items() if k not in ("SPECFSM_NO_EXTENSIONS", "PYTHONPATH")}
    env.update(env_changes)
    return subprocess.run([sys.executable, *args], cwd=str(root), env=env, capture_output=True,
                          text=True, timeout=300)


IMPORT_PROBE = (
    "import warnings\n"
    "with warnings.catch_warnings(record=True) as w:\n"
    "    warnings.simplefilter('always')\n"
    "    import specfsm, specfsm._impl as i\n"
    "print(specfsm.USE_EXTENSIONS, i.NEVER_BUILT, len(w), [str(x.message) for x in w])\n"
)


def test_a_never_built_checkout_warns_once_on_import(tmp_path):
    root = _never_built_copy(tmp_path)
    proc = _run_in(root, ["-c", IMPORT_PROBE])
    assert proc.returncode == 0, proc.stderr
    active, never_built, count, messages = proc.stdout.split(" ", 3)
    assert (active, never_built, count) == ("False", "True", "1")
    assert "never built" in messages and "build_ext --inplace" in messages
    assert "SPECFSM_NO_EXTENSIONS=1" in messages
    # asked for on purpose: no warning
    proc = _run_in(root, ["-c", IMPORT_PROBE], SPECFSM_NO_EXTENSIONS="1")
    assert proc.stdout.split(" ", 3)[:3] == ["False", "False", "0"], proc.stderr
    # a pure-Python install (no sources beside it) is not a checkout: no warning either
    bare = _never_built_copy(tmp_path / "bare", with_sources=False)
    proc = _run_in(bare, ["-c", IMPORT_PROBE])
    assert proc.stdout.split(" ", 3)[:3] == ["False", "False", "0"], proc.stderr


def test_pytest_in_a_never_built_checkout_says_what_to_do(tmp_path):
    import shutil

    root = _never_built_copy(tmp_path)
    (root / "tests").mkdir()
    shutil.copy(os.path.join(os.path.dirname(__file__), "conftest.py"), root / "tests")
    (root / "tests" / "test_probe.py").write_text(
        "def test_kernels(impl):\n    assert impl.module('prefix').common_prefix([1, 2], [1, 3]) == 1\n"
    )
    proc = _run_in(root, ["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 4, out
    assert "never built in this checkout" in out and "build_ext --inplace" in out
    assert "SPECFSM_NO_EXTENSIONS=1 python -m pytest" in out
    assert "failed" not in out and "passed" not in out
    proc = _run_in(root, ["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], SPECFSM_NO_EXTENSIONS="1")
    assert proc.returncode == 0 and "1 passed, 1 skipped" in proc.stdout, proc.stdout + proc.stderr


# -- picking an implementation without rebinding anything ------------------------------------
def test_using_picks_the_kernels_of_one_context_only(impl):
    """``_impl.using(kind)`` changes what the public layer (and ``_impl.common_prefix`` and
    friends) call inside the block, in this thread only; nothing is rebound."""
    import threading

    from specfsm import _impl
    from specfsm.state import ServingState

    impl.module("prefix")  # fails clearly when the compiled core is asked for and not built
    before = dict(vars(_impl))
    seen = {}

    def record(tag):
        seen[tag] = _impl.current().kind

    with _impl.using(impl.name) as chosen:
        assert chosen.kind == impl.name and _impl.current() is chosen
        assert chosen.common_prefix is impl.module("prefix").common_prefix
        record("inside")
        worker = threading.Thread(target=record, args=("other thread",))
        worker.start()
        worker.join()
        v = ServingState.start([1], 0).advance_prefill(2, 1).enter_verify([3, 4])
        assert v.accept([3, 9], ["a", "b"]).to == 9
        with _impl.using("python"):
            record("nested")
        record("after nested")
    record("outside")
    assert seen == {
        "inside": impl.name, "other thread": _impl.ACTIVE.kind, "nested": "python",
        "after nested": impl.name, "outside": _impl.ACTIVE.kind,
    }
    assert dict(vars(_impl)).keys() == before.keys()
    assert all(vars(_impl)[k] is v for k, v in before.items() if k != "_BY_KIND")


def test_using_routes_every_kernel_family(monkeypatch):
    """Inside ``using("python")`` the state machine, the rules and the drafting functions
    reach the twin's kernels (a spy on the twin's modules sees each call)."""
    import specfsm
    from specfsm import _impl
    from specfsm.accept_rule import Exact

    calls = []
    twin = _impl.implementation("python")
    for attr in ("common_prefix", "prompt_lookup", "settle"):
        real = getattr(twin, attr)
        monkeypatch.setattr(twin, attr, lambda *a, _real=real, _n=attr: calls.append(_n) or _real(*a))
    with _impl.using("python"):
        specfsm.prompt_lookup([1, 2, 1], 1, 1)
        Exact().accepted_rows([1, 2], [1, 3])
        v = specfsm.ServingState.start([1], 0).advance_prefill(2, 1).enter_verify([3])
        v.accept([3], ["c"])
        _impl.common_prefix([1], [1])
    assert calls == ["prompt_lookup", "common_prefix", "common_prefix", "settle", "common_prefix"]
    calls.clear()
    specfsm.prompt_lookup([1, 2, 1], 1, 1)
    assert calls == []  # outside the block: the active kernels, not the spied twin object
