"""Acceptance: the rules that decide how much of a verified draft to keep (greedy exact,
``MinRun``, speculative sampling, typical acceptance) and their kernels' twins.
"""
