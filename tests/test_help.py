"""help() where it matters: the public classes show their real constructor signatures
and the same docstring text on both implementations (the class, its properties and its
methods), with no pointer to the other implementation and none of Cython's pickling
helpers; the module-level functions of ``FUNCTIONS`` show their signature and the same
text on both."""

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
    "RecyclingTable": ("recycling", ["vocab_size", "k"]),
    "SuffixTrie": ("suffix_trie", ["depth", "ties"]),
}
#: module-level functions: name -> (kernel module, parameter names)
FUNCTIONS = {
    "extend_tries": ("suffix_trie", ["tries", "seqs", "tokens", "offsets"]),
    "speculate_tries": ("suffix_trie", ["tries", "seqs", "max_k", "others", "factor", "min_prob"]),
}
#: properties whose text says how each implementation holds its data, so differs
OWN_PROPERTY_DOCS = {"SuffixIndex": {"n_states", "nbytes", "tokens"}, "NgramIndex": {"nbytes", "tokens"}}
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


@pytest.mark.parametrize("name", sorted(set(CLASSES) - {"BatchState"}))  # BatchState's: test_batch_safety
def test_both_implementations_document_each_property_and_method_alike(name):
    if _impl.NO_EXTENSIONS:
        pytest.skip("SPECFSM_NO_EXTENSIONS is set: no compiled core to compare the twin with")
    _impl.load(CLASSES[name][0])   # gives the compiled functions the twin's docstrings
    twin, comp = _cls("python", name), _cls("compiled", name)
    members = {k: v for c in reversed(twin.__mro__[:-1]) for k, v in vars(c).items()}
    checked = 0
    for attr, value in members.items():
        if isinstance(value, property):
            if attr not in OWN_PROPERTY_DOCS.get(name, ()):
                assert inspect.getdoc(getattr(comp, attr)) == inspect.getdoc(value), attr
                checked += 1
        elif callable(value) and not attr.startswith("_") and inspect.getdoc(value):
            assert (inspect.getdoc(getattr(comp, attr)) or "").endswith(inspect.getdoc(value)), attr
            checked += 1
    assert checked


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_functions_show_their_signature_and_the_same_text(name):
    module, params = FUNCTIONS[name]
    _impl.load(module)   # gives the compiled functions the twin's docstrings
    docs, sigs = [], []
    for kind in KINDS:
        fn = getattr(_impl.kernels(kind, module), name)
        sig = inspect.signature(fn)
        assert list(sig.parameters) == params
        sigs.append([(p.name, p.kind, p.default) for p in sig.parameters.values()])
        text = pydoc.render_doc(fn, renderer=pydoc.plaintext)
        assert f"{name}(" in text and all(p in text for p in params), text[:400]
        doc = inspect.getdoc(fn) or ""
        assert len(doc.splitlines()) > 1, doc   # more than the signature line
        docs.append(doc[doc.index("\n\n") + 2:] if doc.startswith(f"{name}(") else doc)
    assert all(d == docs[0] for d in docs) and all(s == sigs[0] for s in sigs)
