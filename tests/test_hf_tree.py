"""Tree verification on the ragged batch cache (``specfsm.hf.tree``), on tiny random
models: every node's logits from one tree forward equal the logits of its root-to-node
path run as a plain sequence, and after ``keep_paths`` the next decode equals decoding
the kept path as a chain; both attention implementations that take a custom 4-D mask,
batches with holes and a batch of one; refusals."""

from __future__ import annotations

import inspect
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from specfsm.hf.evaluate import RaggedBatch, UnsupportedModel, prefill  # noqa: E402
from specfsm.hf.tree import check_tree_attention, feed_tree, keep_paths, tree_ancestors, tree_depths  # noqa: E402
from hf_helpers import one_thread  # noqa: E402, F401 (a module-wide fixture)
from hf_helpers import reference as _reference  # noqa: E402
from hf_helpers import tiny_llama  # noqa: E402

VOCAB = 61


def _llama(impl):
    return tiny_llama(VOCAB, impl)


def _gpt2(impl):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=256, n_embd=32, n_layer=2, n_head=2,
                     bos_token_id=None, eos_token_id=None, attn_implementation=impl)
    return GPT2LMHeadModel(cfg).eval()


@pytest.fixture(scope="module", params=[("llama", "eager"), ("llama", "sdpa"), ("gpt2", "sdpa")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def model(request):
    name, impl = request.param
    m = (_llama if name == "llama" else _gpt2)(impl)
    assert check_tree_attention(m) == impl
    return m


def _forward(model):
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def forward(ids, pos, mask, cache, keep=None):
        kw = {name: cache} if keep is None else {name: cache, "logits_to_keep": keep}
        with torch.inference_mode():
            return model(input_ids=ids, position_ids=pos, attention_mask=mask, use_cache=True, **kw).logits
    return forward


def _plain(model, seq):
    """The logits after the last token of ``seq``, one forward with no cache."""
    with torch.inference_mode():
        return model(input_ids=torch.tensor([seq])).logits[0, -1]


def _tree(rnd, n):
    parents = [-1] + [rnd.randrange(-1, i) for i in range(1, n)]
    tokens = []
    for i, p in enumerate(parents):
        used = {tokens[j] for j in range(i) if parents[j] == p}
        tokens.append(rnd.choice([t for t in range(VOCAB) if t not in used]))
    return np.array(tokens, dtype=np.int64), np.array(parents, dtype=np.int64)


def _path(parents, node):
    out = []
    while node >= 0:
        out.append(node)
        node = int(parents[node])
    return out[::-1]


def _batch(model, prompts):
    forward = _forward(model)
    cache, mask, _ = prefill(model, forward, [np.array(p, dtype=np.int64) for p in prompts], each=True)
    return RaggedBatch(cache, mask, list(range(len(prompts))), forward)


@pytest.mark.parametrize("seed, sizes", [(1, (7, 1, 12)), (2, (5,)), (3, (16, 9))])
def test_every_node_sees_its_path_and_the_kept_path_decodes_as_a_chain(model, seed, sizes):
    rnd = random.Random(seed)
    prompts = [[rnd.randrange(VOCAB) for _ in range(rnd.randrange(3, 20))] for _ in sizes]
    roots = [rnd.randrange(VOCAB) for _ in sizes]
    trees = [_tree(rnd, n) for n in sizes]
    rb = _batch(model, prompts)
    logits = feed_tree(rb, roots, trees, [len(p) for p in prompts], torch.float32)
    for j, (tok, par) in enumerate(trees):
        base = prompts[j] + [roots[j]]
        torch.testing.assert_close(logits[j, 0], _plain(model, base), atol=1e-4, rtol=1e-4)
        for i in range(len(tok)):
            seq = base + [int(tok[a]) for a in _path(par, i)]
            torch.testing.assert_close(logits[j, i + 1], _plain(model, seq), atol=1e-4, rtol=1e-4,
                                       msg=f"request {j} node {i}")
    # keep a random root-to-node path (or none) per request, then decode one token each
    paths = [_path(par, rnd.randrange(-1, len(tok))) if rnd.random() < 0.8 else [] for tok, par in trees]
    keep_paths(rb, paths)
    kept = [prompts[j] + [roots[j]] + [int(trees[j][0][a]) for a in paths[j]] for j in range(len(trees))]
    nxt = [rnd.randrange(VOCAB) for _ in trees]
    out = rb.feed([[x] for x in nxt], [len(k) for k in kept])
    for j in range(len(trees)):
        torch.testing.assert_close(out[j, 0], _plain(model, kept[j] + [nxt[j]]), atol=1e-4, rtol=1e-4)
    if len(trees) == 1:  # a batch of one keeps no holes
        assert rb.width == len(kept[0]) + 1 and bool(rb.buf[0, :rb.width].all())


def test_the_depths_and_ancestors_of_a_tree():
    parents = [-1, 0, 0, -1, 2]
    assert tree_depths(parents).tolist() == [0, 1, 2, 2, 1, 3]
    anc = tree_ancestors(parents)
    assert anc[5].tolist() == [True, True, False, True, False, True]  # node 4 <- node 2 <- node 0 <- root
    assert anc[4].tolist() == [True, False, False, False, True, False]
    assert tree_depths([]).tolist() == [0] and tree_ancestors(np.array([], dtype=np.int64)).tolist() == [[True]]


@pytest.mark.parametrize("parents, why", [([0], r"parents\[0\] = 0"), ([-1, 1], r"parents\[1\] = 1"),
                                          ([-1, -2], r"parents\[1\] = -2"), ([[-1]], "1-D"),
                                          ([-1.0], "integer")])
def test_a_malformed_tree_is_refused(parents, why):
    with pytest.raises(ValueError, match=why):
        tree_depths(np.array(parents))


def test_attention_that_ignores_a_custom_mask_is_refused():
    m = _llama("eager")
    m.config._attn_implementation = "flash_attention_2"
    with pytest.raises(UnsupportedModel, match="'flash_attention_2'.*sdpa"):
        check_tree_attention(m)


def test_a_path_that_is_not_one_is_refused(model):
    rb = _batch(model, [[1, 2, 3], [4, 5]])
    feed_tree(rb, [6, 7], [(np.array([8, 9]), np.array([-1, 0])), (np.array([3]), np.array([-1]))], [3, 2],
              torch.float32)
    with pytest.raises(ValueError, match="ascending path"):
        keep_paths(rb, [[1, 0], []])
    with pytest.raises(ValueError, match="2 paths for a batch of 2|ascending"):
        keep_paths(rb, [[0], [5]])
    with pytest.raises(ValueError, match="1 paths for a batch of 2"):
        keep_paths(rb, [[0]])


# -- decoding with trees through the one loop (SpeculativeGenerator(drafter="suffix-tree"))
def _repetitive(seed, lengths):
    rnd = random.Random(seed)
    out = []
    for length in lengths:
        base = [rnd.randrange(VOCAB) for _ in range(rnd.randrange(3, 8))]
        alt = list(base)
        alt[rnd.randrange(len(alt))] = rnd.randrange(VOCAB)  # a variant: two continuations of one context
        out.append(((base + alt) * 20)[:length])
    return out


@pytest.mark.parametrize("batch", [1, 3])
def test_tree_decoding_equals_greedy(model, batch):
    from specfsm.hf import SpeculativeGenerator
    from specfsm.hf.cost import CostModel

    prompts = _repetitive(7, (40, 23, 31)[:batch])
    # a flat cost: extra nodes are nearly free, so trees grow beside the chains (a chain
    # continued periodically is verified as a chain: periodic=False keeps the trees)
    gen = SpeculativeGenerator(model, drafter="suffix-tree", cost=CostModel({1: 1.0, 64: 1.2}), eos_token_id=None,
                               periodic=False)
    outs = gen.generate(prompts, 24)
    if max(gen.last_run.widths) > 1:  # (a one-token chain leaves no room beside it)
        assert gen.last_run.trees > 0
    for p, o in zip(prompts, outs):
        assert o.tokens == _reference(model, p, 24)
    # the default (periodic) decodes the same tokens, trees or not
    gen = SpeculativeGenerator(model, drafter="suffix-tree", cost=CostModel({1: 1.0, 64: 1.2}), eos_token_id=None)
    assert [o.tokens for o in gen.generate(prompts, 24)] == [o.tokens for o in outs]


def test_a_periodic_chain_is_verified_as_a_chain():
    """A draft continued periodically past the index's own continuation (``periodic``)
    holds tokens no tree of the index has: that step verifies the chain."""
    from specfsm.hf import SpeculativeGenerator
    from specfsm.hf.cost import CostModel

    model = _gpt2("sdpa")
    prompts = _repetitive(7, (40,))
    gen = SpeculativeGenerator(model, drafter="suffix-tree", cost=CostModel({1: 1.0, 64: 1.2}), eos_token_id=None)
    out = gen.generate(prompts, 24)
    assert max(gen.last_run.widths) > 1 and gen.last_run.trees == 0
    assert out[0].tokens == _reference(model, prompts[0], 24)


def test_tree_drafter_refuses_a_probability_rule_and_a_mask_blind_attention():
    from specfsm.accept.rules import SpeculativeSampling, TypicalAcceptance
    from specfsm.hf import SpeculativeGenerator

    m = _llama("sdpa")
    for rule in (SpeculativeSampling(seed=0), TypicalAcceptance()):
        with pytest.raises(ValueError, match="does not apply"):
            SpeculativeGenerator(m, drafter="suffix-tree", do_sample=True, rule=rule)
    m.config._attn_implementation = "flash_attention_2"
    with pytest.raises(UnsupportedModel, match="flash_attention_2"):
        SpeculativeGenerator(m, drafter="suffix-tree")
