"""Import path ``specfsm.ngram_index`` kept for user code: the module lives in ``specfsm.drafting.ngram_index``.

This file makes the old path the same module object (not a copy), so
``specfsm.ngram_index is specfsm.drafting.ngram_index``; nothing inside the package imports the old path.
"""

import sys

from specfsm.drafting import ngram_index as _module

sys.modules[__name__] = _module
