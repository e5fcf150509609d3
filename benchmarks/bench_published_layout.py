"""The plan against a published layout, both scored by the estimate: DeepSeek-V3 on 1,024 H100s.

    python benchmarks/bench_published_layout.py

The published layout is Megatron-Bridge's DeepSeek-V3 pre-training on 1,024 H100s (NeMo 25.09: TP2, PP8,
VPP4, EP64, FP8, sequences of 4096, global batch 8192; measured 1,297 tokens/s per GPU, a 25.26 s step:
planner/calibration/runs/h100.json). Each is scored twice: under the default megatron-core stack, and under
the recipe's own settings (DeepEP dispatch, routing limited to 4 node groups, MLA up-projection and MLP
recompute, no gradient-reduce overlap, the 1F1B expert all-to-all overlap, no TP overlap, bf16 Adam
moments), written as a stack file on top of megatron-core; then under the recipe's settings as the run was
laid out, with its multi-token-prediction depth and its pipeline layout (the plan then plans that depth
too). Prints the step times, what the plan chose, and its runners-up. Takes about six minutes.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.api import estimate_model, plan_model  # noqa: E402

RECIPE = """[stack]
name = "megatron-bridge-dsv3"
base = "megatron-core"
description = "Megatron-Bridge's DeepSeek-V3 H100 recipe, as its 25.09 release ran it"
sources = ["NVIDIA-NeMo/Megatron-Bridge r0.1.0 scripts/performance/run_script.py and recipes/deepseek/deepseek_v3.py"]

[overlap]
overlap_grad_reduce = false
overlap_ep_comm = true   # A2A_1F1B on H100
overlap_tp_comm = false  # no comm_overlap_config: the recipe's CommOverlapConfig(tp_comm_overlap=False)

[states]
optimizer_bytes = 8.0  # precision-aware optimizer: fp32 master weights, bf16 Adam moments

[recompute]
recompute_modules = ["mla_up_proj", "mlp"]

[moe]
moe_dispatcher = "deepep"
moe_group_limit = 4
moe_groups = 8
"""
JOB = dict(cluster="dgx-h100", devices=1024, global_batch=8192, seq_len=4096, dtype="fp8")
PUBLISHED = dict(tp=2, pp=8, vpp=4, ep=64, etp=1, sp=True, micro_batch=1, zero=1, recompute="selective")
MEASURED_S = 8192 * 4096 / (1297 * 1024)
#: As the run was laid out: one multi-token-prediction depth (the recipe's mtp_num_layers = 1, the zoo's
#: mtp_layers) and the pipeline layout 'Et|(tt|)*30mL' (r0.1.0 run_script.py): the embedding and 1 layer, 30
#: chunks of 2, then the MTP depth with the loss.
AS_RUN = dict(stage_layers=(1,) + (2,) * 30 + (1,))


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        recipe = Path(tmp) / "megatron-bridge-dsv3.toml"
        recipe.write_text(RECIPE)
        print(f"DeepSeek-V3, 1,024 x H100, FP8, seq 4096, batch 8192; published layout measured {MEASURED_S:.2f} s")
        for label, stack, as_run in (("megatron-core", None, {}), ("the recipe's settings", str(recipe), {}),
                                     ("the recipe's settings, its MTP depth and its pipeline layout", str(recipe),
                                      AS_RUN)):
            t0 = time.perf_counter()
            overrides = {"mtp_layers": 1} if as_run else None
            pub = estimate_model("deepseek-v3", stack=stack, overrides=overrides, **JOB, **(PUBLISHED | as_run))
            got = plan_model("deepseek-v3", stack=stack, overrides=overrides, time_limit_s=600, **JOB)
            wall = time.perf_counter() - t0
            est, mp = got["estimate"], got.get("mpmd") or {}  # no mpmd entry when no HyperMPMD split was tried
            chosen = mp["label"] if mp.get("used") else got["strategy"]["summary"]
            print(f"\nstack: {label}")
            print(f"  published {pub['strategy']['summary']}: {pub['step_time_s']:.2f} s")
            print(f"  plan      {chosen}: {est['step_time_s']:.2f} s "
                  f"({pub['step_time_s'] / est['step_time_s'] - 1:+.1%} faster by the model; {wall:.0f} s; "
                  f"{got['search']['optimal_within']})")
            for prog in mp.get("programs", []) if mp.get("used") else ():
                print(f"    {prog['name']} on {prog['devices']}: {prog['summary']} ({prog['step_time_s']:.2f} s)")
            for r in got["runners_up"][:4]:
                print(f"  runner-up {r['summary']}: {r['step_time_s']:.2f} s ({r['why']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
