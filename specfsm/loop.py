"""Import path ``specfsm.loop`` kept for user code: the module lives in ``specfsm.serving.loop``.

This file makes the old path the same module object (not a copy), so
``specfsm.loop is specfsm.serving.loop``; nothing inside the package imports the old path.
"""

import sys

from specfsm.serving import loop as _module

sys.modules[__name__] = _module
