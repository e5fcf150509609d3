"""The JAX export used for a real training step: ZeRO-3 shardings, the declared recompute and micro-batches.

A tiny Llama declaration (tp 2 x dp 4, ZeRO-3, full recompute, two micro-batches per replica) is exported;
on 8 host devices a jitted step places the parameters with `shard_params` and the batch's rows over dp with
`activation_spec`, runs each layer under `remat`, accumulates the gradient over `micro_batches`, and keeps
Adam's first moment under `optimizer_spec`. Its loss and gradients equal those of the whole batch on one
device, and the arrays really are
split as the plan says (each device holds 1/8 of a ZeRO-3 tensor-parallel weight).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from planner.hypershard import declare
from planner.hypershard.backends import export_to_file

pytestmark = [pytest.mark.jax, pytest.mark.skipif(importlib.util.find_spec("jax") is None,
                                                  reason="jax is not installed")]

TINY = dict(layers=2, hidden=64, heads=4, kv_heads=4, vocab=128, ffn=128)

STEP = r'''
import os, json, importlib.util
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding
jax.config.update("jax_enable_x64", False)
spec = importlib.util.spec_from_file_location("plan", PLAN)
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
rng = np.random.default_rng(0)
names = {"model.embed_tokens.weight": (128, 64), "lm_head.weight": (128, 64)}
for i in range(2):
    names[f"model.layers.{i}.self_attn.q_proj.weight"] = (64, 64)
    names[f"model.layers.{i}.self_attn.o_proj.weight"] = (64, 64)
params = {n: (0.1 * rng.standard_normal(s)).astype(np.float32) for n, s in names.items()}
ids = rng.integers(0, 128, (16, 8))  # the global batch: 4 data-parallel replicas of 4 sequences

def layer(q, o, x):
    return x + jnp.tanh(x @ q.T) @ o.T

def loss_of(p, batch, wrap):
    x = p["model.embed_tokens.weight"][batch]
    for i in range(2):
        x = wrap(layer)(p[f"model.layers.{i}.self_attn.q_proj.weight"], p[f"model.layers.{i}.self_attn.o_proj.weight"], x)
    logits = x @ p["lm_head.weight"].T
    return jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, batch[..., None], -1)[..., 0])

def step(p, batch, wrap, split):
    parts = split(batch)
    grads = [jax.grad(loss_of)(p, mb, wrap) for mb in parts]
    losses = [loss_of(p, mb, wrap) for mb in parts]
    return sum(losses) / len(parts), jax.tree_util.tree_map(lambda *g: sum(g) / len(parts), *grads)

ref_loss, ref_grads = jax.jit(lambda p, b: (loss_of(p, b, lambda f: f), jax.grad(loss_of)(p, b, lambda f: f)))(
    params, ids)  # the whole batch at once, on one device
mesh = m.build_mesh()
placed = m.shard_params(params, mesh)
ids = jax.device_put(ids, NamedSharding(mesh, m.activation_spec("input_ids")))  # rows over dp
adam_m = {n: NamedSharding(mesh, m.optimizer_spec(n, s)) for n, s in names.items()}
fn = jax.jit(lambda p, b: step(p, b, m.remat, lambda b: list(m.micro_batches(b))),
             out_shardings=(None, adam_m))
loss, grads = fn(placed, ids)
q = placed["model.layers.0.self_attn.q_proj.weight"]
print(json.dumps({
    "loss": float(loss), "ref_loss": float(ref_loss),
    "grad_err": max(float(jnp.max(jnp.abs(grads[n] - ref_grads[n]))) for n in names),
    "q_shard": list(q.addressable_shards[0].data.shape), "m_shard": list(grads["lm_head.weight"].addressable_shards[0].data.shape),
    "micro": [m.MICRO_BATCHES, m.MICRO_BATCH_SIZE], "recompute": m.RECOMPUTE,
    "ids_shard": list(ids.addressable_shards[0].data.shape),
}))
'''


def test_a_jitted_step_with_the_exported_zero3_recompute_and_micro_batches_matches_one_device(tmp_path):
    doc = declare("llama3-8b", cluster="dgx-a100", devices=8, global_batch=16, seq_len=8, overrides=TINY, tp=2,
                  dp=4, zero=3, recompute="full", micro_batch=2)
    for name, entry in doc["layouts"]["params"].items():  # Megatron's layouts (the planner keeps tiny weights whole)
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            entry.update(dims=[None, "tp"], output_partial=["tp"])
        elif entry["op"] in ("linear", "embedding"):
            entry["dims"] = ["tp", None]
    path = tmp_path / "plan_jax.py"
    export_to_file(doc, "jax", str(path))
    run = subprocess.run([sys.executable, "-c", STEP.replace("PLAN", repr(str(path)))], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout)
    assert got["micro"] == [2, 2] and got["recompute"] == "full" and got["ids_shard"] == [4, 8]  # 4 rows per replica
    assert got["loss"] == pytest.approx(got["ref_loss"], rel=1e-5) and got["grad_err"] < 1e-5
    assert got["q_shard"] == [32, 16]  # rows over tp 2, then columns over dp 4: ZeRO-3
    assert got["m_shard"] == [64, 16]  # lm_head's rows over tp, its first moment's columns over dp (ZeRO >= 1)


def test_the_jax_backend_refuses_what_it_cannot_run_before_writing(tmp_path):
    from planner.errors import InvalidInput

    out = tmp_path / "p.py"
    pp = declare("llama3-8b", cluster="dgx-a100", devices=8, global_batch=16, seq_len=8, overrides=TINY, pp=2, dp=4)
    with pytest.raises(InvalidInput, match="no pipeline runtime"):
        export_to_file(pp, "jax", str(out))
    off = declare("llama3-8b", cluster="dgx-a100", devices=8, global_batch=16, seq_len=8, overrides=TINY, dp=8,
                  zero=3, offload=(("params", 0.5),))
    with pytest.raises(InvalidInput, match="does not offload to host memory"):
        export_to_file(off, "jax", str(out))
    assert not out.exists()
