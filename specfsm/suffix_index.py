"""Import path ``specfsm.suffix_index`` kept for user code: the module lives in ``specfsm.drafting.suffix_index``.

This file makes the old path the same module object (not a copy), so
``specfsm.suffix_index is specfsm.drafting.suffix_index``; nothing inside the package imports the old path.
"""

import sys

from specfsm.drafting import suffix_index as _module

sys.modules[__name__] = _module
