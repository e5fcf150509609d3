"""The torchtitan export: its own ConfigManager (torchtitan 0.2.2 from PyPI) parses the job file into a JobConfig
whose degrees, batch, pipeline chunks and checkpointing are the plan's; its ParallelDims accepts the degrees
for the plan's devices; the schedule is one torch's pipelining knows."""

from __future__ import annotations

import importlib.util
import sys
import types
import typing

import pytest

from launch_plans import PLANS, REFUSES, WRITES, plan
from planner.costing.execution import load_execution
from planner.errors import InvalidInput
from planner.hypershard import strategy_of
from planner.hypershard.backends import export, launch_config


def torchtitan(module: str):
    """A torchtitan submodule, imported without running torchtitan/__init__.py, which registers its float8 and MX
    converters by importing its MoE kernels (triton, a CUDA package not installed here); the config and
    parallel-dims modules need none of that."""
    if "torchtitan" not in sys.modules:
        spec = importlib.util.find_spec("torchtitan")
        if spec is None:
            pytest.skip("torchtitan is not installed")
        pkg = types.ModuleType("torchtitan")
        pkg.__path__ = list(spec.submodule_search_locations)
        sys.modules["torchtitan"] = pkg
    return importlib.import_module(f"torchtitan.{module}")


@pytest.mark.launch
@pytest.mark.parametrize("name", WRITES["torchtitan"])
def test_torchtitans_config_manager_reads_the_plan(name, tmp_path):
    doc = plan(name)
    path = tmp_path / "job.toml"
    path.write_text(export(doc, "torchtitan"))
    job = torchtitan("config").ConfigManager().parse_args(["--job.config_file", str(path)])
    s = strategy_of(doc)
    p = job.parallelism
    assert (p.tensor_parallel_degree, p.pipeline_parallel_degree, p.context_parallel_degree) == (s.tp, s.pp, s.cp)
    assert p.data_parallel_shard_degree * p.data_parallel_replicate_degree == s.dp
    assert (p.data_parallel_shard_degree > 1) == (s.zero > 0 and s.dp > 1)
    dims = torchtitan("distributed.parallel_dims").ParallelDims(
        dp_replicate=p.data_parallel_replicate_degree, dp_shard=p.data_parallel_shard_degree, cp=p.context_parallel_degree,
        tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree, ep=p.expert_parallel_degree,
        etp=p.expert_tensor_parallel_degree, world_size=doc["cluster"]["devices"])
    assert (dims.ep, dims.etp) == ((s.ep, s.expert_tp) if "moe" in name else (1, 1))
    # the flex dispatcher the stack costs goes out as torchtitan's DeepEP backend, which its parallelize takes only
    # with ep > 1 and etp 1 (models/*/infra/parallelize.py); its value is one JobConfig's Literal names
    dispatcher = load_execution(doc["workload"]["stack"]).moe_dispatcher
    flex = "moe" in name and s.ep > 1 and s.expert_tp == 1 and dispatcher == "deepep"
    assert p.expert_parallel_comm_backend == ("deepep" if flex else "standard")
    hint = typing.get_type_hints(torchtitan("config.job_config").Parallelism)["expert_parallel_comm_backend"]
    assert p.expert_parallel_comm_backend in typing.get_args(hint)
    t = job.training
    assert (t.global_batch_size, t.seq_len) == (doc["workload"]["global_batch"], doc["workload"]["seq_len"])
    micro = doc["programs"][0]["micro_batches"]
    if s.pp > 1:  # a schedule's batch, cut into the pipeline's micro-batches; train.py's gradient-accumulation
        # steps, global // (local x dp), are the plan's schedules per step
        assert t.global_batch_size // (t.local_batch_size * s.dp) == s.flushes
        assert t.local_batch_size // p.pipeline_parallel_microbatch_size * s.flushes == micro
        from torch.distributed.pipelining.schedules import get_schedule_class

        assert get_schedule_class(p.pipeline_parallel_schedule)  # torch's own name for it
        chunks = [len(c["layers"]) for st in doc["programs"][0]["stages"] for c in sorted(st["chunks"], key=lambda c: c["chunk"])]
        parts = p.module_fqns_per_model_part
        by_chunk = sorted((c["chunk"], len(c["layers"])) for st in doc["programs"][0]["stages"] for c in st["chunks"])
        assert [sum(m.startswith("layers.") for m in part) for part in parts] == [n for _, n in by_chunk]
        assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "output"] and len(parts) == len(chunks)
    else:  # the micro-batch; gradient accumulation makes up the rest
        assert t.global_batch_size // (t.local_batch_size * s.dp) == micro
    mode = {"none": "none", "full": "full", "selective": "selective"}[s.recompute]
    assert job.activation_checkpoint.mode == mode
    if mode == "selective":
        assert job.activation_checkpoint.selective_ac_option == "op"
    if doc["workload"]["dtype"] == "fp8":
        assert job.model.converters == ["quantize.linear.float8"]
        assert job.quantize.linear.float8.recipe_name == "tensorwise"
    assert t.enable_cpu_offload == (s.offload_fraction("params") == 1.0)


