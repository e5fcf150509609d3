"""The deepspeed export: DeepSpeed's own config classes (deepspeed 0.19.8 from PyPI) read the ds_config: DeepSpeedConfig
with the plan's data-parallel size (its batch assertion: train_batch = micro x accumulation x ranks), its ZeRO
stage and offload models, AutoTP's size and AutoEP's validation for the plan's devices."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from launch_plans import REFUSES, WRITES, plan
from planner.costing.execution import load_execution
from planner.errors import InvalidInput
from planner.hypershard import strategy_of
from planner.hypershard.backends import export, launch_config

#: Runs DeepSpeedConfig in a process of its own: it asks torch.distributed for the world, so this process makes a
#: one-rank gloo group (met at a file, not a probed TCP port another process may take first), and the data-parallel
#: size comes from an mpu (DeepSpeed's hook for Megatron-style groups).
_READ = r'''
import json, os, sys
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
import deepspeed
from deepspeed.runtime.config import DeepSpeedConfig
from deepspeed.module_inject.auto_ep_config import validate_autoep_config
deepspeed.init_distributed(dist_backend="gloo", init_method=f"file://{sys.argv[1]}", rank=0, world_size=1,
                           auto_mpi_discovery=False)
out = []
for case in json.loads(sys.stdin.read()):
    class Mpu:
        def get_data_parallel_world_size(self):
            return case["dp"]
    c = DeepSpeedConfig(case["config"], mpu=Mpu())
    z = c.zero_config
    ep = c.expert_parallel_config
    if ep.enabled:
        validate_autoep_config(ep, case["devices"], 1, max(c.tensor_parallel_config.autotp_size, 1), 1,
                               zero_stage=c.zero_optimization_stage)
    out.append(dict(batch=[c.train_batch_size, c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps],
                    stage=int(c.zero_optimization_stage), bf16=c.bfloat16_config.enabled,
                    offload_optimizer=None if z.offload_optimizer is None else [str(getattr(z.offload_optimizer.device, "value", z.offload_optimizer.device)),
                                                                                z.offload_optimizer.ratio],
                    offload_param=None if z.offload_param is None else str(getattr(z.offload_param.device, "value", z.offload_param.device)),
                    cpu_checkpointing=c.activation_checkpointing_config.cpu_checkpointing,
                    autotp=c.tensor_parallel_config.autotp_size, autoep=ep.autoep_size if ep.enabled else 1,
                    comm=[ep.comm_backend, ep.comm_max_tokens_per_rank] if ep.enabled else None))
print(json.dumps(out))
'''


@pytest.mark.launch
def test_deepspeeds_config_reads_the_plans(tmp_path):
    pytest.importorskip("deepspeed")
    docs = [plan(n) for n in WRITES["deepspeed"]]
    cases = []
    for doc in docs:
        s = strategy_of(doc)
        cases.append({"config": launch_config(doc, "deepspeed")["config"], "dp": s.dp, "devices": s.devices})
    run = subprocess.run([sys.executable, "-c", _READ, str(tmp_path / "rendezvous")], input=json.dumps(cases),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    for doc, got in zip(docs, json.loads(run.stdout.strip().splitlines()[-1])):
        s = strategy_of(doc)
        micro = doc["programs"][0]["micro_batches"]
        assert got["batch"] == [doc["workload"]["global_batch"], s.micro_batch, micro]
        assert got["stage"] == s.zero and got["bf16"] == (doc["workload"]["dtype"] == "bf16")
        opt = s.offload_fraction("optimizer")
        assert got["offload_optimizer"] == (["cpu", opt] if opt else None)
        assert got["offload_param"] == ("cpu" if s.offload_fraction("params") else None)
        assert got["cpu_checkpointing"] == (s.offload_fraction("activations") == 1.0)
        assert (got["autotp"] or 1, got["autoep"]) == (s.tp, s.ep)
        if s.ep > 1:  # the stack's flex dispatcher goes out as AutoEP's DeepEP transport, sized for a micro-batch,
            # where DeepEP runs (not on an NVLink domain over several nodes: launch.deepep_refused)
            flex = load_execution(doc["workload"]["stack"]).moe_dispatcher == "deepep" and doc["cluster"]["name"] != \
                "gb200-nvl72"
            assert got["comm"] == (["deepep", s.micro_batch * doc["workload"]["seq_len"]] if flex else ["comm", 0])


@pytest.mark.parametrize("name, words", list(REFUSES["deepspeed"].items()))
def test_what_deepspeed_cannot_run_is_refused_in_one_sentence(name, words):
    with pytest.raises(InvalidInput, match="the deepspeed backend cannot express this plan's") as err:
        export(plan(name), "deepspeed")
    assert words in str(err.value) and "\n" not in str(err.value)


def test_the_file_is_the_config():
    doc = plan("ds_offload3")
    assert json.loads(export(doc, "deepspeed")) == launch_config(doc, "deepspeed")["config"]


def test_deepep_on_an_nvlink_domain_over_nodes_goes_out_as_autoeps_own_exchange():
    """GB200 NVL72: AutoEP keeps its own all-to-all ("comm", which DeepSpeedConfig reads above), and the notes say
    the exchange runs slower than scored; on DGX H100 the same plan names DeepEP and says nothing of it."""
    nvl, dgx = launch_config(plan("ds_moe_nvl72"), "deepspeed"), launch_config(plan("ds_moe"), "deepspeed")
    assert "comm_backend" not in nvl["config"]["expert_parallel"]
    assert any("DeepEP does not run" in n and "takes longer than the estimate scored" in n for n in nvl["notes"])
    assert dgx["config"]["expert_parallel"]["comm_backend"] == "deepep"
    assert not any("DeepEP does not run" in n for n in dgx["notes"])
