"""Fit each preset's efficiency parameters on half of its shipped runs and write them into the preset.

    python benchmarks/fit_presets.py                  # every hardware that has shipped runs
    python benchmarks/fit_presets.py dgx-h100 dgx-a100 # some of them
    python benchmarks/fit_presets.py --dry-run         # fit and print, write nothing

Which runs are fitted is decided by a rule that does not look at the errors
(`planner.calibration.alternate_split`): per hardware, every other published
row in file order, never more than half of its runs; the rest are held out.
Each preset's [efficiency] then lists its fitted runs under `fitted_on` and the
held-out runs' errors per category under `held_out` (what every estimate on the
preset repeats), and `hyperplan calibrate` reports the two groups apart; then
benchmarks/published_errors.py rewrites the per-run errors estimates cite (and benchmarks/bench_bridge_sweep.py
--write those of the Megatron-Bridge sweep's rows and the speedups between presets what-if sweeps cite).
Prints the fitted values and the fit and held-out errors; takes minutes (every
evaluation estimates every fitted run).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cost_models.loader import PRESET_DIR, load_text, preset_names  # noqa: E402
from planner.calibration import alternate_split, read_runs  # noqa: E402
from planner.calibration.fit import fitted_names, preset_values  # noqa: E402
from planner.calibration.report import calibrate_runs  # noqa: E402
from planner.costing.execution import STACK_DIR, stack_cache_clear  # noqa: E402

#: Stacks whose kernel efficiency is fitted beside a hardware's parameters: on DGX H100 the runs of three
#: Megatron-Core generations and NeMo Automodel share the hardware, so today's Megatron-Core is the reference.
STACK_FITS = {"dgx-h100": ("megatron-core-2024", "automodel"),
              # DGX H200's runs are torchtitan's: with the die's values DGX H100's (SHARED_FROM), they pin what that
              # stack's kernels give of Megatron-Core's on the same GH100
              "dgx-h200": ("torchtitan",)}
#: Stacks whose TP overlap share is fitted beside a hardware's parameters: Grand Teton's runs are torchtitan's
#: asyncTP benchmark, the same layouts with and without async TP, so they pin the share async TP hides.
TP_SHARE_FITS = {"h100-grand-teton": ("torchtitan",)}


#: What a preset keeps of the A100 fit where its own runs cannot pin a parameter (an assumption its file says):
#: the A100 law's per-kernel overhead and plateaus, and the starting overlap efficiency.
TRANSFERRED = {"matmul_plateau": 0.749, "memory_plateau": 0.741, "kernel_overhead_us": 9.8, "overlap": 0.8}


#: Presets without runs of their own that take a fitted preset's values (an assumption their files state): the
#: CloudMatrix384's Ascend 910C is two dies of the 910B's generation (Da Vinci cube units at 376 TFLOP/s bf16
#: each, 1850 against 1800 MHz), run by the same CANN and MindSpeed stack, so the 910B's fit, not the A100's.
TRANSFER_TO = {"ascend-910b": ("cloudmatrix384", "cloudmatrix384-die")}


def transfer(source: str, values: dict[str, float]) -> None:
    """Write a fitted preset's device values into the presets that transfer them (`TRANSFER_TO`), saying so."""
    for target in TRANSFER_TO.get(source, ()):
        path = PRESET_DIR / f"{target}.toml"
        lines = []
        for line in path.read_text(encoding="utf-8").splitlines():
            key = line.split("=")[0].strip()
            if key == "transferred_from":  # written again below, beside calibration
                continue
            if key in values:
                line = f"{key} = {values[key]:g}"
            lines.append(line)
            if key == "calibration":  # and whose fit it is: estimates on the target cite that fit's held-out runs
                lines[-1] = (f'calibration = "transferred from the {source} fit (an assumption: no runs of this '
                             f'hardware fitted)"')
                lines.append(f'transferred_from = "{source}"')
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        print(f"  wrote {path} ({', '.join(f'{k} {v:g}' for k, v in values.items())}, from {source})")


