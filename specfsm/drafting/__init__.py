"""Drafting: what the drafter proposes for the target to verify.

Prompt lookup and the common prefix (``lookup``), the incremental n-gram and suffix
indexes (``ngram_index``, ``suffix_index``; ``NgramDrafter``, ``SuffixDrafter``), their
twins (``_ngram_py``, ``_ngram_index_py``, ``_suffix_index_py``) and the twins' shared
machinery (``_index_py``), the checks all of them share (``_checks``), and the one
serving-step policy each index kind runs (``serve`` / ``serve_batch``). This file imports
nothing: the compiled index modules import ``_checks`` while ``specfsm._impl`` is still
choosing. The public names are ``specfsm``'s (``specfsm.prompt_lookup``, ...).
"""
