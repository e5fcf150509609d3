"""Developer check: hyperplan's hyper-parallel exports run, unedited, on the real hyper-parallel (torch platform).

    python benchmarks/check_hyper_parallel.py /path/to/hyper-parallel [--commit SHA] [--only NAME ...]

hyper-parallel (mindspore-ai/hyper-parallel) is not on PyPI, so CI cannot install it: this check takes a
source checkout (the folder holding `hyper_parallel/`), imports it with HYPER_PARALLEL_PLATFORM=torch, and
for each scenario declares a plan for a tiny Llama (transformers' LlamaForCausalLM, 8 layers, hidden 64),
exports it with `--backend hyper-parallel`, and runs one training step with the exported file on 4 gloo
processes on the CPU (file rendezvous, fork; a fresh process group per scenario, so a scenario that hangs or
fails leaves the others alone). It compares the loss and every gradient with a single-process step and prints
per scenario ok or failed, the loss difference, the largest gradient difference, and the source commit.
The tensor-parallel plans are hand-edited to Megatron's layouts (at hidden 64 the planner keeps weights
whole), as in tests/test_hypershard_torch.py. Results are recorded in benchmarks/hyper_parallel_check.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import traceback
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.hypershard import declare  # noqa: E402
from planner.hypershard.backends import export_to_file  # noqa: E402
from tests.forked import run_forked  # noqa: E402
from tests.layout_edits import megatron  # noqa: E402

WORLD, BATCH, SEQ, VOCAB, LAYERS = 4, 8, 16, 128, 8
TINY = dict(layers=LAYERS, hidden=64, heads=4, kv_heads=4, vocab=VOCAB, ffn=128)
#: name -> (strategy, hand-edited to Megatron's layouts, run as a pipeline)
SCENARIOS = {
    "tp": (dict(tp=4), True, False),
    "tp_sp": (dict(tp=4, sp=True), True, False),
    "zero3": (dict(zero=3), False, False),
    "zero2_full_recompute": (dict(zero=2, recompute="full"), False, False),
    "zero1_selective_recompute": (dict(zero=1, recompute="selective"), False, False),
    "zero0_activation_swap": (dict(zero=0, offload=(("activations", 0.5),)), False, False),
    "zero2_host_offload": (dict(zero=2, offload=(("params", 1.0),)), False, False),
    "pp4_1f1b": (dict(pp=4), False, True),
    "pp4_gpipe": (dict(pp=4, schedule="gpipe"), False, True),
    "pp4_interleaved": (dict(pp=4, vpp=2), False, True),
    "pp2_dp2_1f1b_zero1": (dict(pp=2, zero=1), False, True),
    "pp2_tp2_1f1b": (dict(pp=2, tp=2), True, True),
}
TOLERANCE = {"loss": 1e-5, "grad": 1e-5}


def tiny_llama():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64, use_cache=False,
                      attn_implementation="eager")
    return LlamaForCausalLM(cfg).float()


def loss_fn(logits, target):
    """Hugging Face's causal-LM loss: each position predicts the next token."""
    import torch

    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                             target[:, 1:].reshape(-1))


def _clean(name: str) -> str:
    return name.replace("._checkpoint_wrapped_module", "").replace("._swap_wrapped_module", "")


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _whole_grad(p):
    """A parameter's whole gradient: hyper-parallel's DTensor parameter hands out its local shard's."""
    g = p.grad
    if not hasattr(g, "full_tensor") and hasattr(p, "placements"):
        from hyper_parallel import DTensor

        g = DTensor.from_local(g, p.device_mesh, p.placements)
    return _full(g)


def _grad_error(named, ref: dict) -> tuple[float, int]:
    err, count = 0.0, 0
    for name, p in named:
        if p.grad is not None:
            err = max(err, (_whole_grad(p) - ref[_clean(name)]).abs().max().item())
            count += 1
    return err, count


def _step(plan, ids) -> dict:
    """One training step with the exported plan on this rank: its loss (None off the last stage) and gradients."""
    import torch

    mesh = plan.build_mesh("cpu")
    inputs = plan.shard_inputs(mesh, input_ids=ids, labels=ids)
    if plan.MESH[0][1] > 1:  # pp
        stages, schedule = plan.pipeline(tiny_llama(), mesh, loss_fn, torch.device("cpu"))
        first = stages[0].stage_index == 0
        x, y = inputs["input_ids"], inputs["labels"]
        losses = schedule.run(x, labels=y) if first else schedule.run(labels=y)
        named = [(k, p) for st in stages for k, p in st.submodule.model.named_parameters()]
        last = any(st.is_last_stage for st in stages)
        loss = sum(float(_full(v).detach()) for v in losses) if last else None
    else:
        model = plan.parallelize(tiny_llama(), mesh)
        out = model(**inputs)
        local = out.loss.to_local() if hasattr(out.loss, "to_local") else out.loss
        local.backward()
        total = local.detach().clone()
        torch.distributed.all_reduce(total)  # the mean over ranks: each data-parallel rank's loss is its slice's
        loss, named = total.item() / WORLD, list(model.named_parameters())
    err, n = _grad_error(named, REF["grads"])
    return {"loss": loss, "grad_err": err, "grads": n, "batch": int(_full_shape(inputs["labels"])[0])}