#: Presets whose fit runs may all train in FP8, pinning the fp8 GEMM plateau only: their bf16 plateau is then tied
#: to it at the ratio the named preset's fit measures between the two (an assumption their file states; a fit with
#: a 16-bit run pins the bf16 plateau itself, and no tie is written: GB200's split fits DeepSeek-V3's BF16 run).
#: The Blackwell presets' runs are Megatron-Core's, so DGX H100's fit of the same stacks one generation before,
#: far from the A100 fit (2021's Megatron-LM).
TIED_TO = {"dgx-b200": "dgx-h100", "dgx-b300": "dgx-h100", "gb200-nvl72": "dgx-h100", "gb300-nvl72": "dgx-h100"}


def ties_for(hardware: str, fitted: dict[str, str]) -> tuple[dict, str]:
    """The plateau ties of a preset (`fit.fit`'s `ties`) and the sentence its file gives them; the reference
    preset as this run fitted it (`fitted`: hardware -> file text) when it did, else as installed."""
    ref = TIED_TO.get(hardware)
    if ref is None:
        return {}, ""
    text = fitted.get(ref) or (PRESET_DIR / f"{ref}.toml").read_text(encoding="utf-8")
    c = load_text(text, source=f"{ref}.toml", default_name=ref)
    if c.fp8_matmul_plateau is None:
        return {}, ""
    ratio = round(c.matmul_plateau / c.fp8_matmul_plateau, 3)
    return ({"matmul_plateau": ("fp8_matmul_plateau", ratio)},
            f"matmul_plateau = {ratio:g} x fp8_matmul_plateau, {ref}'s fitted ratio (no 16-bit fit run)")


#: Device values a preset takes from another preset's fit of the same chip or server instead of fitting them (an
#: assumption its file states, with the reason here): hardware -> (reference, keys, why).
_HOST = "the same Megatron-Core issuing kernels from a server CPU, which these runs are too few to pin"
SHARED_FROM = {
    # Grand Teton's GPUs are H100 SXMs run with NCCL, as DGX H100's, whose 14 fit runs (gradient, parameter, TP and
    # expert overlaps) pin the overlap efficiency; Grand Teton's 10 barely do (fitted free it came to 0.51, and held
    # at 0.791 their mean error moves 1.7 % -> 2.0 %)
    "h100-grand-teton": ("dgx-h100", ("overlap",), "the same H100 and NCCL, which these runs barely pin"),
    # the per-kernel host issue cost of an eager Megatron-Core step, a property of the stack on a server CPU (DGX
    # B200's Xeon 8570, GB200's and GB300's Grace), not of the GPU: their runs are too few to fit it, and their
    # CUDA-graph runs (Execution.cuda_graphs) issue no kernels from the host
    "dgx-b200": ("dgx-h100", ("host_overhead_us",), _HOST),
    # DGX A100's 2021-22 runs are large models whose kernels outlast their issue, so they pin no host figure: without
    # one an eager step of a small model ran on the A100 free of the host issue an H100 pays, and came out faster
    "dgx-a100": ("dgx-h100", ("host_overhead_us",), "the per-op host issue of an eager Megatron step from a server "
                 "CPU (DGX A100's EPYC 7742 against DGX H100's Xeon 8480C), which these runs do not pin"),
    "gb200-nvl72": ("dgx-h100", ("host_overhead_us",), _HOST),
    "gb300-nvl72": ("dgx-h100", ("host_overhead_us",), _HOST),
    # H200 SXM is H100 SXM's GH100 die at the same clocks, power and peaks (989 TFLOP/s bf16, 1,979 fp8, 700 W: the
    # two datasheets) with more and faster HBM; its only runs are torchtitan's, whose float8 FSDP2 step fitted the
    # die's FP8 plateau to 0.465 of the peak against the 0.688 DGX H100's Megatron-Core runs fit, so a Megatron-Core
    # run on H200 would have been costed 30 % slow. The die's values come from DGX H100; what torchtitan's kernels
    # give of them is the stack's own kernel efficiency (STACK_FITS), fitted here
    "dgx-h200": ("dgx-h100", ("matmul_plateau", "fp8_matmul_plateau", "kernel_overhead_us", "host_overhead_us",
                              "overlap"),
                 "the same GH100 die at the same clocks, power and peaks (H200 changes the HBM)"),
    # DGX B300's runs are all MoE on eager stacks, which pin a GEMM plateau (measured against DGX B200 at the same
    # layouts and releases they run 4-16 % faster) but not what DGX B200's dense and MoE runs fit beside it: fitted
    # free on them its overlap went to the 1.0 bound and its kernel overhead to 4.35 us, and its plateaus below
    # B200's (0.544 FP8), so the planner found dense layouts slower on it than on a B200. Its 16-bit runs are all
    # GPT-OSS, whose BF16 runs on Blackwell come out 16-24 % fast held out on B200 and GB200, a gap no GEMM plateau
    # explains (benchmarks/CALIBRATION.md: DGX B300): fitted on three of them the bf16 plateau came to 0.362 of the peak
    # against B200's 0.508 and pulled the fp8 one to 0.719; tied to the fp8 one it pulled that to 0.476
    "dgx-b300": ("dgx-b200", ("host_overhead_us", "kernel_overhead_us", "overlap", "matmul_plateau"),
                 "the same Blackwell server (x86 hosts, NVLink 5, NCCL, the same BF16 peak), which these runs, all "
                 "MoE and in 16 bits all GPT-OSS, do not pin"),
}


