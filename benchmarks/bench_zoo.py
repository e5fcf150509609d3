"""Build time and file size of the zoo's largest graphs, in both forms (targets: < 2 s, a few hundred KB).

    python benchmarks/bench_zoo.py [--import] [NAME ...]

Prints, per model and form (``compact``: one local function per layer type,
the default; ``flat``: every layer written out): build time (best of 3),
serialized size, nodes in the file and once inlined, initializers,
parameters; the time of onnx.checker + strict shape inference, which every
test of the zoo pays; and with ``--import``, hyperplan's import time of the
saved file (best and median of 5, the two forms interleaved so that load on
the machine hits both alike).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import onnx  # noqa: E402

import models_zoo  # noqa: E402

DEFAULT = ("deepseek-v3", "llama3-405b", "internvl2-76b", "omni-moe-30b-a3b")
FORMS = (("compact", False), ("flat", True))
IMPORT_RUNS = 5


def bench(name: str, flat: bool, **overrides: object) -> tuple[dict[str, float], onnx.ModelProto]:
    times = []
    for _ in range(3):
        start = time.perf_counter()
        model = models_zoo.build(name, flat=flat, **overrides)
        times.append(time.perf_counter() - start)
    data = model.SerializeToString()
    start = time.perf_counter()
    onnx.checker.check_model(model, full_check=True)
    onnx.shape_inference.infer_shapes(model, strict_mode=True)
    check_s = time.perf_counter() - start
    total, active = models_zoo.param_counts(name, **overrides)
    return {
        "build_s": min(times), "check_s": check_s, "size_kb": len(data) / 1e3, "nodes": len(model.graph.node),
        "inlined": models_zoo.inlined_node_count(model), "initializers": len(model.graph.initializer),
        "params_b": total / 1e9, "active_b": active / 1e9,
    }, model


def import_times(models: dict[str, onnx.ModelProto]) -> dict[str, tuple[float, float]]:
    """(best, median) seconds of `import_model(path)` per form, runs interleaved."""
    from planner.graph.onnx_import import import_model

    times: dict[str, list[float]] = {form: [] for form in models}
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for form, model in models.items():
            paths[form] = os.path.join(tmp, f"{form}.onnx")
            onnx.save_model(model, paths[form])
        for _ in range(IMPORT_RUNS):
            for form, path in paths.items():
                start = time.perf_counter()
                import_model(path)
                times[form].append(time.perf_counter() - start)
    return {form: (min(t), sorted(t)[len(t) // 2]) for form, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*")
    ap.add_argument("--import", dest="imports", action="store_true", help="also time hyperplan's import")
    args = ap.parse_args()
    runs = [(n, {}) for n in (args.names or DEFAULT)]
    if not args.names:
        runs.append(("deepseek-v3", {"expert_layout": "per_expert"}))
    head = ("build s", "check s", "KB", "nodes", "inlined", "inits", "params", "active")
    head += ("import s", "median s") if args.imports else ()
    print(f"{'model':38s} {'form':8s} " + " ".join(f"{h:>8s}" for h in head))
    for name, overrides in runs:
        label = name + ("" if not overrides else " " + ",".join(f"{k}={v}" for k, v in overrides.items()))
        rows, models = {}, {}
        for form, flat in FORMS:
            rows[form], models[form] = bench(name, flat, **overrides)
        imported = import_times(models) if args.imports else {}
        for form, _ in FORMS:
            r = rows[form]
            line = (f"{label:38s} {form:8s} {r['build_s']:8.3f} {r['check_s']:8.3f} {r['size_kb']:8.0f} "
                    f"{r['nodes']:8d} {r['inlined']:8d} {r['initializers']:8d} {r['params_b']:7.1f}B "
                    f"{r['active_b']:7.1f}B")
            if form in imported:
                line += f" {imported[form][0]:8.3f} {imported[form][1]:8.3f}"
            print(line)


if __name__ == "__main__":
    main()