def _full_shape(t):
    """The rows this rank's inputs hold (a DTensor input's local part)."""
    return t.to_local().shape if hasattr(t, "to_local") else t.shape


def _worker(rank: int, init: str, path: str, out: str) -> None:
    import importlib.util

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD, timeout=timedelta(seconds=90))
    try:
        spec = importlib.util.spec_from_file_location("plan", path)
        plan = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(plan)
        ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
        res = _step(plan, ids)
    except Exception as e:  # reported per scenario, with where it failed
        res = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300],
               "where": _where(traceback.extract_tb(e.__traceback__))}
    Path(out).write_text(json.dumps(res))


def _where(frames) -> str:
    """Where it failed (file:line function): the innermost frame in hyper-parallel (else the innermost one), and
    the frame of the model or of this check that called into it."""
    frames = list(frames)
    inside = [k for k, f in enumerate(frames) if _PACKAGE in f.filename]
    k = inside[-1] if inside else len(frames) - 1
    failed = frames[k]
    while k > 0 and _PACKAGE in frames[k - 1].filename:
        k -= 1
    return " <- ".join(_frame(f) for f in [failed] + (frames[k - 1:k] if k > 0 else []))


_PACKAGE = "/hyper_parallel/"  # a frame of the checkout's package (this file's name has hyper_parallel in it too)


def _frame(f) -> str:
    name = f.filename.split(_PACKAGE, 1)[-1] if _PACKAGE in f.filename else Path(f.filename).name
    return f"{name}:{f.lineno} {f.name}"


REF: dict = {}


def reference() -> dict:
    import torch

    model = tiny_llama()
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    return {"loss": out.loss.item(), "grads": {n: p.grad.clone() for n, p in model.named_parameters()}}


def run_scenario(name: str, folder: Path) -> dict:
    """Declare, export and run one scenario on WORLD forked processes; its per-rank results."""
    strategy, edit, _ = SCENARIOS[name]
    doc = declare("llama3-8b", cluster="dgx-a100", devices=WORLD, global_batch=BATCH, seq_len=SEQ, dtype="fp32",
                  overrides=TINY, **strategy)
    doc = megatron(doc) if edit else doc
    path = folder / f"{name}.py"
    export_to_file(doc, "hyper-parallel", str(path))
    outs = [folder / f"{name}.rank{r}.json" for r in range(WORLD)]
    init = f"file://{folder}/{name}.rendezvous"  # forked: torch, transformers and hyper_parallel already imported
    run_forked(_worker, [(r, init, str(path), str(outs[r])) for r in range(WORLD)], 150)
    return [json.loads(o.read_text()) if o.exists() else {"error": "timed out or died", "where": "-"} for o in outs]


def verdict(rows: list[dict]) -> str:
    """One line: ok / failed, the loss difference (last stages), the largest gradient difference."""
    errors = [r for r in rows if "error" in r]
    if errors:
        first = errors[0]
        return f"failed  {first['error']}  [at {first['where']}; {len(errors)} of {len(rows)} ranks]"
    losses = [r["loss"] for r in rows if r["loss"] is not None]
    loss_diff = abs(sum(losses) / len(losses) - REF["loss"])
    grad = max(r["grad_err"] for r in rows)
    ok = loss_diff <= TOLERANCE["loss"] * REF["loss"] and grad <= TOLERANCE["grad"] and min(r["grads"] for r in rows)
    rows_per_rank = sorted({r["batch"] for r in rows})
    return (f"{'ok' if ok else 'failed'}  loss diff {loss_diff:.2e}  max grad diff {grad:.2e}  "
            f"(a rank's batch: {'/'.join(map(str, rows_per_rank))} of {BATCH})")


def commit_of(source: Path, given: str | None) -> str:
    if given:
        return given
    run = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True)
    return run.stdout.strip() if run.returncode == 0 else "unknown (pass --commit)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="a hyper-parallel checkout: the folder holding hyper_parallel/")
    parser.add_argument("--commit", help="the source's commit, when the folder is no git work tree")
    parser.add_argument("--only", nargs="*", choices=sorted(SCENARIOS), help="run only these scenarios")
    args = parser.parse_args()
    if not (args.source / "hyper_parallel" / "__init__.py").exists():
        parser.error(f"{args.source} holds no hyper_parallel/ package")
    os.environ["HYPER_PARALLEL_PLATFORM"] = "torch"
    sys.path.insert(0, str(args.source.resolve()))
    import hyper_parallel  # noqa: F401  (imported before forking, with the platform set)

    REF.update(reference())
    print(f"hyper-parallel {commit_of(args.source, args.commit)} from {args.source}")
    print(f"tiny Llama ({LAYERS} layers), {WORLD} gloo processes on the CPU, single-process loss {REF['loss']:.6f}")
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only or SCENARIOS:
            line = verdict(run_scenario(name, Path(tmp)))
            failed += not line.startswith("ok")
            print(f"{name:28s} {line}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