def shared_values(hardware: str, fitted: dict[str, str]) -> tuple[dict[str, float], str]:
    """The device values a preset takes from its reference's fit (`SHARED_FROM`), and the sentence saying so; the
    reference as this run fitted it when it did, else as installed."""
    if hardware not in SHARED_FROM:
        return {}, ""
    ref, keys, why = SHARED_FROM[hardware]
    text = fitted.get(ref) or (PRESET_DIR / f"{ref}.toml").read_text(encoding="utf-8")
    c = load_text(text, source=f"{ref}.toml", default_name=ref)
    values = {k: round(preset_values(c)[k], 3) for k in keys}
    unpinned = set(tomllib.loads(text).get("efficiency", {}).get("not_fitted", ())) & set(keys)
    said = ", ".join(f"{k} = {v:g}" + (" (not fitted there)" if k in unpinned else "") for k, v in values.items())
    return values, f"ASSUMPTION: {said} from {ref}'s fit, {why}"


#: Presets whose runs run a stack another preset's fit sets a value of (`STACK_FITS`): fitted after it, in the same
#: process with the stack read again (`main` adds them to a fit of the preset they follow). Grand Teton's runs are
#: torchtitan's, whose kernel efficiency DGX H200's sets. Under --dry-run nothing is written and nothing is added.
STACK_FITTED_BY = {"h100-grand-teton": "dgx-h200"}


def reference_depth(hardware: str) -> int:
    """How many fits a preset's values pass through (`TIED_TO`, `SHARED_FROM`, `STACK_FITTED_BY`): references are
    fitted first."""
    refs = {TIED_TO.get(hardware), SHARED_FROM.get(hardware, (None,))[0], STACK_FITTED_BY.get(hardware)} - {None}
    return max((1 + reference_depth(r) for r in refs), default=0)


def fit_order(requested: list[str], with_runs: set[str], dry_run: bool = False) -> list[str]:
    """The presets to fit, references first: those requested and, unless nothing is written, every preset with runs
    whose stack a requested one's fit rewrites (`STACK_FITTED_BY`), which would otherwise keep a fit made with the
    stack's old value."""
    wanted = set(requested)
    if not dry_run:
        wanted |= {dep for dep, ref in STACK_FITTED_BY.items() if ref in wanted and dep in with_runs}
    return sorted(wanted, key=lambda h: (reference_depth(h), h))


def start_text(hardware: str, shared: dict[str, float] | None = None) -> str:
    """A preset's file with the transferred values put back and an earlier fp8 plateau dropped, so a fit never
    starts from an earlier one (the result depends only on the runs); the A100 preset, the reference, as it is."""
    text = (PRESET_DIR / f"{hardware}.toml").read_text(encoding="utf-8")
    if hardware == "dgx-a100":
        return text  # the reference: its own parameters are fitted from the A100 start values
    out, missing = [], dict(shared or {})
    for line in text.splitlines():
        key = line.split("=")[0].strip()
        if key in missing:
            out.append(f"{key} = {missing.pop(key):g}")
        elif key in TRANSFERRED:
            out.append(f"{key} = {TRANSFERRED[key]:g}")
        elif key != "fp8_matmul_plateau":
            out.append(line)
    start = out.index("[efficiency]")  # a shared value the file does not yet state ends its [efficiency]
    end = next((i for i in range(start + 1, len(out)) if out[i].startswith("[")), len(out))
    out[end:end] = [f"{key} = {value:g}" for key, value in missing.items()]
    return "\n".join(out) + "\n"


