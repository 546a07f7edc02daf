"""specfsm drafters inside vLLM, through its custom proposer extension point.

vLLM (the V1 engine, releases that ship ``vllm/v1/spec_decode/custom_class_proposer.py``)
loads a user class named by ``speculative_config.model`` when
``speculative_config.method == "custom_class"``, constructs it with the ``VllmConfig``
and, after every step's bookkeeping, calls::

    proposer.propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=...)

``sampled_token_ids`` holds one list per batch row (the tokens appended this step; empty
for a row that only ran part of its prefill), ``num_tokens_no_spec[i]`` is the length of
row ``i``'s verified history and ``token_ids_cpu[i, :num_tokens_no_spec[i]]`` that
history (an int32 ``[max_num_reqs, max_model_len]`` array; only the first
``len(sampled_token_ids)`` rows are in the batch). The return value is one draft per row.

Usage (the class path is the whole configuration vLLM needs)::

    LLM(model=..., speculative_config={
        "method": "custom_class",
        "model": "specfsm.vllm.SpecfsmNgramProposer",   # vLLM's n-gram drafts
        # or "specfsm.vllm.SpecfsmSuffixProposer":        unbounded longest match
        "num_speculative_tokens": 4,
    })

(The first vLLM builds with the extension point, from PR #39487, read the class path from
``speculative_config.custom_proposer_backend`` instead: ``{"custom_proposer_backend":
"specfsm.vllm.SpecfsmNgramProposer", "num_speculative_tokens": 4}``.)

Which vLLM drafter each proposer reproduces: ``SpecfsmNgramProposer`` gives the drafts of
the V1 model runner's ``NgramProposer`` (vLLM's ``ngram`` method on the V1 runner, which
``custom_class`` always runs on: the earliest occurrence of the longest matching n-gram
in ``min_n..max_n``, up to K tokens, none when nothing matches). On a GPU with Triton,
vLLM runs its ``ngram`` method on Model Runner V2 with its own speculator instead
(longest n, rightmost position, drafts padded to K); those drafts can differ, and
``prefer="latest"`` is the nearer setting. ``SpecfsmSuffixProposer`` is specfsm's own
answer to vLLM's ``suffix`` method (Arctic's suffix decoding): a long match (the longest
earlier occurrence of any length, in the request's own history and in the histories of
the requests that left the batch before it on this worker, a ``SharedSuffixCache``)
copies what followed it; a short one drafts the most frequent continuation counted in
the request's own ``SuffixTrie`` and in the worker's tries of every request's output;
each draft no longer than its match supports (``spec_factor``).

What ``custom_class`` gives up (vLLM 0.32's config and runner, read): Model Runner V2
refuses it (vLLM falls back to V1 with a warning); vLLM turns asynchronous scheduling
off for it by itself (and refuses ``async_scheduling=True``), so nothing needs passing
(its own ``ngram`` runs without it too: only EAGLE/MTP, draft models, ``ngram_gpu``,
DSpark and DFlash keep it); and the proposer is not told the step's K (vLLM hands
``num_spec_tokens_to_schedule`` to its own ``ngram`` only), so a dynamic-K schedule
(``num_speculative_tokens_per_batch_size``) does not shorten these drafts: they are up
to ``num_speculative_tokens`` every step.

``max_model_len`` is read from the ``VllmConfig``'s ``model_config`` at every call
(unless given as a keyword): vLLM's auto-fit (``max_model_len=-1``) writes the fitted
value into that same object in each worker after the proposer is built.

Settings (the n-gram range, ``prefer``, ``verify``; the suffix proposer's
``spec_factor``, ``shared_tokens``, ``shared_requests``, ``trie_depth``, ``trie_tokens``,
``trie_window`` and ``min_prob``) come from constructor keywords,
``additional_config={"specfsm": {...}}``, the ``SPECFSM_VLLM_*`` environment variables
(set in every worker process) or class attributes (a subclass), in that order (vLLM
zeroes ``prompt_lookup_min``/``max`` for ``custom_class``; ``specfsm.vllm.settings``
says it all); each proposer logs them once per worker process (logger
``specfsm.vllm``).

Each row's index follows its request by request id: the proposer finds the vLLM runner
that builds it and reads its input batch's ``req_ids`` at each call (``call``), so no
row drafts from another request's history; outside vLLM, ``propose(...,
req_ids=[...])`` does the same.

The package: ``settings`` (where each setting comes from, the once-per-worker log,
``ProposerConfig``), ``call`` (the call's arguments and each row's request id),
``rows`` (``RowTrackingProposer``: which batch row still holds its request, and each
step's index update and proposal) and ``proposers`` (the two classes above).
``settings()`` on a proposer returns the settings it runs with.

Importing this package does not import vLLM (or torch); a ``torch.Tensor`` argument is
read through its ``.numpy()`` view.
"""

from .proposers import SpecfsmNgramProposer, SpecfsmSuffixProposer
from .rows import RowTrackingProposer
from .settings import RANGE_SOURCES as RANGE_SOURCES  # module constants, re-exported
from .settings import VERIFY_MODES as VERIFY_MODES
from .settings import ProposerConfig

__all__ = ["RowTrackingProposer", "SpecfsmNgramProposer", "SpecfsmSuffixProposer", "ProposerConfig"]
