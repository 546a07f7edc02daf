"""Tree verification: greedy acceptance of the longest confirmed path through a tree of
drafts, and the placement of that path's cache rows.

``tree`` is the public face (``check_tree``, ``accept_tree``, ``accept_tree_batch``,
``place_path``, ``place_path_batch``), bound to the active implementation's kernels
(``specfsm._core.tree`` or its twin ``_tree_py``); ``_checks`` holds the checks and
messages both share. The state machine's tree verify is ``specfsm.machine.state.VerifyTree``.
This file imports nothing: the compiled kernel imports ``_checks`` while
``specfsm._impl`` is still choosing.
"""
