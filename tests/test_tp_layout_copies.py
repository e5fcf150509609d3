"""Sequence parallelism over [batch, seq, hidden] (torchtitan's DTensor plans shard dim 1): torch's functional
collectives copy NCCL's dim-0 buffers once more, and the estimate charges that copy where torch makes it."""

from __future__ import annotations

import pytest

from planner.api import estimate_model
from planner.costing.execution import load_execution


@pytest.mark.torch
def test_torch_copies_a_dim_1_gather_unless_one_sequence_and_always_a_dim_1_scatter():
    """The behaviour `Execution.tp_layout_copies` stands for, run in the installed torch: all_gather_single's
    _maybe_view_chunk_cat returns a view of the dim-0 buffer only when the dims before gather_dim are 1, and
    reduce_scatter_single's _chunk_or_narrow_cat always concatenates into a new buffer."""
    torch = pytest.importorskip("torch")
    from torch.distributed import _functional_collectives as fc

    group, seq, hidden = 4, 8, 16
    for batch in (1, 3):  # NCCL's all-gather output: the ranks' [batch, seq/group, hidden] shards stacked on dim 0
        gathered = torch.randn(group * batch, seq // group, hidden)
        out = fc._maybe_view_chunk_cat(gathered, group, 1)
        assert out.shape == (batch, seq, hidden)
        shares = out.untyped_storage().data_ptr() == gathered.untyped_storage().data_ptr()
        assert shares == (batch == 1)  # a view for one sequence, a copy for several
    inp = torch.randn(1, seq, hidden)
    scattered = fc._chunk_or_narrow_cat(inp, group, narrow_dim=1, cat_dim=0)
    assert scattered.shape == (group, seq // group, hidden)
    assert scattered.untyped_storage().data_ptr() != inp.untyped_storage().data_ptr()
    # async TP's fused ops take a dim-1 gather or scatter as views moved to the front, not as a cat
    import inspect

    from torch.distributed import _symmetric_memory as symm

    for fused in (symm._fused_all_gather_matmul_impl, symm._fused_matmul_reduce_scatter_impl):
        src = inspect.getsource(fused)
        assert "movedim" in src and "torch.cat" not in src


def _step(tmp_path, micro_batch: int, copies: bool, async_tp: bool = False) -> float:
    """A two-layer Llama 3 8B's step; its vocabulary cut to 8,192, so that the embedding's layout (which the
    program picks differently with and without the copies at the full vocabulary, 0.05 % apart) stays small."""
    stack = tmp_path / f"tt{int(copies)}{int(async_tp)}.toml"
    stack.write_text(f'[stack]\nbase = "torchtitan"\n[kernels]\ntp_layout_copies = {str(copies).lower()}\n'
                     f'[overlap]\noverlap_tp_comm = {str(async_tp).lower()}\n', encoding="utf-8")
    return estimate_model("llama3-8b", cluster="dgx-h100", devices=8, global_batch=8 * micro_batch, seq_len=4096,
                          tp=8, sp=True, micro_batch=micro_batch, overrides=dict(layers=2, vocab=8192),
                          stack=str(stack))["step_time_s"]


def test_the_copies_cost_what_torch_copies(tmp_path):
    """With one sequence per micro-batch only the reduce-scatters copy; with two the all-gathers copy too, so the
    copies cost several times more per sequence (Megatron-Core's [seq, batch, hidden] gathers dim 0: none)."""
    assert load_execution("torchtitan").tp_layout_copies and not load_execution("megatron-core").tp_layout_copies
    one = _step(tmp_path, 1, True) - _step(tmp_path, 1, False)
    two = _step(tmp_path, 2, True) - _step(tmp_path, 2, False)
    assert one > 0
    assert two / 2 > 3 * one
    # async TP: the fused kernels copy nothing
    assert _step(tmp_path, 2, True, async_tp=True) == _step(tmp_path, 2, False, async_tp=True)
