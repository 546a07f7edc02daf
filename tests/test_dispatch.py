"""Which implementation is active: the compiled core by default in a built package, the
twin when SPECFSM_NO_EXTENSIONS is set or on other interpreters, chosen once per kernel
module at import; every public class and function follows that choice, and
``_impl.kernels(kind, name)`` is the one way to ask for one implementation. Checked in
fresh subprocesses, so a silent fallback to the twin cannot hide behind this process's
state."""

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

# What each public face calls, as the child's import bound it: every kernel module's
# active implementation, the kernels the public functions and classes were bound to, and
# whether each public class is (or derives from) the active kernel module's class.
PROBE = (
    "import json, specfsm, specfsm._impl as i, specfsm.machine.state as s, specfsm.accept.rules as a, "
    "specfsm.drafting.lookup as d, specfsm.placement.place as g, specfsm.drafting.suffix_index as si; "
    "print(json.dumps({'use': specfsm.USE_EXTENSIONS, 'error': repr(i.IMPORT_ERROR), "
    "'active': {n: i.load(n).__name__ for n in i.KERNEL_MODULES}, "
    "'bound': {'state.prefix': s._common_prefix.__module__, 'state.settle': s._settle.__module__, "
    "'accept_rule.prefix': a._common_prefix.__module__, 'accept_rule.accept': a._accept.__name__, "
    "'drafting.ngram': d.prompt_lookup.__module__, 'drafting.prefix': d.common_prefix.__module__, "
    "'gpu.place': g._host.__name__, '_impl.prefix': i.common_prefix.__module__, "
    "'_impl.ngram': i.prompt_lookup.__module__, '_impl.settle': i.settle.__module__}, "
    "'classes': {c: issubclass(getattr(specfsm, c), i.load(m).__dict__[c]) for c, m in "
    "[('BatchState', 'batch'), ('NgramIndex', 'ngram_index'), ('SuffixIndex', 'suffix_index'), "
    "('RecyclingTable', 'recycling')]}, "
    "'trie': all(getattr(si, n) is getattr(i.load('suffix_trie'), n) "
    "for n in ('SuffixTrie', 'extend_tries', 'speculate_tries'))}))"
)
# which kernel module each bound name must come from
BOUND = {
    "state.prefix": "prefix", "state.settle": "settle", "accept_rule.prefix": "prefix",
    "accept_rule.accept": "accept", "drafting.ngram": "ngram", "drafting.prefix": "prefix",
    "gpu.place": "place", "_impl.prefix": "prefix", "_impl.ngram": "ngram", "_impl.settle": "settle",
}


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


def probe(code: str = PROBE, **env_changes: str | None) -> dict:
    return json.loads(" ".join(run_probe(code, **env_changes)))


def _expect(found: dict, family) -> None:
    """Every kernel module, every bound kernel and every public class is ``family(name)``'s."""
    assert found["active"] == {n: family(n) for n in specfsm._impl.KERNEL_MODULES}
    assert found["bound"] == {key: family(name) for key, name in BOUND.items()}
    assert found["classes"] == {"BatchState": True, "NgramIndex": True, "SuffixIndex": True, "RecyclingTable": True}
    assert found["trie"] is True  # SuffixTrie and its batches, exported by specfsm.drafting.suffix_index


def test_compiled_core_is_the_default():
    found = probe(SPECFSM_NO_EXTENSIONS=None)
    assert found["use"] is True, f"the compiled core did not load by default: {found['error']}"
    _expect(found, lambda n: f"specfsm._core.{n}")


@pytest.mark.parametrize("value", ["1", "yes", "true"])
def test_environment_variable_selects_the_twin_for_every_kernel_module(value):
    found = probe(SPECFSM_NO_EXTENSIONS=value)
    assert found["use"] is False
    _expect(found, lambda n: specfsm._impl.TWINS[n])


@pytest.mark.parametrize("value", ["", "0", "false"])
def test_false_values_keep_the_compiled_core(value):
    assert probe(SPECFSM_NO_EXTENSIONS=value)["use"] is True


def test_other_interpreters_get_the_twin():
    code = (
        "import sys, types, numpy; "
        "sys.implementation = types.SimpleNamespace(**{**vars(sys.implementation), 'name': 'pypy'}); "
        + PROBE
    )
    found = probe(code, SPECFSM_NO_EXTENSIONS=None)
    assert found["use"] is False
    _expect(found, lambda n: specfsm._impl.TWINS[n])


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
        "import specfsm, specfsm._impl as i\n"
        "st = specfsm.extensions()\n"
        "print(specfsm.USE_EXTENSIONS, any(s.compiled for s in st.values()),\n"
        "      all(s.module == i.TWINS[n] and s.error is None for n, s in st.items()))\n"
    )
    assert run_probe(code, SPECFSM_NO_EXTENSIONS="1") == ["False", "False", "True"]


