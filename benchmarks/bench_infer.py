"""Time inference planning and print the published-deployment check (issue 9).

Three timings: profiling a graph for serving (import + profile, cold), one
serving plan of a whole CloudMatrix384 (384 NPUs: every prefill/decode
split, layouts and batches), and a what-if sweep over device counts. Then
each row of planner/inference/published_deployments.json: measured and estimated
tokens/s per device, the error, what limits the step; and the longest
context with and without KV-cache offload (issue 6's check).

Run: python benchmarks/bench_infer.py [--model NAME] [--cluster NAME]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, installed or not

from cost_models import load_cluster  # noqa: E402
from planner.api import plan_inference  # noqa: E402
from planner.inference.phase_cost import Layout, Precision  # noqa: E402
from planner.inference.search import Serving, max_context  # noqa: E402
from planner.inference.serve import load_profile  # noqa: E402
from planner.inference.sweep import run_infer_sweep  # noqa: E402
from planner.inference.validation import check_all  # noqa: E402


def timed(what: str, fn):
    t0 = time.perf_counter()
    out = fn()
    print(f"{what}: {time.perf_counter() - t0:.2f} s")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="deepseek-v3")
    ap.add_argument("--cluster", default="cloudmatrix384")
    args = ap.parse_args()
    prof = timed(f"profile {args.model} (import + serving profile)", lambda: load_profile(args.model))
    print(f"  {len(prof.layers)} layers, {prof.params / 1e9:.1f} B parameters, "
          f"KV cache {prof.cached_elements_per_token * 2:,.0f} bytes per token at bf16")
    kw = dict(cluster=args.cluster, prompt_len=4096, gen_len=1024, ttft_ms=2000, tpot_ms=50, dtype="int8")
    plan = timed(f"plan serving on all of {args.cluster}", lambda: plan_inference(args.model, **kw))
    pre, dec = plan["prefill"], plan["decode"]
    print(f"  {plan['serving']}: prefill {pre['devices']} x {pre['strategy']['summary']} "
          f"({pre['tokens_per_s_per_device']:,.0f} tok/s/dev, "
          f"TTFT {pre['ttft_ms']:.0f} ms), decode {dec['devices']} x {dec['strategy']['summary']} "
          f"({dec['tokens_per_s_per_device']:,.0f} tok/s/dev, TPOT {dec['tpot_ms']:.1f} ms)")
    with tempfile.TemporaryDirectory() as cache:
        sweep = timed("what-if sweep over 64, 128, 256, 384 devices (cold)",
                      lambda: run_infer_sweep(args.model, clusters=(args.cluster,), devices=(64, 128, 256, 384),
                                              prompt_len=4096, gen_len=1024, ttft_ms=2000, tpot_ms=50,
                                              dtype="int8", cache=cache))
    for p in sweep.doc["points"]:
        print(f"  {p['devices']:4d}: {p['plan']}, {p['output_tokens_per_s_per_device']:,.0f} output tok/s/dev")

    print("\npublished deployments (tokens/s per device):")
    rows = timed("estimate every row", lambda: check_all())
    for r in rows:
        mark = "" if r["compared"] else "   (not compared)"
        print(f"  {r['id']:34s} measured {r['measured']:8,.0f}  estimate {r['estimate']:8,.0f}  "
              f"{r['error']:+6.1%}  {r['limiter']}{mark}")
    compared = [abs(r["error"]) for r in rows if r["compared"]]
    print(f"  compared rows: mean |error| {sum(compared) / len(compared):.1%}, max {max(compared):.1%}")

    serving = Serving(prompt_len=1, gen_len=1, precision=Precision(dtype="int8"))
    lay = Layout(dp=16, ep=16)
    cm = load_cluster("cloudmatrix384")
    plain = max_context(prof, cm, serving, lay, batch=8)
    off = max_context(prof, cm, serving, lay, batch=8, kv_offload=0.9)
    print(f"\nlongest context, {args.model} int8 on 16 NPUs of cloudmatrix384, 8 sequences per NPU: "
          f"{plain:,} tokens in HBM, {off:,} with 90% of the KV cache in pooled DRAM ({off / plain:.2f}x)")


if __name__ == "__main__":
    main()
