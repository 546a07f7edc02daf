"""Compiled Cython modules (built from the top-level ``_core/`` sources)."""