@pytest.mark.parametrize("name, words", list(REFUSES["torchtitan"].items()))
def test_what_torchtitan_cannot_run_is_refused_in_one_sentence(name, words):
    with pytest.raises(InvalidInput, match="the torchtitan backend cannot express this plan's") as err:
        export(plan(name), "torchtitan")
    assert words in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("name", ["tt_layout", "tt_fp8"])
def test_the_json_is_the_toml(name):
    import tomllib

    doc = plan(name)
    assert launch_config(doc, "torchtitan")["config"] == tomllib.loads(export(doc, "torchtitan"))


def test_chunks_are_named_as_torchtitans_own_split_names_them():
    """Equal chunks come out as torchtitan's generate_llm_fqn_per_model_part makes them (run from its v0.2.2
    source into tests/data/torchtitan_source.json), and its LLMs all have those modules."""
    import json
    from dataclasses import replace
    from pathlib import Path

    from planner.hypershard.backends import launch
    from planner.hypershard.backends.torchtitan import _fqns

    pinned = json.loads((Path(__file__).parent / "data" / "torchtitan_source.json").read_text())
    t = launch.training(plan("tt_3d"), "torchtitan")
    for key, want in pinned["equal_splits"].items():
        parts, layers = (int(w) for w in key.replace(",", "").split()[::2])
        assert _fqns(replace(t, chunks=(layers // parts,) * parts)) == want, key
    for modules in pinned["model_modules"].values():
        assert modules == ["layers", "norm", "output", "tok_embeddings"]


def test_deepep_beside_expert_tensor_parallelism_is_said_to_run_slower():
    """torchtitan 0.2.2 raises NotImplementedError for DeepEP with etp > 1: such a plan goes out on its standard
    all-to-all, and the launch config says the exchange runs slower than scored; with etp 1 it says nothing."""
    etp2, etp1 = launch_config(plan("moe"), "torchtitan"), launch_config(plan("moe_etp1"), "torchtitan")
    assert strategy_of(plan("moe")).expert_tp > 1
    assert "expert_parallel_comm_backend" not in etp2["config"]["parallelism"]
    assert any("flex dispatcher" in n and "takes longer than the estimate scored" in n for n in etp2["notes"])
    assert not any("flex dispatcher" in n for n in etp1["notes"])


def test_deepep_on_an_nvlink_domain_over_nodes_goes_out_as_the_all_to_all():
    """GB200 NVL72 (one NVLink domain over 18 trays): DeepEP does not run there (Megatron-Bridge refuses it on those
    GPUs), and torchtitan 0.2.2 has no HybridEP backend: the plan goes out on its standard all-to-all, and the launch
    config says the exchange runs slower than scored."""
    from launch_plans import COMMON, MOE
    from planner.hypershard import declare

    doc = declare("mixtral-8x7b", overrides=MOE, **dict(COMMON, cluster="gb200-nvl72"), tp=2, ep=8, etp=1, zero=1,
                  sp=True)
    out = launch_config(doc, "torchtitan")
    assert "expert_parallel_comm_backend" not in out["config"]["parallelism"]
    assert any("NVLink domain of 72 devices over several nodes DeepEP does not run" in n
               and "takes longer than the estimate scored" in n for n in out["notes"])


@pytest.mark.launch
def test_fewer_micro_batches_than_stages_go_out_as_gpipe():
    """One micro-batch for two stages (QA of 2026-12-07): the TOML had asked for 1F1B, which torch's Schedule1F1B
    refuses ('Number of microbatches (1) must be greater than or equal to the number of stages (2)')."""
    from torch.distributed.pipelining import schedules

    cfg = launch_config(plan("tt_few"), "torchtitan")["config"]
    par, training = cfg["parallelism"], cfg["training"]
    assert training["local_batch_size"] // par["pipeline_parallel_microbatch_size"] < par["pipeline_parallel_degree"]
    assert par["pipeline_parallel_schedule"] == "GPipe"
    assert schedules.get_schedule_class("GPipe") is schedules.ScheduleGPipe  # a name torchtitan's builder resolves
    assert launch_config(plan("tt_3d"), "torchtitan")["config"]["parallelism"]["pipeline_parallel_schedule"] == "1F1B"

