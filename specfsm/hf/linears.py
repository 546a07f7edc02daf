"""Linear layers whose cost grows with rows as a verify needs: ``pack_linears``.

Speculative decoding pays when a forward over a draft's K rows costs about what a one-row
decode costs. On the CPU, torch's stock ``nn.Linear`` (MKL's ``sgemm``) does not give
that: with one thread on this project's 2-core AMD EPYC VM, SmolLM2-135M's 210 linear
layers take 35.9 ms for one row and 46.8-55.2 ms for two, four or eight. oneDNN, which
torch ships, takes each weight packed once (``torch.ops.mkldnn._reorder_linear_weight``,
what torch's own CPU compiler uses for frozen models) and then evaluates two to eight
rows in 29.8-37.7 ms; a weight stored transposed takes one row in 33.7 ms
(``benchmarks/test_bench_linears.py``; docs/numbers.md, "Packed linear layers").

``pack_linears(model)`` gives every ``torch.nn.Linear`` of a float32 CPU model that
forward: one row through the transposed copy, more through oneDNN's packed copy (two
rows padded to three, which oneDNN evaluates faster here). It is
numerically a different summation order (as any change of row count already is with
``sgemm``), not an approximation; greedy identity is checked on every output as before.
It costs two copies of each linear weight in memory (SmolLM2: about 1 GiB) and falls back
to the stock forward, per call, wherever the packed one does not apply: gradients
enabled, an input that is not float32 on the CPU, or a weight that was replaced or
changed in place since packing. ``load_model`` packs by default (``linears="stock"``
leaves the model as loaded), so every method a comparison runs (greedy, prompt lookup,
specfsm) evaluates the same layers.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LINEARS", "pack_linears", "unpack_linears", "linears_of"]

#: the choices ``load_model(linears=)`` and ``--linears`` take
LINEARS = ("packed", "stock")


class _Packed:
    """One linear layer's packed forward: the copies it reads and the weight they came
    from (identity and version), so a replaced or rewritten weight is never read stale."""

    __slots__ = ("module", "weight", "version", "storage", "transposed", "packed")

    def __init__(self, module: Any) -> None:
        import torch

        w = module.weight.detach()
        self.module = module
        self.weight = module.weight
        self.version = module.weight._version
        self.storage = module.weight.data_ptr()  # ``weight.data = ...`` keeps the version
        self.transposed = w.t().contiguous()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), None)

    def __call__(self, x: Any) -> Any:
        import torch

        mod = self.module
        w, b = mod.weight, mod.bias
        if (w is not self.weight or w._version != self.version or w.data_ptr() != self.storage
                or x.dtype is not torch.float32
                or x.device.type != "cpu" or x.dim() == 0 or x.shape[-1] != self.transposed.shape[0]
                or (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad
                                                 or (b is not None and b.requires_grad)))):
            return torch.nn.functional.linear(x, w, b)
        rows = x.numel() // x.shape[-1]
        if rows == 1:
            y = torch.matmul(x, self.transposed)
            return y if b is None else y.add_(b)
        if rows == 2:  # oneDNN evaluates 3 rows faster than 2: a zero row pads them
            x3 = torch.cat((x.reshape(2, -1), x.new_zeros((1, x.shape[-1]))))
            y = torch.ops.mkldnn._linear_pointwise(x3, self.packed, b, "none", [], "")
            return y[:2].reshape(*x.shape[:-1], y.shape[-1])
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, b, "none", [], "")


def pack_linears(model: Any) -> int:
    """Give each float32 CPU ``torch.nn.Linear`` in ``model`` the packed forward (module
    docstring) and return how many were packed; 0 where torch has no oneDNN or the model
    has no such layer. Packing twice packs nothing new; ``unpack_linears`` undoes it."""
    import torch

    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return 0
    n = 0
    with torch.no_grad():
        for mod in model.modules():
            if (type(mod) is not torch.nn.Linear or isinstance(mod.__dict__.get("forward"), _Packed)
                    or mod.weight.dtype is not torch.float32 or mod.weight.device.type != "cpu"):
                continue
            try:
                mod.__dict__["forward"] = _Packed(mod)  # an instance attribute, as nn.Module keeps one
            except RuntimeError:  # a oneDNN build that refuses the layout: stock
                continue
            n += 1
    return n


def unpack_linears(model: Any) -> int:
    """Give the packed layers of ``model`` their stock forward back (the copies are freed);
    returns how many."""
    n = 0
    for mod in model.modules():
        if isinstance(mod.__dict__.get("forward"), _Packed):
            del mod.forward
            n += 1
    return n


def linears_of(module: Any) -> str:
    """``"packed"`` when ``module`` (a layer or a model) has a packed linear layer, else
    ``"stock"``: part of what a measurement of its cost depends on."""
    mods = module.modules() if hasattr(module, "modules") else ()
    return "packed" if any(isinstance(m.__dict__.get("forward"), _Packed) for m in mods) else "stock"