def write_stack_field(stack: str, key: str, value: float, hardware: str) -> None:
    """Set a fitted field (`kernel_efficiency` in [kernels], `tp_overlap_share` in [overlap]) in a stack preset,
    saying where it was fitted."""
    path = STACK_DIR / f"{stack}.toml"
    lines = path.read_text(encoding="utf-8").splitlines()
    line = f"{key} = {value:g}  # fitted beside {hardware}'s parameters (benchmarks/fit_presets.py)"
    hit = [i for i, l in enumerate(lines) if l.startswith(key)]
    if hit:
        lines[hit[0]] = line
    else:
        section = "[kernels]" if key == "kernel_efficiency" else "[overlap]"
        at = next(i for i, l in enumerate(lines) if l.strip() == section)
        lines.insert(at + 1, line)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"  wrote {path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("hardware", nargs="*", help="presets to fit (default: all with shipped runs)")
    ap.add_argument("--dry-run", action="store_true", help="fit and print; write no preset")
    args = ap.parse_args(argv)
    runs = read_runs()
    split = alternate_split(runs)
    chosen = fit_order(args.hardware or list(split), set(split), args.dry_run)
    fitted: dict[str, str] = {}  # hardware -> its fitted file text, this run's
    for hw in chosen:
        if hw not in preset_names():
            print(f"{hw}: not a preset; skipped", file=sys.stderr)
            continue
        mine = [r for r in runs if r.hardware == hw]
        fit_ids = [r.id for r in split.get(hw, [])]
        if not fit_ids:
            print(f"{hw}: no runs to fit on; skipped")
            continue
        start = time.perf_counter()
        stacks, tp_shares = STACK_FITS.get(hw, ()), TP_SHARE_FITS.get(hw, ())
        ties, note = ties_for(hw, fitted)
        names = fitted_names([r for r in mine if r.id in set(fit_ids)])
        if not any(k not in names and src in names for k, (src, _) in ties.items()):
            ties, note = {}, ""  # a 16-bit fit run pins the bf16 plateau itself: no tie, nothing to say
        shared, shared_note = shared_values(hw, fitted)
        note = "; ".join(x for x in (note, shared_note) if x)
        result = calibrate_runs(mine, fit=fit_ids, stacks=stacks, ties=ties, note=note, tp_shares=tp_shares,
                                start_text=start_text(hw, shared), held=tuple(shared))
        fitted[hw] = result.fitted_text
        took = time.perf_counter() - start
        values = ", ".join(f"{k} {v:g}" for k, v in result.fit.values.items())
        print(f"{hw}: fitted on {len(fit_ids)} of {len(mine)} runs in {result.fit.evaluations} evaluations, "
              f"{took:.0f} s: {values}")
        for s in result.summary():
            print(f"  {s['group']:<9} {s['category']:<15} {s['rows']:>3} runs  mean {100 * s['mean_abs_error']:5.1f}%"
                  f"  max {100 * s['max_abs_error']:5.1f}%")
        for p in result.predictions:
            print(f"    {'fit' if p.fitted else 'held':<4} {p.run.id:<56} {100 * p.error:+6.1f}%"
                  + ("" if p.estimate.fits else "  (predicted not to fit)"))
        if not args.dry_run:
            (PRESET_DIR / f"{hw}.toml").write_text(result.fitted_text, encoding="utf-8")
            print(f"  wrote {PRESET_DIR / f'{hw}.toml'}")
            for stack in stacks:
                write_stack_field(stack, "kernel_efficiency", result.fit.values[f"stack:{stack}"], hw)
            for stack in tp_shares:
                write_stack_field(stack, "tp_overlap_share", result.fit.values[f"tp_share:{stack}"], hw)
            if stacks or tp_shares:  # the presets fitted after this one run the stacks as now written
                stack_cache_clear()
                runs = read_runs()
            transfer(hw, {k: v for k, v in result.fit.values.items() if ":" not in k})
    if fitted and not args.dry_run:  # what estimates cite of each model's runs, with the presets as now fitted:
        # in a process of its own, which reads the presets and stacks as written (this one's runs hold the stacks
        # they were read with, and the loaders cache what they read)
        here = Path(__file__)
        return (subprocess.run([sys.executable, str(here.with_name("published_errors.py"))]).returncode
                or subprocess.run([sys.executable, str(here.with_name("bench_bridge_sweep.py")), "--write"]).returncode)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
