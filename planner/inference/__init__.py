"""Inference planning: prefill and decode of a served model, costed from its graph on a cluster.

Modules, one idea each (the graph queries they share, weights and routed experts, are `planner.graph.walk`
and `planner.graph.moe`): `kv_cache` (what attention caches per token, MLA's latent included), `profile` (a
graph's serving profile per token), `phase_cost` (one prefill or decode step of a layout: time, limiter,
memory), `search` (the layout and batch per phase under latency targets), `plan` (prefill and decode
device groups, disaggregated or co-located, and the report), `serve` (the entry point from a model name or
file), `sweep` (what-if over device counts), `validation` (published deployments against the estimate),
`deployments` (what a serving plan cites of them: how far off its hardware's came out).
"""
