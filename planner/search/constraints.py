"""What the user fixes of a plan: the knobs given are taken as they are, the search chooses the rest.

Users start from the layout they run today and ask what to change: `hyperplan plan ... --tp 8 --pp 8` keeps
those two degrees and searches data and context parallelism, micro-batch, recompute, ZeRO and offload around
them. With every knob fixed the plan is the estimate of that one strategy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping

from planner.errors import InvalidInput
from planner.costing.stack_choices import FULL_LAYERS_BESIDE, SELECTIVE
from planner.strategy import OFFLOAD_CLASSES, RECOMPUTE_POLICIES, Strategy

_DEGREES = ("tp", "pp", "cp", "ep", "etp", "vpp", "dp", "micro_batch", "moe_tp", "moe_etp", "moe_cp", "moe_ep_tp",
            "inout_tp")


@dataclass(frozen=True, slots=True, kw_only=True)
class Constraints:
    """Knobs fixed by the user; None means searched. `offload` fixes the fractions moved off HBM per memory
    class (() = nothing offloaded, like --no-offload); None lets the search choose them."""

    tp: int | None = None
    pp: int | None = None
    cp: int | None = None
    ep: int | None = None
    etp: int | None = None
    vpp: int | None = None
    dp: int | None = None
    micro_batch: int | None = None
    recompute: str | None = None
    zero: int | None = None
    stage_tp: tuple[int, ...] | None = None
    offload: tuple[tuple[str, float], ...] | None = None
    #: False: a layer in every pipeline chunk (a backend whose format cannot put the embedding or the head alone
    #: in the first or last chunk); None lets the search cut so (Megatron-Core's accounted split).
    ends_alone: bool | None = None
    #: Limits on one kind of model, vacuous for others (a backend's: see PLAN_LIMITS in hypershard/backends).
    #: A model with routed experts: its tensor degree, expert tensor degree and context degree, and its expert
    #: degree wherever tp > 1 (torch runs a MoE block on each tensor rank's tokens with its experts whole, and
    #: expert parallelism over data-parallel ranks only: backends/torch_moe_tp.py, torch_experts.py).
    moe_tp: int | None = None
    moe_etp: int | None = None
    moe_cp: int | None = None
    moe_ep_tp: int | None = None
    #: A model with a linear weight stored [in, out] (GPT-2's Conv1D): its tensor degree (torch's parallel
    #: styles split nn.Linear's [out, in] only).
    inout_tp: int | None = None
    #: What the launch framework runs, beside what the stack does (a backend's: PLAN_LIMITS): its recompute policies,
    #: what a chunk's other layers run beside full recompute of its first k ("off": no such mix), and whether its
    #: tensor parallelism runs with sequence parallelism. A plan takes what both the stack and these allow.
    recompute_policies: tuple[str, ...] | None = None
    full_layers_beside: str | None = None
    sequence_parallel: bool | None = None
    stage_widths: bool | None = None  # False: every pipeline stage of one tensor width (no launch config has more)
    ddp_alone: bool | None = None  # True: unsharded data parallelism only without tp, pp or cp (torchtitan's DDP)
    selective: str | None = None  # what the launch framework's selective recompute is (`Execution.selective`)
    #: Where the launch framework offloads (a backend's: PLAN_LIMITS): per memory class, a condition of
    #: OFFLOAD_WHEN; a class it does not name is never offloaded. None: wherever the stack offloads.
    offload_when: tuple[tuple[str, str], ...] | None = None

    def __post_init__(self) -> None:
        for name in _DEGREES:
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise InvalidInput(f"--{name.replace('_', '-')} must be a positive integer, got {v!r}")
        if self.recompute is not None and self.recompute not in RECOMPUTE_POLICIES:
            raise InvalidInput(f"--recompute must be one of {', '.join(RECOMPUTE_POLICIES)}, got {self.recompute!r}")
        if self.recompute_policies is not None and not set(self.recompute_policies) <= set(RECOMPUTE_POLICIES):
            raise InvalidInput(f"recompute_policies must be some of {', '.join(RECOMPUTE_POLICIES)}, got "
                               f"{list(self.recompute_policies)}")
        if self.selective not in (None, *SELECTIVE):
            raise InvalidInput(f"selective must be one of {', '.join(SELECTIVE)}, got {self.selective!r}")
        if self.full_layers_beside not in (None, *FULL_LAYERS_BESIDE):
            raise InvalidInput(f"full_layers_beside must be one of {', '.join(FULL_LAYERS_BESIDE)}, got "
                               f"{self.full_layers_beside!r}")
        if self.zero is not None and self.zero not in (0, 1, 2, 3):
            raise InvalidInput(f"--zero must be 0, 1, 2 or 3, got {self.zero!r}")
        if self.stage_tp is not None:
            if len(self.stage_tp) < 2 or min(self.stage_tp) < 1:
                raise InvalidInput(f"--stage-tp {list(self.stage_tp)}: give a positive tensor degree for each of "
                                   "two or more pipeline stages")
            if self.pp is not None and self.pp != len(self.stage_tp):
                raise InvalidInput(f"--stage-tp gives {len(self.stage_tp)} stages, but --pp is {self.pp}")
            if self.tp is not None and self.tp != max(self.stage_tp):
                raise InvalidInput(f"--tp {self.tp} with --stage-tp {list(self.stage_tp)}: tp is then the widest "
                                   f"stage's degree, {max(self.stage_tp)}")
            if self.vpp not in (None, 1):
                raise InvalidInput("stages with different device counts (--stage-tp) need --vpp 1")
        if self.ends_alone is not None and not isinstance(self.ends_alone, bool):
            raise InvalidInput(f"constraint ends_alone must be true or false, got {self.ends_alone!r}")
        for cls, frac in self.offload or ():
            if cls not in OFFLOAD_CLASSES:
                raise InvalidInput(f"unknown offload class {cls!r}; use one of {', '.join(OFFLOAD_CLASSES)}")
            if not 0.0 <= frac <= 1.0:
                raise InvalidInput(f"offload fraction of {cls} must be within 0..1, got {frac}")
        for cls, when in self.offload_when or ():
            if cls not in OFFLOAD_CLASSES or when not in OFFLOAD_WHEN:
                raise InvalidInput(f"offload_when {cls}: {when} names no memory class and condition; use classes "
                                   f"of {', '.join(OFFLOAD_CLASSES)} with one of {', '.join(OFFLOAD_WHEN)}")
        if self.offload and self.offload_when is not None:
            runs = dict(self.offload_when)
            if refused := [cls for cls, _ in self.offload if cls not in runs]:
                can = " and ".join(runs) or "nothing"
                raise InvalidInput(f"--offload {refused[0]}: the launch framework offloads {can} only; drop it from "
                                   "--offload, or export with another backend")

    def recompute_runs(self, execution) -> tuple[str, ...]:
        """The recompute policies both the stack's framework and the launch framework run."""
        return tuple(r for r in execution.recompute_policies
                     if (self.recompute_policies is None or r in self.recompute_policies)
                     and (r != "selective" or self.selective in (None, execution.selective)))

    def beside_full_layers(self, execution) -> str:
        """What a chunk's other layers run beside full recompute of its first k, where both frameworks agree."""
        agree = self.full_layers_beside in (None, execution.full_layers_beside)
        return execution.full_layers_beside if agree and execution.full_layers_beside in self.recompute_runs(
            execution) else "off"

    def sequence_parallel_runs(self, execution) -> bool:
        """Whether tensor parallelism runs with sequence parallelism on both frameworks."""
        return execution.sequence_parallel and self.sequence_parallel is not False

    def offload_refused(self, s: Strategy, execution, *, fp8: bool, layers: int) -> str:
        """Why the launch framework does not offload what `s` does (`offload_when`), or "" where it does; `fp8`:
        FP8 GEMMs; `layers`: the model's decoder layers (multi-token-prediction ones left out)."""
        when = dict(self.offload_when or ())
        for cls, frac in s.offload if self.offload_when is not None else ():
            if frac <= 0:
                continue
            if cls not in when:
                return f"the launch framework offloads no {cls}"
            if not OFFLOAD_WHEN[when[cls]](s, execution, fp8, layers, frac):
                return f"the launch framework offloads {cls} {OFFLOAD_WHY[when[cls]]}"
        return ""

    def zero_allowed(self, zero: int, dp: int, model_parallel: int) -> bool:
        """Whether a ZeRO level keeps the launch framework's limits (`ddp_alone`) at these degrees."""
        return not (self.ddp_alone and zero == 0 and dp > 1 and model_parallel > 1)

    def check_stack(self, execution, training: bool) -> None:
        """Refuse a --recompute the stack's framework, or the launch framework, cannot run."""
        runs = self.recompute_runs(execution)
        if training and self.recompute is not None and self.recompute not in runs:
            whose = f"the {execution.name} stack" + (" with this backend" if runs != execution.recompute_policies
                                                     else "")
            raise InvalidInput(f"{whose} cannot run {self.recompute} recompute (it runs {', '.join(runs)}); give "
                               f"--recompute {' or '.join(runs)}, or plan with another --stack")

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any] | None) -> "Constraints":
        """From a plan file's `constraints:` section or keyword arguments; unknown keys are refused."""
        d = dict(d or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise InvalidInput(f"unknown constraint {unknown[0]!r}; use any of {', '.join(sorted(known))}")
        if d.get("stage_tp") is not None:
            d["stage_tp"] = tuple(int(x) for x in d["stage_tp"])
            d.setdefault("pp", len(d["stage_tp"]))
            d.setdefault("tp", max(d["stage_tp"]))
        if isinstance(d.get("offload"), Mapping):
            d["offload"] = tuple(sorted((str(k), float(v)) for k, v in d["offload"].items() if float(v) > 0))
        elif d.get("offload") is not None:
            d["offload"] = tuple(sorted((str(k), float(v)) for k, v in d["offload"] if float(v) > 0))
        if d.get("recompute_policies") is not None:
            d["recompute_policies"] = tuple(d["recompute_policies"])
        when = d.get("offload_when")
        if isinstance(when, Mapping):
            d["offload_when"] = tuple(sorted((str(k), str(v)) for k, v in when.items()))
        elif isinstance(when, (list, tuple)) and all(isinstance(e, (list, tuple)) and len(e) == 2 for e in when):
            d["offload_when"] = tuple(sorted((str(k), str(v)) for k, v in when))
        elif when is not None:
            raise InvalidInput(f"offload_when: {when!r} is not a mapping of memory classes to conditions; write it "
                               "as `offload_when: {optimizer: distributed_optimizer}`")
        return cls(**{k: v for k, v in d.items() if v is not None})

    def given(self) -> dict[str, Any]:
        """The fixed knobs, by name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def allows_mesh(self, tp: int, cp: int, pp: int, dp: int, ep: int, etp: int, *, experts: bool,
                    inout: bool) -> bool:
        """Whether a mesh (etp as a number, never 0) keeps the fixed degrees; `experts`: the model has routed
        experts; `inout`: a linear weight of it is stored [in, out]."""
        fixed_etp = self.etp
        held = {"moe_tp": tp, "moe_etp": etp, "moe_cp": cp, "moe_ep_tp": ep if tp > 1 else None, "inout_tp": tp}
        for name in self.kind_limits(experts=experts, inout=inout):
            if held[name] is not None and held[name] != getattr(self, name):
                return False
        return all(want is None or want == have for want, have in
                   ((self.tp, tp), (self.cp, cp), (self.pp, pp), (self.dp, dp), (self.ep, ep), (fixed_etp, etp)))

    def allows(self, s: Strategy, *, experts: bool, inout: bool) -> bool:
        """Whether a whole strategy keeps every fixed knob (`experts`, `inout`: as `allows_mesh` has them)."""
        if not self.allows_mesh(s.tp, s.cp, s.pp, s.dp, s.ep, s.expert_tp, experts=experts, inout=inout):
            return False
        if self.vpp is not None and s.vpp != self.vpp:
            return False
        if self.micro_batch is not None and s.micro_batch != self.micro_batch:
            return False
        if self.recompute is not None and (s.recompute != self.recompute or s.full_recompute_layers):
            return False
        if self.zero is not None and s.zero != self.zero:
            return False
        if self.stage_tp is not None and tuple(s.stage_tp) != self.stage_tp:
            return False
        if self.stage_widths is False and s.stage_tp:
            return False
        if not self.zero_allowed(s.zero, s.dp, s.tp * s.pp * s.cp):
            return False
        if self.offload is not None and tuple(sorted(s.offload)) != tuple(sorted(self.offload)):
            return False
        return self.ends_alone is not False or not s.stage_layers or min(s.stage_layers[0], s.stage_layers[-1]) > 0

    def kind_limits(self, *, experts: bool, inout: bool) -> list[str]:
        """The model-kind limits given that hold a model of this kind (`experts`, `inout`: as allows_mesh)."""
        kinds = {"moe_": experts, "inout_": inout}
        return [k for k in _KIND_LIMITS if getattr(self, k) is not None and kinds[k[:k.index("_") + 1]]]

    def unmet(self, *, experts: bool, inout: bool) -> str:
        """The fixed knobs and the limits that hold the model, as a sentence's object ("--tp 2 and etp 1 and
        cp 1 for a model with routed experts"); empty when nothing is fixed."""
        limits = self.kind_limits(experts=experts, inout=inout)
        fixed = ", ".join(f"--{k.replace('_', '-')} {_show(v)}" for k, v in self.given().items()
                          if k not in _KIND_LIMITS and k not in LAUNCH_LIMITS)  # never what rules a mesh out
        held = []
        for prefix, why in (("moe_", "for a model with routed experts"),
                            ("inout_", "for a model with [in, out] linear weights")):
            mine = [_KIND_LIMITS[k].format(getattr(self, k)) for k in limits if k.startswith(prefix)]
            if mine:
                held.append(" and ".join(mine) + " " + why)
        return " and ".join(part for part in (fixed, *held) if part)

    @property
    def offload_searched(self) -> bool:
        return self.offload is None

    def as_section(self) -> dict[str, Any]:
        """The fixed knobs as a plan file's `constraints:` section writes them (lists and mappings)."""
        out = self.given()
        if "stage_tp" in out:
            out["stage_tp"] = list(out["stage_tp"])
        if "offload" in out:
            out["offload"] = dict(out["offload"])
        if "recompute_policies" in out:
            out["recompute_policies"] = list(out["recompute_policies"])
        if "offload_when" in out:
            out["offload_when"] = dict(out["offload_when"])
        return out


def _distributed_optimizer(s: Strategy, execution, fp8: bool, layers: int, frac: float) -> bool:
    """Megatron-LM's optimizer offload (--optimizer-cpu-offload, arguments.py at core_v0.16.1): it needs the
    precision-aware optimizer, which needs the distributed optimizer (optimizer_config.py): ZeRO-1, or one
    data-parallel rank, where it shards over that rank alone; and FP8 weights (--fp8-param-gather) only under
    delayed scaling."""
    sharded = s.dp * s.cp > 1
    fp8_weights = fp8 and execution.fp8_params and s.zero > 0 and sharded
    return (s.zero == 1 or not sharded) and not (fp8_weights and execution.fp8_recipe != "delayed")


def _whole_layers_one_stage(s: Strategy, execution, fp8: bool, layers: int, frac: float) -> bool:
    """megatron-core's layer-level activation offload (--cpu-offloading-num-layers, TransformerConfig.__post_init__
    at 0.16.1): one pipeline stage, no recomputation, no CUDA graphs, and the last layer kept on the device."""
    return (s.pp == 1 and s.recompute == "none" and not s.full_recompute_layers and not execution.cuda_graphs
            and math.ceil(frac * layers - 1e-9) < layers)


def _offloaded(s: Strategy, cls: str) -> float:
    return dict(s.offload).get(cls, 0.0)


def _zero_offload(s: Strategy, execution, fp8: bool, layers: int, frac: float) -> bool:
    """DeepSpeed's offload_optimizer (zero/offload_config.py, 0.19.8): under ZeRO, all of the states, or a fraction
    of them (`ratio`) under ZeRO-3 only."""
    return s.zero >= 1 and (frac == 1.0 or s.zero == 3)


def _fsdp_together(s: Strategy, execution, fp8: bool, layers: int, frac: float) -> bool:
    """FSDP2's CPUOffloadPolicy (torchtitan's training.enable_cpu_offload): the sharded parameters, their gradients
    and the optimizer's states on the host together, all of them."""
    return s.zero >= 1 and all(_offloaded(s, c) == 1.0 for c in ("params", "grads", "optimizer"))


#: Each condition, as a sentence ends that says where the launch framework offloads.
OFFLOAD_WHY = {
    "always": "always",
    "whole": "all of it or none",
    "distributed_optimizer": "with its distributed optimizer only (ZeRO-1, or one data-parallel rank), and FP8 "
                             "weights' only under delayed scaling",
    "whole_layers_one_stage": "of whole layers only, with one pipeline stage, no recompute and no CUDA graphs, and "
                              "never the last layer's",
    "zero_offload": "under ZeRO only, all of them, or a fraction under ZeRO-3",
    "zero3_whole": "under ZeRO-3 only, all of them",
    "with_whole_optimizer": "only all of them, beside all of the optimizer's states",
    "full_recompute_whole": "only all of them, of fully recomputed layers",
    "fsdp_together": "only with the parameters, gradients and optimizer states all on the host together, under "
                     "ZeRO",
}
#: The conditions a launch framework offloads a memory class under (`Constraints.offload_when`).
OFFLOAD_WHEN: dict[str, Callable[..., bool]] = {
    "always": lambda s, execution, fp8, layers, frac: True,
    "whole": lambda s, execution, fp8, layers, frac: frac == 1.0,
    "distributed_optimizer": _distributed_optimizer,
    "whole_layers_one_stage": _whole_layers_one_stage,
    "zero_offload": _zero_offload,
    "zero3_whole": lambda s, execution, fp8, layers, frac: s.zero == 3 and frac == 1.0,
    "with_whole_optimizer": lambda s, execution, fp8, layers, frac: frac == 1.0 and _offloaded(s, "optimizer") == 1.0,
    "full_recompute_whole": lambda s, execution, fp8, layers, frac: frac == 1.0 and s.recompute == "full",
    "fsdp_together": _fsdp_together,
}


#: A launch framework's limits that rule out no mesh: a pipeline cut, its recompute, its sequence parallelism.
LAUNCH_LIMITS = ("ends_alone", "recompute_policies", "full_layers_beside", "sequence_parallel", "stage_widths",
                 "ddp_alone", "selective", "offload_when")
#: Each model-kind limit: how a sentence names it.
_KIND_LIMITS = {"moe_tp": "tp {}", "moe_etp": "etp {}", "moe_cp": "cp {}", "moe_ep_tp": "ep {} at tp > 1",
                "inout_tp": "tp {}"}


def merge(from_file: Mapping[str, Any], flags: Mapping[str, Any], source: str,
          remedy: str = "edit the file") -> dict[str, Any]:
    """A plan file's (or a backend's) constraints with the command line's: both keep their knobs; one both fix
    differently is refused, naming the source."""
    try:
        a = Constraints.from_mapping(from_file).given()
    except InvalidInput as exc:  # it names the flag of the key: say where the key was written
        raise InvalidInput(f"{source}'s constraints: {exc} (as a key there, with underscores); {remedy}") from None
    b = Constraints.from_mapping(flags).given()
    for k in sorted(set(a) & set(b)):
        if a[k] != b[k]:
            flag = f"--{k.replace('_', '-')}"
            raise InvalidInput(f"{flag} {_show(b[k])} disagrees with {source}'s constraints ({k}: {_show(a[k])}); "
                               f"drop {flag} or {remedy}")
    out = {**a, **b}
    if out.get("moe_etp") is not None and out.get("etp", out["moe_etp"]) != out["moe_etp"]:
        raise InvalidInput(f"--etp {out['etp']} disagrees with {source}'s constraints (moe_etp: a model with routed "
                           f"experts runs at etp {out['moe_etp']}); drop --etp or {remedy}")
    return out


def _show(v: Any) -> str:
    if isinstance(v, tuple) and v and isinstance(v[0], tuple):
        return ",".join(f"{k}={f:g}" for k, f in v) or "none"
    if isinstance(v, tuple):
        return ",".join(str(x) for x in v)
    return str(v)


NONE = Constraints()
