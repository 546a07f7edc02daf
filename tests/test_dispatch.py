"""Which implementation is active: the compiled core by default in a built package, the
twin when SPECFSM_NO_EXTENSIONS is set or on other interpreters. Checked in fresh
subprocesses, so a silent fallback to the twin cannot hide behind this process's state."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

import specfsm

# The subprocesses import the very package this test run imports (installed or built in
# place), from a neutral working directory so a source tree cannot shadow it.
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(specfsm.__file__)))

PROBE = (
    "import specfsm, specfsm._impl as i; "
    "print(specfsm.USE_EXTENSIONS, i.common_prefix.__module__, i.prompt_lookup.__module__, "
    "i.settle.__module__, repr(i.IMPORT_ERROR))"
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
