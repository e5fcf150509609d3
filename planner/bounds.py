"""Bounds on the numbers a user gives, each refused with its reason before any heavy work.

A degree of 0 is not "the default", NaN is not "no limit", and a sequence of a
billion tokens is not something to hand to ONNX shape inference: every
option is checked here, at the boundary, in one sentence that says why
("a tensor-parallel degree counts devices: at least 1"). The library checks
what it builds again (`Strategy`, `Workload`); these checks come first so that
nothing slow runs on a number that cannot be right.
"""

from __future__ import annotations

import math
import os
from typing import Any, Mapping

from cost_models.spec import MAX_DEVICES as SPEC_MAX_DEVICES
from planner.errors import InvalidInput
from planner.units import nbytes

GIB = 2.0**30

#: The most devices a preset scales to (a three-tier fat tree of 128-port switches): above it, a typo.
MAX_DEVICES = SPEC_MAX_DEVICES

#: Tokens of one training step (global batch x sequence length): 2**32 is about 70x the largest published
#: batch (DeepSeek-V3: 15,360 x 4,096 = 63M tokens, arXiv:2412.19437 section 4.2); beyond it the estimate
#: would print a step of days as if it were a plan.
MAX_TOKENS_PER_STEP = 2**32
#: What that bound is, as the refusals of a step over it say
MAX_TOKENS_WHY = "about 70x the largest published training batch (DeepSeek-V3: 63M tokens)"

#: Host memory the ONNX importer holds per token of a bound sequence dimension: ONNX shape inference with data
#: propagation materialises per-position values (Range, masks). Measured on the torch-exported fixtures
#: (tests/fixtures/gpt2.onnx, llama_gqa.onnx): 1.0-1.2 KiB per token at 300k tokens.
IMPORT_BYTES_PER_TOKEN = 1024

#: Below this many tokens the model is not read ahead to bound the sequence length (the import is quick).
PEEK_ABOVE_TOKENS = 1 << 16

#: The most layers a zoo model is built with: its graph holds a call per layer, and the deepest published LLM
#: has 126 (Llama 3.1 405B, arXiv:2407.21783 table 3); beyond 1,024 an override is a typo (a mutated plan's
#: 2,000,000,000 layers held 9 GiB before it was stopped).
MAX_ZOO_LAYERS = 1024

#: The most seconds a search may be given: a day (plans take seconds to minutes).
MAX_TIME_LIMIT_S = 86400.0


def whole(flag: str, value: Any, what: str, *, least: int = 1, most: int | None = None, why: str = "") -> int:
    """`value` as an int within least..most; InvalidInput `--flag V: <what> ...` otherwise."""
    if value is None:
        raise InvalidInput(f"{flag} needs a value: {what}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{flag} {value!r}: {what} is a whole number")
    if value < least:
        raise InvalidInput(f"{flag} {value}: {what} is at least {least}" + (f" ({why})" if why else ""))
    if most is not None and value > most:
        raise InvalidInput(f"{flag} {value}: {what} is at most {most:,}" + (f" ({why})" if why else ""))
    return value


