"""Import path ``specfsm.state`` kept for user code: the module lives in ``specfsm.machine.state``.

This file makes the old path the same module object (not a copy), so
``specfsm.state is specfsm.machine.state``; nothing inside the package imports the old path.
"""

import sys

from specfsm.machine import state as _module

sys.modules[__name__] = _module
