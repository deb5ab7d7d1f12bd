"""A transformers model's shared experts served by lorasink: a module that
stands for them, and the helper that puts it in every MoE layer.

DeepSeek-style blocks add mlp.shared_experts(x) to the routed output.
Qwen2-MoE-style blocks add sigmoid(mlp.shared_expert_gate(x)) *
mlp.shared_expert(x); the server applies that gate itself (a forward
without gammas on a checkpoint with a gate), so the remote module takes
the place of shared_expert and the gate is replaced by one whose sigmoid
is exactly 1. Inference only: no gradient flows through the server.
"""
import warnings

import torch
from torch import nn

__all__ = ["RemoteSharedExperts", "GateAppliedRemotely", "replace_shared_experts", "set_adapter"]


class RemoteSharedExperts(nn.Module):
    """The shared-expert block of one layer, computed by lorasink.

    client: a lorasink.Client; layer: the checkpoint's layer number;
    adapter: None (the base model), a name, or a list of k names (or
    Nones) that splits the call's tokens into k equal runs in order, so a
    list with one name per sequence of a [B, S, H] batch gives each
    sequence its own adapter. Input [..., H] of any float dtype and
    device; output of the same shape, dtype and device (the server
    computes in fp32 and the result is cast back).
    """

    def __init__(self, client, layer, adapter=None, gated=False):
        super().__init__()
        self.client, self.layer, self.adapter, self.gated = client, int(layer), adapter, gated

    def extra_repr(self):
        return f"layer={self.layer}, adapter={self.adapter!r}, gate={'remote' if self.gated else 'none'}"

    def _adapters(self, tokens):
        a = self.adapter
        if a is None or isinstance(a, str):
            return a
        a = list(a)
        if not a or tokens % len(a):
            raise ValueError(f"layer {self.layer}: {len(a)} adapters do not split {tokens} tokens into equal runs")
        run = tokens // len(a)
        return [name for name in a for _ in range(run)]

    def forward(self, x):
        if torch.is_grad_enabled() and x.requires_grad:
            # Python shows it once per place: training through the model
            # would silently leave the shared experts out of the gradient.
            warnings.warn("lorasink.torch: no gradient flows through the remote shared experts (inference "
                          "only); run under torch.no_grad() or torch.inference_mode()", stacklevel=2)
        flat = x.reshape(-1, x.shape[-1])
        y = self.client.forward(self.layer, flat, adapters=self._adapters(flat.shape[0]))
        return y.to(dtype=x.dtype).reshape(x.shape)


class GateAppliedRemotely(nn.Module):
    """Stands for a Qwen2-MoE shared_expert_gate whose sigmoid the server
    already applied: it returns +inf, and sigmoid(+inf) * y is y exactly."""

    def forward(self, x):
        return torch.full((*x.shape[:-1], 1), float("inf"), dtype=x.dtype, device=x.device)


def _decoder_layers(model):
    """The decoder layers of a transformers model (a *ForCausalLM, its
    base model, or a PEFT model around either)."""
    m = model.get_base_model() if hasattr(model, "get_base_model") else model
    for path in ("model.layers", "layers", "model.language_model.layers", "language_model.model.layers"):
        obj = m
        for part in path.split("."):
            obj = getattr(obj, part, None)
        if isinstance(obj, nn.ModuleList):
            return obj
    raise ValueError(f"{type(m).__name__}: no decoder layers found (looked for model.layers and layers)")


def replace_shared_experts(model, client, adapter=None):
    """Replaces the shared experts of every layer that has them with a
    RemoteSharedExperts for adapter; returns the layer numbers replaced.

    Refuses (ValueError, before changing anything) a server that does not
    serve this model: another hidden size, a layer with shared experts it
    does not serve, or a gate on one side only (the gate would be lost or
    applied twice).
    """
    served = client.model()
    hidden = getattr(getattr(model, "config", None), "hidden_size", None)
    if hidden is not None and served["hidden"] != hidden:
        raise ValueError(f"the server's hidden size is {served['hidden']}, the model's {hidden}")
    plan = []
    for l, layer in enumerate(_decoder_layers(model)):
        mlp = getattr(layer, "mlp", None)
        if mlp is None:
            continue
        attr = "shared_experts" if hasattr(mlp, "shared_experts") else "shared_expert" if hasattr(
            mlp, "shared_expert") else None
        if attr is None or getattr(mlp, attr) is None:
            continue  # a dense layer, or a block without shared experts
        gated = getattr(mlp, "shared_expert_gate", None) is not None
        if l not in served["layers"]:
            raise ValueError(f"layer {l} has shared experts, the server serves layers {served['layers']}")
        if gated != bool(served.get("gate")):
            raise ValueError(f"layer {l}: the model {'has' if gated else 'has no'} shared-expert gate, "
                             f"the server {'applies one' if served.get('gate') else 'applies none'}")
        plan.append((l, mlp, attr, gated))
    for l, mlp, attr, gated in plan:
        setattr(mlp, attr, RemoteSharedExperts(client, l, adapter, gated))
        if gated:
            mlp.shared_expert_gate = GateAppliedRemotely()
    return [l for l, _, _, _ in plan]


def set_adapter(model, adapter):
    """Sets the adapter (None, a name, or a list as RemoteSharedExperts
    takes) of every remote shared-expert module of model."""
    for m in model.modules():
        if isinstance(m, RemoteSharedExperts):
            m.adapter = adapter
