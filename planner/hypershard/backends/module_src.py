"""Source shared by the exporters whose generated files work on a torch `nn.Module` (torch, hyper-parallel).

Both apply the declaration's recompute rules layer by layer and cut a
Hugging Face *ForCausalLM into pipeline chunks the same way; only the
wrappers differ (torch's checkpoint_wrapper and save_on_cpu, or
hyper-parallel's checkpoint_wrapper and swap_wrapper). So the rule
matching, the per-layer loop and the chunking are written once here, and
each exporter's body defines the three wrappers the loop calls:
`_full(module)` (full recompute), `_selective(module)` (keep matmul
outputs, recompute the rest) and `_swap(module)` (saved activations in
host memory). The generated file must import `fnmatch`, `copy`, `torch`,
`nn` and a `CheckpointPolicy` enum with MUST_SAVE and PREFER_RECOMPUTE.
"""

from __future__ import annotations

#: The recompute rules applied per layer; the body defines `_full`, `_selective` and `_swap`.
LAYERS_SRC = r'''
def _matches(path, pattern):
    return path.count(".") == pattern.count(".") and fnmatch.fnmatchcase(path, pattern)


def _layers(model):
    """The layers (modules the recompute rules name) that hold parameters on this rank."""
    return [(path, m) for path, m in model.named_modules()
            if path and _rule_of(path) is not None and any(True for _ in m.parameters())]


def _rule_of(path):
    """A layer's recompute rule: its exact entry, else the glob (of the same depth) that matches it."""
    for rule in RECOMPUTE:
        if rule["match"] == path:
            return rule
    return next((r for r in RECOMPUTE if any(c in r["match"] for c in "*?[") and _matches(path, r["match"])), None)


def _replace(model, path, new):
    parent, _, leaf = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, new)


def _save_matmuls(ctx, op, *args, **kwargs):
    """Selective recompute: keep matmul outputs, recompute the rest (the attention core, Korthikanti 2022)."""
    keep = op in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten._scaled_mm.default)
    return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE


def apply_recompute(model):
    """Checkpoint or swap each layer as its recompute rule says (swap: the first share of the layers)."""
    layers = _layers(model)
    for k, (path, module) in enumerate(layers):
        rule = _rule_of(path)
        if rule["default"] == "recompute":
            module = _full(module)
        elif rule.get("ops", {}).get("core_attention") == "recompute":
            module = _selective(module)
        if k < round(rule.get("swap_fraction", 0.0) * len(layers)):
            module = _swap(module)
        _replace(model, path, module)
    return model
'''

#: Pipeline chunks of a Hugging Face *ForCausalLM (`CHUNKS`: each chunk's layers and blocks, in order).
CHUNKS_SRC = r'''
class _Absent(nn.Module):
    """Stands for the first chunk's embeddings in a later chunk, which takes hidden states: a model that still
    looks them up (GPT-2 adds its position embedding to given inputs_embeds) adds nothing."""

    def forward(self, *args, **kwargs):
        return torch.zeros(())


class _Skip(nn.Module):
    """Stands for a layer of another chunk: passes the hidden states through (names and indices stay)."""

    def forward(self, hidden_states, *args, **kwargs):
        return hidden_states


def chunk_model(model, chunk):
    """A copy of `model` with only this chunk's layers; other chunks' embeddings go (`_Absent`), their head too
    (Identity), so parameter names stay those of the declaration."""
    model = copy.deepcopy(model)
    layers = [n for c in CHUNKS for n in c["layers"]]
    for c, spec in enumerate(CHUNKS):
        if c == chunk:
            continue
        for name in spec["layers"]:
            _replace(model, name, _Skip())
        for path in spec["blocks"]:
            if any(n.startswith(path + ".") for n in layers) or not _has_params(model, path):
                continue
            _replace(model, path, _Absent() if c == 0 else nn.Identity())
    return model


def _has_params(model, path):
    try:
        return any(True for _ in model.get_submodule(path).parameters())
    except AttributeError:
        return False
'''


def chunks(doc) -> list[dict]:
    """The `CHUNKS` table: every pipeline chunk's layers and blocks, in chunk order."""
    found = sorted((ch for st in doc["programs"][0]["stages"] for ch in st["chunks"]), key=lambda c: c["chunk"])
    return [{"layers": c["layers"], "blocks": c.get("blocks", [])} for c in found]


__all__ = ["CHUNKS_SRC", "LAYERS_SRC", "chunks"]
