"""Placement: moving each request's cache row after a verify, on the host and in CuPy.

``place`` is the public face (``place_rows``, ``snapshot``, ``settle_index``,
``check_errors``; ``specfsm.gpu`` is their documented import path): numpy arrays go to the
active implementation's host kernel (``specfsm._core.place`` or its twin ``_place_py``),
CuPy arrays to ``_cupy`` (one custom kernel launch, ``place_rows.cu``, geometry in
``_geometry``). ``_checks`` holds the checks all three share. This file imports nothing:
the compiled host kernel imports ``_checks`` while ``specfsm._impl`` is still choosing.
"""