def positive(flag: str, value: Any, what: str, *, most: float | None = None, why: str = "") -> float:
    """`value` as a finite float above 0 (and at most `most`); NaN and infinity are refused, not ignored."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise InvalidInput(f"{flag} {value!r}: {what} is a number") from None
    if not math.isfinite(x) or x <= 0:
        raise InvalidInput(f"{flag} {value}: {what} must be a finite number above 0")
    if most is not None and x > most:
        raise InvalidInput(f"{flag} {value}: {what} is at most {most:g}" + (f" ({why})" if why else ""))
    return x


def devices(flag: str, value: int | None) -> int | None:
    """A device count: at least 1, at most `MAX_DEVICES` (None: the preset's size)."""
    if value is None:
        return None
    whole(flag, value, "a device count")  # at least one, for no reason the upper bound's gives
    return whole(flag, value, "a device count", most=MAX_DEVICES,
                 why="no network joins more: a three-tier fat tree of 128-port switches has 524,288 ports")


def degrees(**given: int | None) -> None:
    """Parallel degrees the user gave (None: not given): each counts devices or chunks, so at least 1."""
    what = {"tp": ("the tensor-parallel degree", "it counts the devices a layer is split over"),
            "pp": ("the number of pipeline stages", "each stage is a group of devices"),
            "dp": ("the data-parallel degree", "it counts model replicas"),
            "cp": ("the context-parallel degree", "it counts the devices a sequence is split over"),
            "ep": ("the expert-parallel degree", "it counts the devices the experts are spread over"),
            "etp": ("the expert tensor-parallel degree", "it counts the devices an expert is split over"),
            "vpp": ("the number of interleaved chunks per stage", "a stage holds at least one chunk"),
            "micro_batch": ("a micro-batch", "it counts sequences"),
            "flushes": ("the number of pipeline schedules per step", "each runs a share of the micro-batches")}
    for name, value in given.items():
        if value is not None:
            noun, why = what[name]
            whole(f"--{name.replace('_', '-')}", value, noun,
                  most=MAX_DEVICES if name not in ("micro_batch", "flushes") else None, why=why)


def step_tokens(global_batch: int | None, seq_len: int | None) -> None:
    """A training step's batch and length: at least 1 each, at most `MAX_TOKENS_PER_STEP` tokens together."""
    if global_batch is not None:
        whole("--global-batch", global_batch, "the global batch (sequences per step)")
    if seq_len is not None:
        whole("--seq-len", seq_len, "the sequence length (tokens)")
    if global_batch is not None and seq_len is not None and global_batch * seq_len > MAX_TOKENS_PER_STEP:
        raise InvalidInput(f"--global-batch {global_batch} x --seq-len {seq_len} = {global_batch * seq_len:,} tokens "
                           f"per step is more than {MAX_TOKENS_PER_STEP:,}, {MAX_TOKENS_WHY}; give a smaller "
                           f"{'--seq-len' if seq_len > MAX_TOKENS_PER_STEP else '--global-batch or --seq-len'}")


def zoo_overrides(name: str, overrides: Mapping[str, Any]) -> None:
    """A zoo model's layer counts (`layers`, `vision_layers`, ...) at most MAX_ZOO_LAYERS, before it is built."""
    for key, value in sorted(overrides.items()):
        counted = isinstance(value, int) and not isinstance(value, bool)
        if key.endswith("layers") and counted and value > MAX_ZOO_LAYERS:
            raise InvalidInput(f"{name} with {key}={value:,}: a zoo model is built with at most {MAX_ZOO_LAYERS:,} "
                               "layers (the deepest published LLM has 126); give fewer")


def time_limit(value: float) -> float:
    return positive("--time-limit", value, "the search's time limit in seconds", most=MAX_TIME_LIMIT_S,
                    why="a day; plans take seconds to minutes")


def memory_cap(value: float | None, clusters: Any = ()) -> float | None:
    """--memory-gib: finite, above 0, and no more than the HBM of a device of every cluster given."""
    if value is None:
        return None
    x = positive("--memory-gib", value, "the HBM a plan may use per device (GiB)")
    for hw in clusters:
        have = hw.device.hbm_bytes / GIB
        if x > have:
            raise InvalidInput(f"--memory-gib {value}: a device of {hw.name} has {have:g} GiB of HBM; give at most "
                               f"{have:g} (or drop --memory-gib to use all of it)")
    return x


# -- the sequence length against what the devices (and this machine) can hold -------------------------------
def sequence(flag: str, tokens: int, model: str | os.PathLike, cluster: Any, *,
             overrides: Mapping[str, Any] | None = None, training: bool = True, devices: int | None = None) -> None:
    """Refuse `tokens` per sequence when even the least a step must keep of one sequence exceeds all the
    memory of the cluster's devices (HBM and host tiers), or when reading the model at that length would
    exhaust this machine's memory.

    The least a training step keeps of one sequence (Korthikanti et al. 2022, section 4; full recompute):
    each layer's input, 2 bytes x hidden per token (bf16), for every layer, and the working set of the layer
    being recomputed, 34 bytes x hidden per token: 2 x hidden x (layers + 17) bytes per token. Serving keeps
    at least one layer's hidden states of the sequence: 2 x hidden bytes per token. Spread over every device
    (context parallelism) and offloaded to host memory, it still has to fit somewhere. `devices` counts the
    devices asked for (default: the cluster's).
    """
    whole(flag, tokens, "the sequence length (tokens)")
    if tokens <= PEEK_ABOVE_TOKENS:
        return
    hidden, layers, _ = _width(model, overrides)
    if hidden:
        per_token = 2.0 * hidden * (layers + 17 if training else 1)
        need = tokens * per_token
        per_device = cluster.device.hbm_bytes + sum(t.capacity_bytes for t in cluster.memory_tiers)
        n = devices or cluster.n_devices
        have = n * per_device
        if need > have:
            why = (f"2 B x hidden {hidden} x ({layers} layers + 17)" if training
                   else f"2 B x hidden {hidden}, one layer's hidden states")
            raise InvalidInput(
                f"{flag} {tokens:,}: one sequence needs at least {nbytes(need)} ({why} = {nbytes(per_token)} per "
                f"token, even with full recompute), more than the {nbytes(have)} of HBM and host memory of all "
                f"{n:,} devices of {cluster.name}; give a shorter {flag} or more --devices")
    readable(flag, tokens, model)


def readable(flag: str, tokens: int | None, model: str | os.PathLike) -> None:
    """Refuse `tokens` per sequence when reading the ONNX file `model` at that length would exhaust this
    machine's memory (a zoo model is built at any length without holding per-token values)."""
    if tokens is None:
        return
    whole(flag, tokens, "the sequence length (tokens)", most=MAX_TOKENS_PER_STEP,
          why="more tokens than any published training step holds, about 70x the largest")
    if tokens <= PEEK_ABOVE_TOKENS or not os.path.isfile(os.fspath(model)):
        return
    need = tokens * IMPORT_BYTES_PER_TOKEN
    have = _host_memory_bytes()
    if have is not None and need > have / 2:
        raise InvalidInput(
            f"{flag} {tokens:,}: reading {os.path.basename(os.fspath(model))} at that length needs about "
            f"{nbytes(need)} of this machine's memory (ONNX shape inference holds about 1 KiB per token), and "
            f"{nbytes(have)} is available; give a shorter {flag}")


def _width(model: str | os.PathLike, overrides: Mapping[str, Any] | None) -> tuple[int, int, bool]:
    """(hidden size, layers, is a file) of a model, read without building or importing it; (0, 0, ...) when
    unknown (the import then reports what is wrong with it)."""
    text = os.fspath(model)
    if os.path.isfile(text):
        return (*_file_width(text), True)
    try:
        import models_zoo

        cfg = models_zoo.config(text, **dict(overrides or {}))
    except Exception:  # noqa: BLE001 - not a zoo name or a bad override: load_graph says which, in one sentence
        return 0, 0, False
    hidden, layers = getattr(cfg, "hidden", 0), getattr(cfg, "layers", 0)
    return (hidden if isinstance(hidden, int) else 0), (layers if isinstance(layers, int) else 0), False


def _file_width(path: str) -> tuple[int, int]:
    """The embeddings' width (the widest Gather from a 2-D initializer: token and position tables) and the
    number of layers of its deepest stack by the initializers' names; (0, 0) when the file has no embedding."""
    try:
        import onnx

        proto = onnx.load(path, load_external_data=False)
    except Exception:  # noqa: BLE001 - an unreadable file: the importer says why
        return 0, 0
    from planner.graph.blocks import layer_of_path

    g = proto.graph
    inits = {t.name: t for t in g.initializer}
    hidden = 0
    for n in g.node:
        if n.op_type == "Gather" and n.input and n.input[0] in inits:
            dims = inits[n.input[0]].dims
            if len(dims) == 2:
                hidden = max(hidden, int(dims[1]))
    per_stack: dict[str, set[int]] = {}
    for t in g.initializer:
        at = layer_of_path(t.name.rsplit(".", 1)[0])
        if at is not None:
            per_stack.setdefault(at[0], set()).add(at[1])
    layers = max((len(v) for v in per_stack.values()), default=1)  # the deepest stack (towers run side by side)
    return (hidden, layers) if hidden else (0, 0)


def _host_memory_bytes() -> float | None:
    """Memory this machine has available (Linux MemAvailable), or None where it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024.0
    except OSError:
        return None
    return None


def training_dtype(dtype: str, cluster: Any) -> None:
    """A training precision the cluster's device has a peak for (an A100 has no fp8); the precision itself is the
    workload's to check (`Workload`)."""
    from planner.strategy import TRAIN_DTYPES

    listed = {name for name, _ in cluster.device.peak_flops_per_s}
    if dtype not in TRAIN_DTYPES or dtype in listed:
        return
    there = [d for d in TRAIN_DTYPES if d in listed]
    instead = f"; train in {', '.join(there[:-1])} or {there[-1]} there" if len(there) > 1 else ""
    raise InvalidInput(f"--dtype {dtype}: {cluster.name}'s {cluster.device.name} has no {dtype} peak{instead}")


def request(model: str | os.PathLike, clusters: Any, *, global_batch: int | None = None, seq_len: int | None = None,
            prompt_len: int | None = None, gen_len: int | None = None, batch: int | None = None,
            ttft_ms: float | None = None, tpot_ms: float | None = None, time_limit_s: float | None = None,
            memory_gib: float | None = None, overrides: Mapping[str, Any] | None = None,
            devices: int | None = None) -> None:
    """Every number of a plan or sweep request, before the search: `clusters` are the loaded clusters, `devices`
    the largest device count asked for (default: each cluster's own)."""
    clusters = list(clusters)
    step_tokens(global_batch, seq_len)
    for flag, value, what in (("--prompt-len", prompt_len, "a prompt's length (tokens)"),
                              ("--gen-len", gen_len, "the tokens generated per request"),
                              ("--batch", batch, "the sequences per replica")):
        if value is not None:
            whole(flag, value, what)
    if batch is not None and prompt_len is not None and gen_len is not None:
        if batch * (prompt_len + gen_len) > MAX_TOKENS_PER_STEP:
            raise InvalidInput(f"--batch {batch} x (--prompt-len + --gen-len) = {batch * (prompt_len + gen_len):,} "
                               f"tokens in flight per replica is more than {MAX_TOKENS_PER_STEP:,}; give a smaller "
                               "--batch")
    for flag, value in (("--ttft-ms", ttft_ms), ("--tpot-ms", tpot_ms)):
        if value is not None:
            positive(flag, value, "a latency target in milliseconds")
    if time_limit_s is not None:
        time_limit(time_limit_s)
    memory_cap(memory_gib, clusters)
    if not clusters:
        return
    biggest = max(clusters, key=lambda c: c.device.hbm_bytes + sum(t.capacity_bytes for t in c.memory_tiers))
    if seq_len is not None:
        sequence("--seq-len", seq_len, model, biggest, overrides=overrides, devices=devices)
    if prompt_len is not None and gen_len is not None:
        sequence("--prompt-len + --gen-len", prompt_len + gen_len, model, biggest, overrides=overrides,
                 training=False, devices=devices)
