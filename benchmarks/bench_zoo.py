"""Build time and file size of the zoo's largest graphs (target: < 2 s each).

    python benchmarks/bench_zoo.py [NAME ...]

Prints, per model: build time (best of 3), serialized size, nodes,
initializers, parameters; and the time of onnx.checker + strict shape
inference, which every test of the zoo pays.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import onnx  # noqa: E402

import models_zoo  # noqa: E402

DEFAULT = ("deepseek-v3", "llama3-405b", "internvl2-76b", "omni-moe-30b-a3b")


def bench(name: str, **overrides: object) -> dict[str, float]:
    times = []
    for _ in range(3):
        start = time.perf_counter()
        model = models_zoo.build(name, **overrides)
        times.append(time.perf_counter() - start)
    data = model.SerializeToString()
    start = time.perf_counter()
    onnx.checker.check_model(model, full_check=True)
    onnx.shape_inference.infer_shapes(model, strict_mode=True)
    check_s = time.perf_counter() - start
    total, active = models_zoo.param_counts(name, **overrides)
    return {
        "build_s": min(times), "check_s": check_s, "size_mb": len(data) / 1e6, "nodes": len(model.graph.node),
        "initializers": len(model.graph.initializer), "params_b": total / 1e9, "active_b": active / 1e9,
    }


def main(names: list[str]) -> None:
    runs = [(n, {}) for n in (names or DEFAULT)]
    if not names:
        runs.append(("deepseek-v3", {"expert_layout": "per_expert"}))
    head = ("build s", "check s", "MB", "nodes", "inits", "params", "active")
    print(f"{'model':34s} " + " ".join(f"{h:>8s}" for h in head))
    for name, overrides in runs:
        r = bench(name, **overrides)
        label = name + ("" if not overrides else " " + ",".join(f"{k}={v}" for k, v in overrides.items()))
        print(f"{label:34s} {r['build_s']:8.3f} {r['check_s']:8.3f} {r['size_mb']:8.2f} {r['nodes']:8d} "
              f"{r['initializers']:8d} {r['params_b']:7.1f}B {r['active_b']:7.1f}B")


if __name__ == "__main__":
    main(sys.argv[1:])
