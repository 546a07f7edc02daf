"""help() where it matters: the public classes show their real constructor signatures
and the same docstring text on both implementations, with no pointer to the other
implementation and none of Cython's pickling helpers."""

from __future__ import annotations

import inspect
import pydoc

import pytest

from impls import over
from specfsm import _impl
from specfsm.machine import batch

CLASSES = {
    "BatchState": ("batch", ["capacity", "k_max", "bonus"]),
    "NgramIndex": ("ngram_index", ["min_n", "max_n", "prefer", "draft_len", "adaptive", "min_draft", "max_draft"]),
    "SuffixIndex": ("suffix_index", ["min_n", "max_n", "prefer", "draft_len", "adaptive", "min_draft",
                                     "max_draft", "anchor_n", "anchor_span", "anchor_misses"]),
}
KINDS = ["python"] + ([] if _impl.NO_EXTENSIONS else ["compiled"])


def _cls(kind, name):
    mod = _impl.kernels(kind, CLASSES[name][0])
    return over(mod) if name == "BatchState" else getattr(mod, name)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", sorted(CLASSES))
def test_help_shows_the_constructor_and_its_parameters(kind, name):
    cls = _cls(kind, name)
    params = list(inspect.signature(cls).parameters)
    assert params == CLASSES[name][1]
    text = pydoc.render_doc(cls, renderer=pydoc.plaintext)
    head = text[: text.index("Methods")] if "Methods" in text else text
    for p in CLASSES[name][1]:
        assert p in head, (p, head[:400])
    for bad in ("see the twin", "see the module's docstring", "__reduce_cython__", "__setstate_cython__",
                "specfsm._guard"):
        assert bad not in text, bad


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_both_implementations_show_the_same_text_and_signature(name):
    if _impl.NO_EXTENSIONS:
        pytest.skip("SPECFSM_NO_EXTENSIONS is set: no compiled core to compare the twin with")
    twin, comp = _cls("python", name), _cls("compiled", name)
    assert inspect.getdoc(twin) == inspect.getdoc(comp)
    def plain(cls):
        return [(p.name, p.kind, p.default) for p in inspect.signature(cls).parameters.values()]

    assert plain(twin) == plain(comp)
