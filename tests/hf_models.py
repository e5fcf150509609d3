"""Helpers of the tests that hold zoo graphs against transformers' models (they import torch: torch tests only)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch


def hf_params(model: Any) -> dict[str, tuple[int, ...]]:
    return {n: tuple(p.shape) for n, p in model.named_parameters()}


def zoo_params(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    return {t.name: tuple(t.dims) for t in model.graph.initializer}


def hf_count(model: Any) -> int:
    """Parameters of a transformers model: each tensor once (a tied head is the embedding table)."""
    return sum(p.numel() for p in model.parameters())


def instantiate(cls: Any, cfg: Any, meta: bool = False) -> Any:
    """`cls(cfg)` in eval mode with seed 0, or on the meta device (no memory: any size)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if meta:
            with torch.device("meta"):
                return cls(cfg)
        torch.manual_seed(0)
        return cls(cfg).eval()


def with_hf_weights(zoo: onnx.ModelProto, hf: Any) -> onnx.ModelProto:
    """The zoo graph holding the HF model's weights (names are the same by construction)."""
    state = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    out = onnx.ModelProto()
    out.CopyFrom(zoo)
    for t in out.graph.initializer:
        t.CopyFrom(onnx.numpy_helper.from_array(np.ascontiguousarray(state[t.name]), t.name))
    return out


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def logits(zoo: onnx.ModelProto, hf: Any, vocab: int = 128, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(ours, transformers') logits on the same random ids [2, 10], our graph holding the HF model's weights."""
    ids = np.random.default_rng(seed).integers(0, vocab, (2, 10), dtype=np.int64)
    with torch.no_grad():
        expected = hf(input_ids=torch.from_numpy(ids), use_cache=False).logits.numpy()
    return run(with_hf_weights(zoo, hf), {"input_ids": ids}), expected


def perturb_norms_and_biases(hf: Any, scale: float = 0.1) -> None:
    """Norm weights and biases start at constants: move them so a misplaced one changes the logits."""
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(scale * torch.randn_like(p))
