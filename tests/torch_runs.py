"""Exported torch plans run for real: declared, written, validated and exported, then applied to a fresh
Hugging Face model in every process of one gloo group on the CPU, each plan's loss and gradients recorded
against the single-process run's. Shared by tests/test_hypershard_torch.py (a tiny Llama) and
tests/test_torch_experts.py (a tiny Mixtral) and tests/test_torch_renamed_experts.py (a Qwen3-MoE's ONNX export)."""

from __future__ import annotations

import importlib.util
import json
import os
import traceback
from typing import Any, Callable, Mapping

from planner.hypershard import declare, read_document, write_document
from planner.hypershard.backends import export_to_file
from planner.hypershard.validate import validate_document
from tests.forked import run_forked
from tests.layout_edits import megatron

#: name -> (strategy, hand-edited to Megatron's layouts (or by this function), run as a pipeline)
Scenarios = Mapping[str, tuple[dict, bool | Callable[[dict], dict], bool]]


def spread_experts(model):
    """`model` with its stacked expert weights drawn at 0.2, so that their outputs and gradients stand well above
    the tolerance."""
    import torch

    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 3:
                p.normal_(0.0, 0.2)
    return model


def tiny_mixtral(vocab: int, experts: int):
    """A seeded two-layer Hugging Face Mixtral of hidden 64 (top-2 of `experts`), its experts spread."""
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    cfg = MixtralConfig(vocab_size=vocab, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=4, num_local_experts=experts,
                        num_experts_per_tok=2, max_position_embeddings=64, use_cache=False,
                        attn_implementation="eager")
    return spread_experts(MixtralForCausalLM(cfg).float())


def clean(name: str) -> str:
    return name.replace("._checkpoint_wrapped_module", "").replace(".module.", ".")


def grad_error(named, ref, ep_rank: int) -> tuple[float, int, int]:
    """Max |grad - reference| over the parameters with a gradient; a stacked expert weight's gradient is
    compared with its ep rank's slice of the reference. Also how many experts this rank holds (0: none)."""
    err, count, local = 0.0, 0, 0
    for n, p in named:
        if p.grad is None:
            continue
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        want = ref[clean(n)]
        if want.dim() == 3:
            local = g.shape[0]
            want = want[ep_rank * local:(ep_rank + 1) * local]
        err = max(err, (g - want).abs().max().item())
        count += 1
    return err, count, local


def _describe(model) -> dict:
    """A Llama-style model's first query weight (its placements and local shape) and first layer's wrapper."""
    q = next((p for n, p in model.named_parameters() if clean(n).endswith("layers.0.self_attn.q_proj.weight")), None)
    layer = next((m for n, m in model.named_modules() if n.endswith("layers.0")), None)
    if q is None or layer is None:
        return {}
    local = q.to_local() if hasattr(q, "to_local") else q
    return {"q_placements": str(getattr(q, "placements", "plain")), "q_local": list(local.shape),
            "layer0": type(layer).__name__}


def loss_fn(logits, target):
    import torch

    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                             target[:, 1:].reshape(-1))


def _run(plan, build: Callable, ids, ref, pipelined: bool, world: int) -> dict:
    import torch
    import torch.distributed as dist

    if hasattr(plan, "use_program"):  # stages of different widths: each an entry of its own
        plan.use_program(dist.get_rank())
    mesh = plan.build_mesh("cpu")
    ep_rank = mesh["ep"].get_local_rank() if getattr(plan, "EXPERT_PARALLEL", 1) > 1 else 0
    index, count = plan.batch_shard(mesh)
    x = ids.chunk(count)[index]
    if pipelined:
        stages, schedule = plan.pipeline_schedule(build(), mesh, torch.device("cpu"), loss_fn)
        losses: list = []
        if stages[0].is_first:
            schedule.step(x)
        else:
            schedule.step(target=x, losses=losses)
        err, n, local = grad_error([(k, p) for st in stages for k, p in st.submod.model.named_parameters()], ref,
                                   ep_rank)
        sharded = any("Shard" in str(getattr(p, "placements", "")) for st in stages for p in st.submod.parameters())
        return {"loss": sum(v.item() for v in losses) / len(losses) if losses else None, "grad_err": err,
                "grads": n, "local_experts": local, "last": not stages[0].is_first, "tp_sharded": sharded}
    model = plan.parallelize(build(), mesh)
    o = model(input_ids=x, labels=x)
    o.loss.backward()
    loss = o.loss.detach().clone()
    dist.all_reduce(loss)
    err, n, local = grad_error(model.named_parameters(), ref, ep_rank)
    return {"loss": loss.item() / world, "grad_err": err, "grads": n, "local_experts": local, **_describe(model)}


def _worker(rank: int, world: int, init: str, folder: str, plans: list, build: Callable, shape: tuple) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    batch, seq, vocab = shape
    ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(1))
    ref_model = build()
    out = ref_model(input_ids=ids, labels=ids)
    out.loss.backward()
    ref = {n: p.grad for n, p in ref_model.named_parameters(remove_duplicate=False)}  # a tied weight by each name
    res: dict[str, Any] = {"ref_loss": out.loss.item()}
    for name, path, pipelined in plans:
        try:
            spec = importlib.util.spec_from_file_location(f"plan_{name}", path)
            plan = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(plan)
            res[name] = _run(plan, build, ids, ref, pipelined, world)
        except Exception:  # recorded and asserted on by the test, with the traceback
            res[name] = {"error": traceback.format_exc()[-3000:]}
    with open(os.path.join(folder, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    dist.destroy_process_group()


def launch(folder, world: int, scenarios: Scenarios, model: str, overrides: dict, build: Callable,
           shape: tuple[int, int, int]) -> list[dict]:
    """Declare, write, validate and export each scenario (zoo `model` with `overrides`; `shape`: batch, seq,
    vocab), then run them all in one group of `world` forked processes, each applying them to `build()`."""
    batch, seq, _ = shape
    plans = []
    for name, (strategy, edit, pipelined) in scenarios.items():
        doc = declare(model, cluster="dgx-a100", devices=world, global_batch=batch, seq_len=seq, dtype="fp32",
                      overrides=overrides, **strategy)
        if callable(edit):
            doc = edit(doc)
        elif edit:
            doc = megatron(doc)
        write_document(doc, str(folder / f"{name}.yaml"))
        doc = read_document(str(folder / f"{name}.yaml"))
        report = validate_document(doc, name)
        assert report.ok, [c for c in report.checks if not c.ok]
        export_to_file(doc, "torch", str(folder / f"{name}.py"))
        plans.append((name, str(folder / f"{name}.py"), pipelined))
    # where the processes meet: a file, not a TCP port (a free port probed here can be taken by another process
    # on a shared machine before rank 0 binds it); the forked children inherit torch and transformers
    init = f"file://{folder}/rendezvous"
    codes = run_forked(_worker, [(r, world, init, str(folder), plans, build, shape) for r in range(world)], 240)
    assert codes == [0] * world, "a worker process failed or timed out"
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(world)]


def ok(runs: list[dict], name: str) -> list[dict]:
    """Every rank's row of one scenario, each checked to have run and matched the reference's gradients."""
    rows = [r[name] for r in runs]
    for row in rows:
        assert "error" not in row, row.get("error")
        assert row["grad_err"] < 1e-5 and row["grads"] > 0
    return rows
