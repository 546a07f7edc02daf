"""Serving: the one speculative serving loop on ``BatchState``, the replay workloads and
their statistics.
"""
