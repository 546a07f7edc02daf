"""Where the vLLM proposers' settings come from, and the once-per-worker log of them.

vLLM resets ``prompt_lookup_min``/``prompt_lookup_max`` to 0 for ``custom_class``, and
keeps no copy of a user's values, so the n-gram range comes from, in order: constructor
keywords (a subclass's ``__init__``); positive ``prompt_lookup_min``/``max`` (a vLLM
version that keeps them); ``additional_config={"specfsm": {"min_n": .., "max_n": ..,
"prefer": .., "verify": ..}}`` (``LLM(additional_config=...)`` or
``--additional-config``: vLLM hands that dict to every worker unchanged); the
environment (``SPECFSM_VLLM_MIN_N``, ``SPECFSM_VLLM_MAX_N``, ``SPECFSM_VLLM_PREFER``,
``SPECFSM_VLLM_VERIFY``, which must be set in every worker process); class attributes
(subclass to change them); else vLLM's n-gram defaults (``5..5``,
``prefer="earliest"``). Every other setting (``prefer``, ``verify``, the suffix
proposer's ``spec_factor``, ``shared_tokens``, ``shared_requests``, ``trie_depth``,
``trie_tokens``, ``trie_window`` and ``min_prob``) comes from the
keyword, ``additional_config["specfsm"]``, ``SPECFSM_VLLM_<NAME>`` or the class attribute
(``setting``). Each proposer logs the settings it runs with and where the range
came from once per worker process (logger ``specfsm.vllm``; inside vLLM, unless
something handles that logger, ``vllm.specfsm``, which vLLM's handlers print).
``ProposerConfig`` stands in for a ``VllmConfig`` outside vLLM.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from .._checks import check_count

__all__ = [
    "INDEX_SETTINGS",
    "RANGE_SOURCES",
    "SETTINGS",
    "SUFFIX_SETTINGS",
    "VERIFY_MODES",
    "ProposerConfig",
    "additional_settings",
    "env_setting",
    "log_settings",
    "range_sources",
    "setting",
    "verify_setting",
]

#: ``verify`` modes: ``"sparse"`` is the row rule (the row's request id when known, its
#: growth since the last call, its last ``TAIL`` tokens and, in turn, ``SPREAD`` spread
#: positions; without ids, every token of short rows and twins); ``"full"`` compares
#: every indexed token of every row, every step.
VERIFY_MODES = ("sparse", "full")


class ProposerConfig:
    """A stand-in for the two parts of a ``VllmConfig`` the proposers read.

    ``ProposerConfig(num_speculative_tokens=4, max_model_len=4096, prompt_lookup_min=2,
    prompt_lookup_max=4)`` has ``.speculative_config`` and ``.model_config`` like vLLM's,
    for tests and for use without vLLM.
    """

    class _Spec:
        def __init__(self, k: Any, lo: Any, hi: Any) -> None:
            self.method = "custom_class"
            self.num_speculative_tokens = k
            self.prompt_lookup_min = lo
            self.prompt_lookup_max = hi

    class _Model:
        def __init__(self, max_model_len: Any) -> None:
            self.max_model_len = max_model_len

    def __init__(
        self,
        num_speculative_tokens: Any = 4,
        max_model_len: Any = None,
        prompt_lookup_min: Any = None,
        prompt_lookup_max: Any = None,
    ) -> None:
        self.speculative_config = self._Spec(num_speculative_tokens, prompt_lookup_min, prompt_lookup_max)
        self.model_config = self._Model(max_model_len)


def env_setting(name: str) -> str | None:
    """Environment variable ``name``, stripped; None when unset or blank."""
    value = os.environ.get(name, "").strip()
    return value or None


def _env_count(name: str) -> int | None:
    value = env_setting(name)
    if value is None:
        return None
    try:
        return check_count(int(value), name)
    except ValueError:
        raise ValueError(f"environment variable {name} must be a non-negative integer, got {value!r}") from None


def _positive(value: Any) -> int | None:
    """``value`` as an int when it is a positive integer (vLLM's "set"), else None."""
    if value is None or isinstance(value, bool):
        return None
    try:
        v = int(value)
    except (TypeError, ValueError):
        return None
    return v if v > 0 else None


def additional_settings(vllm_config: Any) -> dict:
    """``vllm_config.additional_config["specfsm"]``: a dict vLLM keeps and hands to every
    worker unchanged (``LLM(..., additional_config={"specfsm": {"min_n": 2, ...}})``, or
    ``--additional-config '{"specfsm": {...}}'``); {} when absent. Refuses a non-dict
    (TypeError) and unknown settings (ValueError)."""
    extra = getattr(vllm_config, "additional_config", None)
    if not isinstance(extra, dict) or "specfsm" not in extra:
        return {}
    mine = extra["specfsm"]
    if not isinstance(mine, dict):
        raise TypeError(f'additional_config["specfsm"] must be a dict of proposer settings, got {mine!r}')
    unknown = sorted(set(mine) - set(SETTINGS))
    if unknown:
        raise ValueError(f'additional_config["specfsm"] has unknown settings {unknown}; '
                         f"known: {', '.join(SETTINGS)}")
    return mine


#: the settings ``additional_config["specfsm"]`` may hold for every proposer, and those
#: only the suffix proposer takes
INDEX_SETTINGS = ("min_n", "max_n", "prefer", "verify")
SUFFIX_SETTINGS = ("spec_factor", "shared_tokens", "shared_requests", "trie_depth", "trie_tokens", "trie_window",
                   "min_prob")
SETTINGS = INDEX_SETTINGS + SUFFIX_SETTINGS

#: where each settings source is named in the settings log
RANGE_SOURCES = ("keyword", "speculative_config", "additional_config", "environment", "class")


def range_sources(vllm_config: Any, min_n: Any, max_n: Any, cls: type) -> list[tuple[Any, Any]]:
    """The ``(min_n, max_n)`` each settings source gives, in priority order (named by
    ``RANGE_SOURCES``): the keywords, the ``speculative_config``'s positive
    ``prompt_lookup_min`` / ``max`` (vLLM zeroes both for ``custom_class``, so this is
    silent there), ``additional_config["specfsm"]``, the environment
    (``SPECFSM_VLLM_MIN_N`` / ``MAX_N``), the class attributes; None where a source is
    silent. Each proposer combines them by its own rule."""
    spec = getattr(vllm_config, "speculative_config", None)
    extra = additional_settings(vllm_config)
    return [
        (min_n, max_n),
        (_positive(getattr(spec, "prompt_lookup_min", None)), _positive(getattr(spec, "prompt_lookup_max", None))),
        (extra.get("min_n"), extra.get("max_n")),
        (_env_count("SPECFSM_VLLM_MIN_N"), _env_count("SPECFSM_VLLM_MAX_N")),
        (cls.min_n, cls.max_n),  # type: ignore[attr-defined]
    ]


def setting(name: str, value: Any, vllm_config: Any, default: Any, parse: Any = None) -> Any:
    """Setting ``name``: ``value`` (the keyword) when not None, else
    ``additional_config["specfsm"][name]``, else the environment variable
    ``SPECFSM_VLLM_<NAME>`` (its string, read by ``parse`` when given: a ValueError names
    the variable), else ``default`` (the class attribute). The caller checks the value."""
    if value is not None:
        return value
    extra = additional_settings(vllm_config)
    if extra.get(name) is not None:
        return extra[name]
    env = "SPECFSM_VLLM_" + name.upper()
    text = env_setting(env)
    if text is None:
        return default
    if parse is None:
        return text
    try:
        return parse(text)
    except ValueError:
        raise ValueError(f"environment variable {env} is not a valid {name} ({parse.__name__}), got {text!r}") from None


def verify_setting(verify: Any, vllm_config: Any, default: str) -> str:
    """``verify`` by ``setting``'s order; refuses a mode not in ``VERIFY_MODES``."""
    verify = setting("verify", verify, vllm_config, default)
    if verify not in VERIFY_MODES:
        raise ValueError(f"verify must be one of {VERIFY_MODES}, got {verify!r}")
    return verify


_logged: set = set()  # settings already logged in this process (one line per worker)


def log_settings(text: str) -> None:
    """Log ``text`` once per process, at INFO, on the ``specfsm.vllm`` logger; inside
    vLLM, when nothing handles that logger (no handler on it or above it: vLLM
    configures only its own ``vllm`` logger), on ``vllm.specfsm`` instead, so vLLM's
    handlers print it with the worker's prefix."""
    if text in _logged:
        return
    _logged.add(text)
    log = logging.getLogger("specfsm.vllm")
    if "vllm" in sys.modules and not log.hasHandlers():
        log = logging.getLogger("vllm.specfsm")
    log.info("%s", text)