def test_kernel_modules_are_every_compiled_source():
    """``_impl.TWINS`` is the one list: one entry per ``_core/**/<name>.pyx``, each twin a
    module of the package."""
    from pathlib import Path

    core = Path(PACKAGE_ROOT) / "_core"
    if not core.is_dir():
        pytest.skip("the Cython sources are not next to this package (an installed build)")
    sources = sorted(p.stem for p in core.rglob("*.pyx"))
    assert sorted(specfsm._impl.KERNEL_MODULES) == sources
    for name, twin in specfsm._impl.TWINS.items():
        path = Path(PACKAGE_ROOT, *twin.split(".")).with_suffix(".py")
        assert path.is_file(), f"the twin of {name}, {twin}, is not at {path}"


@pytest.mark.parametrize("blocked", ["accept", "ngram_index", "suffix_index", "settle", "recycling", "suffix_trie"])
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
        f"print(specfsm.USE_EXTENSIONS, st[{blocked!r}].compiled, st[{blocked!r}].module == specfsm._impl.TWINS[{blocked!r}],\n"
        f"      'blocked' in str(st[{blocked!r}].error),\n"
        f"      all(s.compiled for n, s in st.items() if n not in {needs_it!r}),\n"
        f"      all(not st[n].compiled for n in {needs_it!r}),\n"
        f"      len(runtime), {blocked!r} in str(runtime[0].message) if runtime else None)\n"
    )
    proc = run_blocked(f"specfsm._core.{blocked}", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False", "True", "True", "True", "True", "1", "True"]


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


# -- one implementation by name, for tests and benchmarks --------------------------------------
def test_kernels_returns_one_implementation_by_name(impl):
    """``_impl.kernels(kind, name)`` gives that implementation's module whatever the rule
    chose (the twin on a compiled run too); nothing else changes."""
    from specfsm import _impl

    before = dict(vars(_impl))
    for name in _impl.KERNEL_MODULES:
        mod = _impl.kernels(impl.name, name)
        assert mod.__name__ == (f"specfsm._core.{name}" if impl.name == "compiled" else _impl.TWINS[name])
        assert _impl.kernels(impl.name, name) is mod
    assert vars(_impl) == before  # asking for one implementation rebinds nothing
    with pytest.raises(ValueError, match="kind must be 'compiled' or 'python', got 'fast'"):
        _impl.kernels("fast", "prefix")
    with pytest.raises(KeyError, match="'nope' is not a kernel module"):
        _impl.kernels(impl.name, "nope")


def test_the_public_layer_takes_no_implementation_parameter():
    """No public call threads an implementation through: the rule's choice is the only one
    (every public module's names, the drafters, ``BatchState`` and ``SpeculativeGenerator``
    included)."""
    import inspect

    import specfsm.machine.batch
    import specfsm.drafting.lookup
    import specfsm.gpu
    import specfsm.hf
    import specfsm.hf.cost
    import specfsm.hf.generate
    import specfsm.serving.loop
    import specfsm.drafting.ngram_index
    import specfsm.drafting.suffix_index
    import specfsm.vllm
    import specfsm.serving.workload

    names = {"impl", "kernels", "settle", "index_cls", "kind"}
    found = set()
    seen = set()
    for mod in (specfsm, specfsm.gpu, specfsm.drafting.lookup, specfsm.accept.rules, specfsm.machine.state, specfsm.machine.batch,
                specfsm.drafting.ngram_index, specfsm.drafting.suffix_index, specfsm.serving.loop, specfsm.serving.workload, specfsm.vllm,
                specfsm.hf, specfsm.hf.cost, specfsm.hf.generate):
        for public in mod.__all__:
            obj = getattr(mod, public)
            seen.add(public)
            members = [obj] + ([v for k, v in vars(obj).items() if not k.startswith("_") or k == "__init__"]
                               if isinstance(obj, type) else [])
            for fn in members:
                try:
                    params = inspect.signature(fn).parameters
                except (TypeError, ValueError):
                    continue
                found |= {f"{public}({p})" for p in params if p in names}
    assert {"SpeculativeGenerator", "SuffixDrafter", "NgramDrafter", "BatchState", "SuffixIndex"} <= seen
    assert found == set(), "public calls that take an implementation"
    assert not hasattr(specfsm._impl, "using") and not hasattr(specfsm._impl, "current")
