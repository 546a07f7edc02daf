"""Import path ``specfsm.batch`` kept for user code: the module lives in ``specfsm.machine.batch``.

This file makes the old path the same module object (not a copy), so
``specfsm.batch is specfsm.machine.batch``; nothing inside the package imports the old path.
"""

import sys

from specfsm.machine import batch as _module

sys.modules[__name__] = _module
