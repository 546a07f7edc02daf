"""Import path ``specfsm.workload`` kept for user code: the module lives in ``specfsm.serving.workload``.

This file makes the old path the same module object (not a copy), so
``specfsm.workload is specfsm.serving.workload``; nothing inside the package imports the old path.
"""

import sys

from specfsm.serving import workload as _module

sys.modules[__name__] = _module
