"""Import path ``specfsm.accept_rule`` kept for user code: the module lives in ``specfsm.accept.rules``.

This file makes the old path the same module object (not a copy), so
``specfsm.accept_rule is specfsm.accept.rules``; nothing inside the package imports the old path.
"""

import sys

from specfsm.accept import rules as _module

sys.modules[__name__] = _module
