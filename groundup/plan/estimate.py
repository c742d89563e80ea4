"""`plan(cfg, gpus, gpu, tokens, mfu)`: memory per GPU, the largest micro-batch that fits, and time.

    from groundup.config import load_config
    from groundup.plan import plan
    from groundup.train import TrainConfig

    cfg = load_config(TrainConfig, "configs/plan-clover-12b.toml")
    p = plan(cfg, gpus=8, gpu="a100-80gb", tokens=1e12, mfu=0.4)
    p.strategy("fsdp").peak_bytes, p.strategy("fsdp").max_micro_batch, p.step_time_s, p.gpu_hours

Time assumes the run reaches `mfu` of the GPU's dense peak (bf16, or plain fp32 for fp32 runs)
in *model* FLOPs (6N + attention, groundup.model.sizing), as MFU is reported by `groundup train`:
    tokens/s per GPU = mfu x peak / FLOPs per token;  step time = tokens per step / (that x GPUs).
The recomputed forward of activation checkpointing is work the GPU does on top (`hfu`).

The published 12B run (configs/plan-clover-12b.toml; 8 x A100-80GB, FSDP full shard, 2 x 8,192
tokens per micro-batch, 16 accumulation steps, checkpointing, bf16) reports about 62 GB per GPU,
about 1,400 tokens/s per GPU and about 180 s per step. Ours (tests/test_plan.py):
- time: 1,400 tokens/s x 90.68 GFLOP/token is 40.7% MFU of the A100's 312 TFLOP/s; at that MFU
  a step of 2.10M tokens takes 187 s (+4% on the published 180 s, which itself would be 1,456
  tokens/s); at the default 0.4, 190 s.
- memory depends on how FSDP accumulates gradients over the 16 micro-batches, which the
  published settings do not say: keeping each layer's unsharded gradient in bf16 (FSDP1's
  no_sync) gives 57.5 GB (-7%; -14% if the published figure is GiB); reduce-scattering every
  micro-batch gives 40.0 GB (-36%); groundup's own step today (FSDP2 no-sync, unsharded fp32
  gradients: 48 GB of them) gives 81.7 GB, more than an A100 has, so groundup would run the
  published settings only with reduce-scatter every micro-batch (or micro-batch 1).
Peaks are tensor bytes (torch.cuda.max_memory_allocated); nvidia-smi shows more (the CUDA
context, NCCL, the caching allocator's slack), which the headroom is for.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from groundup.config import did_you_mean
from groundup.errors import ConfigError
from groundup.model.sizing import flops_per_token
from groundup.plan.activations import loss_bytes, numerics, Layout
from groundup.plan.gpus import GPU, get_gpu
from groundup.plan.memory import ACCUMULATION, Memory, Setup, step_memory
from groundup.plan.params import param_split
from groundup.train.config import TrainConfig
from groundup.train.pipeline import bubble_fraction

STRATEGIES = ("ddp", "fsdp", "hsdp", "fsdp+tp", "pp", "pp-interleaved", "ep")
LABELS = {"single": "one GPU", "ddp": "DDP", "fsdp": "FSDP2 full shard", "hsdp": "FSDP2 hybrid (HSDP)",
          "fsdp+tp": "FSDP2 + tensor parallel", "pp": "pipeline 1F1B + FSDP2",
          "pp-interleaved": "pipeline interleaved + FSDP2", "ep": "FSDP2 + expert parallel"}
PP_SCHEDULES = {"pp": "1f1b", "pp-interleaved": "interleaved_1f1b"}
MAX_BATCH = 1 << 16


@dataclass
class Params:
    total: int
    embedding: int
    non_embedding: int
    active: int  # per token (MoE: only the routed experts)
    flops_per_token: int  # training (forward + backward) at the planned sequence length


@dataclass
class StrategyPlan:
    strategy: str  # ddp, fsdp, hsdp, fsdp+tp (single: one GPU)
    label: str
    gpus: int
    shard: int  # ranks each parameter is sharded over
    replicas: int  # data-parallel copies of each shard
    tp: int
    data_parallel: int  # ranks reading different data
    implemented: bool  # groundup.train can run it today
    peak_bytes: float  # at the configured micro-batch and checkpointing
    peak_phase: str
    parts: dict[str, float]  # the peak's parts
    peak_bytes_checkpointed: float  # the same step with activation checkpointing
    peak_bytes_full: float  # and without it
    activations_checkpointed: float  # activations (loss buffers included) at their largest moment
    activations_full: float
    fits: bool
    max_micro_batch: int  # the largest train.batch_size that fits (0: not even 1)
    tokens_per_step: int
    step_time_s: float
    accumulation: dict[str, float] = field(default_factory=dict)  # FSDP with grad_accum > 1: peak per mode
    notes: list[str] = field(default_factory=list)


@dataclass
class Plan:
    model: str
    gpu: GPU
    gpus: int
    gpus_per_node: int
    precision: str
    optimizer: str
    micro_batch: int
    seq_len: int
    grad_accum: int
    checkpointing: bool
    params: Params
    headroom: float
    usable_bytes: float  # per GPU, after the headroom
    logits_chunk_bytes: float  # one chunk of fp32 logits in the fused loss
    full_logits_bytes: float  # what an unfused loss would hold (B T V logits and their gradient)
    mfu: float
    hfu: float  # hardware FLOPs utilisation: the recomputed forward counted too
    tokens_per_sec_per_gpu: float
    tokens: float
    total_time_s: float
    gpu_hours: float
    strategies: list[StrategyPlan]
    notes: list[str] = field(default_factory=list)

    def strategy(self, name: str) -> StrategyPlan:
        for s in self.strategies:
            if s.strategy == name or (name == "ddp" and s.strategy == "single"):
                return s
        raise KeyError(name)

    @property
    def step_time_s(self) -> float:
        """Time per optimizer step with data parallelism over every GPU (DDP/FSDP)."""
        return self.strategies[0].step_time_s

    def to_dict(self) -> dict:
        return asdict(self)


def resolve_precision(mode: str, gpu: GPU | None) -> str:
    """What `precision.mode = auto` becomes on this GPU (bf16-autocast where bf16 exists)."""
    if mode != "auto":
        return mode
    return "bf16-autocast" if gpu is not None and gpu.bf16 else "fp32"


def _check(cfg: TrainConfig, gpus: int, mfu: float, tokens: float | None, headroom: float, gpus_per_node: int,
           fsdp_accumulate: str) -> None:
    if not isinstance(gpus, int) or gpus < 1:
        raise ConfigError(f"--gpus = {gpus!r}: expected a positive number of GPUs", key="gpus")
    if gpus_per_node < 1:
        raise ConfigError(f"--gpus-per-node = {gpus_per_node!r}: expected a positive number", key="gpus_per_node")
    if not 0 < mfu <= 1:
        raise ConfigError(f"--mfu = {mfu!r}: expected a fraction in (0, 1], e.g. 0.4", key="mfu")
    if tokens is not None and not 0 < tokens < float("inf"):  # also NaN, which no comparison catches
        raise ConfigError(f"--tokens = {tokens!r}: expected a positive number of tokens", key="tokens")
    if not 0 <= headroom < 1:
        raise ConfigError(f"--headroom = {headroom!r}: expected a fraction in [0, 1)", key="headroom")
    if fsdp_accumulate not in ACCUMULATION:
        hint = did_you_mean(fsdp_accumulate, ACCUMULATION)
        raise ConfigError(f"--fsdp-accumulate = {fsdp_accumulate!r}{hint}: expected one of {', '.join(ACCUMULATION)}",
                          key="fsdp_accumulate")


def _tp_divides(cfg: TrainConfig, t: int) -> bool:
    m = cfg.model
    kv = m.n_heads if m.attention == "mla" else m.kv_heads
    return m.n_heads % t == 0 and kv % t == 0


def check_tp(cfg: TrainConfig, tp: int, gpus: int) -> None:
    m = cfg.model
    if tp < 1:
        raise ConfigError(f"--tp = {tp}: expected a positive tensor-parallel degree", key="tp")
    if not _tp_divides(cfg, tp):
        kv = "" if m.attention == "mla" else f" and n_kv_heads ({m.kv_heads})"
        raise ConfigError(f"--tp = {tp}: must divide model.n_heads ({m.n_heads}){kv}, so that each GPU holds "
                          f"whole heads", key="tp")
    if gpus % tp:
        raise ConfigError(f"--tp = {tp}: must divide --gpus ({gpus})", key="tp")


def auto_tp(cfg: TrainConfig, gpus: int, gpus_per_node: int) -> int:
    """The largest of 8, 4, 2 within a node that divides the heads and leaves FSDP at least 2
    ranks to shard over (2 on 2 GPUs); 1 if none."""
    for t in (8, 4, 2):
        if (t <= min(gpus, gpus_per_node) and gpus % t == 0 and _tp_divides(cfg, t)
                and (gpus // t >= 2 or gpus == 2)):
            return t
    return 1


def make_setup(cfg: TrainConfig, strategy: str, gpus: int, *, device: str = "cuda", mode: str = "fp32",
               gpus_per_node: int = 8, tp: int = 1, sequence_parallel: bool = False,
               fsdp_accumulate: str = "unsharded-fp32", batch: int | None = None,
               checkpointing: bool | None = None, ep: int = 1, pp: int = 1, pp_schedule: str = "1f1b",
               pp_microbatches: int = 0) -> Setup:
    """The memory model's input for one strategy (`strategy` single/ddp/fsdp/hsdp/fsdp+tp/pp; `ep`: expert
    parallelism under ddp or fsdp; pp: `pp` stages, each FSDP over gpus / pp)."""
    shard, t = 1, 1
    if strategy == "pp":
        shard = gpus // pp
    if strategy in ("ddp", "fsdp", "hsdp") and gpus == 1:
        strategy = "single"  # one process: groundup trains the plain module
    if strategy == "fsdp":
        shard = gpus
    elif strategy == "hsdp":
        shard = min(gpus, gpus_per_node)
    elif strategy == "fsdp+tp":
        t, shard = tp, gpus // tp
        if shard == 1 and t == 1:
            strategy = "single"
    impl = cfg.optim.implementation
    return Setup(model=cfg.model, batch=batch or cfg.train.batch_size, seq=cfg.train.seq_len,
                 accum=cfg.train.grad_accum, num=numerics(mode), optimizer=cfg.optim.name,
                 optimizer_impl="fused" if impl == "auto" else impl,
                 checkpointing=cfg.train.grad_checkpointing if checkpointing is None else checkpointing,
                 strategy=strategy, gpus=gpus, shard=shard, tp=t, sequence_parallel=sequence_parallel and t > 1,
                 device=device, fsdp_accumulate=fsdp_accumulate, ep=ep, pp=pp if strategy == "pp" else 1,
                 pp_schedule=pp_schedule, pp_microbatches=pp_microbatches)


def default_accumulation(cfg: TrainConfig) -> str:
    """How groundup's step accumulates FSDP gradients under this config (memory.ACCUMULATION)."""
    return "sharded" if cfg.distributed.fsdp_grad_sync == "every" else "unsharded-fp32"


def predict_memory(cfg: TrainConfig, strategy: str, gpus: int, device: str = "cuda", mode: str | None = None,
                   **kwargs) -> Memory:
    """The step's memory per GPU for one strategy (the benchmark compares this with a measurement)."""
    kwargs.setdefault("fsdp_accumulate", default_accumulation(cfg))
    mode = mode or resolve_precision(cfg.precision.mode, None if device == "cpu" else get_gpu("a100-80gb"))
    return step_memory(make_setup(cfg, strategy, gpus, device=device, mode=mode, **kwargs))


def largest_batch(setup: Setup, usable: float) -> int:
    """The largest micro-batch whose step peak fits in `usable` bytes (0 if one sequence does not)."""
    def fits(b: int) -> bool:
        return step_memory(replace(setup, batch=b)).peak <= usable

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= MAX_BATCH and fits(hi):
        lo, hi = hi, hi * 2
    if hi > MAX_BATCH:
        return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def auto_pp(cfg: TrainConfig, gpus: int) -> int:
    """The pipeline degree of the PP rows: 2 when the GPUs and the layers split in two (interleaved: in four)."""
    return 2 if gpus >= 2 and gpus % 2 == 0 and cfg.model.n_layers % 2 == 0 else 1


def auto_ep(cfg: TrainConfig, gpus: int) -> int:
    """The expert-parallel degree of the EP row: the largest of 8, 4, 2 dividing the experts and the GPUs."""
    return next((e for e in (8, 4, 2) if cfg.model.n_experts and cfg.model.n_experts % e == 0 and gpus % e == 0
                 and e <= gpus), 1)


def _pipeline_notes(cfg: TrainConfig, setup) -> tuple[list[str], bool]:
    """What the PP rows say (the schedule's bubble, how to train it) and whether groundup can train it."""
    m, v = setup.pp_microbatches or setup.pp, 2 if setup.pp_schedule == "interleaved_1f1b" else 1
    bubble = bubble_fraction(setup.pp_schedule, setup.pp, m * setup.accum, v)
    notes = [f"PP {setup.pp} x FSDP {setup.shard}: {setup.model.n_layers // setup.pp} blocks per GPU, {m} pipeline "
             f"micro-batches per micro-batch, bubble {bubble:.0%}"
             " of each step (not in the step time); train it with distributed.strategy = 'fsdp', distributed.pp = "
             f"{setup.pp}, distributed.pp_schedule = '{setup.pp_schedule}'"]
    ok = True
    if cfg.model.tie_embeddings:
        notes.append("tied embeddings: the first and last stage each hold the embedding matrix, their gradients "
                     "summed every step")
    if cfg.model.n_experts:
        notes.append("groundup does not pipeline mixture-of-experts layers")
        ok = False
    if cfg.model.n_layers % (setup.pp * v):
        notes.append(f"{cfg.model.n_layers} layers do not split into {setup.pp * v} equal stages")
        ok = False
    return notes, ok


def _strategy_plan(cfg: TrainConfig, name: str, gpus: int, usable: float, tps_gpu: float, **kw) -> StrategyPlan:
    pp, ep = kw.pop("pp", 1), kw.pop("ep", 1)
    if name in PP_SCHEDULES:
        setup = make_setup(cfg, "pp", gpus, pp=pp, pp_schedule=PP_SCHEDULES[name], **kw)
    elif name == "ep":
        setup = make_setup(cfg, "fsdp", gpus, ep=ep, **kw)
    else:
        setup = make_setup(cfg, name, gpus, **kw)
    mem = step_memory(setup)
    with_ckpt = step_memory(replace(setup, checkpointing=True))
    without = step_memory(replace(setup, checkpointing=False))

    def act_peak(m: Memory) -> float:
        return max(x.parts["activations"] + x.parts["loss"] for x in m.moments)

    dp = gpus // setup.tp // setup.pp
    tokens_per_step = setup.batch * setup.seq * setup.accum * dp
    notes = []
    implemented = setup.strategy in ("single", "ddp", "fsdp", "hsdp", "fsdp+tp", "pp")
    if setup.strategy == "pp":
        notes, implemented = _pipeline_notes(cfg, setup)
    if setup.ep > 1:
        notes.append(f"EP {setup.ep}: each GPU holds {cfg.model.n_experts // setup.ep} of the {cfg.model.n_experts} "
                     "experts of every MoE layer whole (FSDP shards the rest); tokens reach them by all-to-all; "
                     f"train it with distributed.strategy = 'fsdp', distributed.ep = {setup.ep}")
    if setup.strategy == "hsdp":
        notes.append(f"train it with distributed.strategy = 'hsdp' (distributed.replicas = 0: one replica per node, "
                     f"here {dp // setup.shard} x {setup.shard} shards); pipeline stages compose with it "
                     "(distributed.pp, train/pipeline.py)")
    if setup.strategy == "hsdp" and gpus <= kw.get("gpus_per_node", 8):
        notes.append("one node: the same as full sharding")
    if setup.strategy == "hsdp" and gpus % setup.shard:
        notes.append(f"{gpus} GPUs are not whole nodes of {setup.shard}")
    if setup.strategy == "fsdp+tp":
        notes.append(f"TP {setup.tp} x FSDP {setup.shard}: attention and MLP matrices, the vocabulary and their "
                     "activations split over TP; norms replicated" + (", sequence parallel" if setup.sequence_parallel
                                                                     else "") +
                     f"; train it with distributed.strategy = 'fsdp', distributed.tp = {setup.tp}"
                     + (", distributed.sequence_parallel = true" if setup.sequence_parallel else ""))
    fsdp = setup.strategy in ("fsdp", "hsdp", "fsdp+tp", "pp")
    if fsdp and cfg.optim.name == "muon":
        notes.append("groundup refuses Muon under FSDP (Newton-Schulz needs whole matrices)")
        implemented = False
    by_mode = {}
    if fsdp and setup.accum > 1 and setup.shard > 1 and setup.pp == 1:  # pipelines reduce-scatter every time
        by_mode = {mode: step_memory(replace(setup, fsdp_accumulate=mode)).peak for mode in ACCUMULATION}
        if setup.fsdp_accumulate == "unsharded-fp32":
            notes.append("accumulating over micro-batches keeps every layer's unsharded fp32 gradient "
                         "(distributed.fsdp_grad_sync = 'last'); see accumulation for the alternatives")
    row = name if name in PP_SCHEDULES or name == "ep" else setup.strategy
    return StrategyPlan(
        strategy=row, label=LABELS[row], gpus=gpus, shard=setup.shard,
        replicas=dp // setup.shard if fsdp else dp, tp=setup.tp, data_parallel=dp, implemented=implemented,
        peak_bytes=mem.peak, peak_phase=mem.phase, parts=mem.parts,
        peak_bytes_checkpointed=with_ckpt.peak, peak_bytes_full=without.peak,
        activations_checkpointed=act_peak(with_ckpt), activations_full=act_peak(without),
        fits=mem.peak <= usable, max_micro_batch=largest_batch(setup, usable),
        tokens_per_step=tokens_per_step, step_time_s=tokens_per_step / (tps_gpu * gpus),
        accumulation=by_mode, notes=notes)


def plan(cfg: TrainConfig, gpus: int = 8, gpu: str = "a100-80gb", tokens: float | None = None, mfu: float = 0.4, *,
         gpus_per_node: int = 8, tp: int | None = None, sequence_parallel: bool = False, headroom: float = 0.1,
         fsdp_accumulate: str | None = None, strategies: tuple[str, ...] = STRATEGIES) -> Plan:
    """Memory per GPU for each strategy, the largest micro-batch that fits, and time at `mfu`.

    `tokens`: the run's length (default: train.max_steps steps of data parallelism over all GPUs).
    `tp`: the tensor-parallel degree of the FSDP + TP row (default: the largest of 8, 4, 2 within
    a node that divides the heads and leaves FSDP at least 2 ranks). `headroom`: the share of each
    GPU's memory kept free for the CUDA context, NCCL and allocator fragmentation.
    `fsdp_accumulate`: how FSDP accumulates gradients over micro-batches (memory.ACCUMULATION;
    default: what the config's distributed.fsdp_grad_sync makes groundup's step do). The PP rows
    (1F1B, interleaved 1F1B) split the blocks over 2 GPUs and FSDP-shard each stage over the rest;
    the EP row (MoE models) splits the experts over the largest of 8, 4, 2 dividing them and the GPUs.
    """
    if fsdp_accumulate is None:
        fsdp_accumulate = default_accumulation(cfg)
    _check(cfg, gpus, mfu, tokens, headroom, gpus_per_node, fsdp_accumulate)
    device = get_gpu(gpu)
    if tp is not None:
        check_tp(cfg, tp, gpus)
    t = tp if tp is not None else auto_tp(cfg, gpus, gpus_per_node)
    mode = resolve_precision(cfg.precision.mode, device)
    if mode != "fp32" and not device.bf16:
        raise ConfigError(f"precision.mode = {cfg.precision.mode!r}: the {device.label} has no bf16; use fp32",
                          key="precision.mode")
    m, seq = cfg.model, cfg.train.seq_len
    ps = param_split(m)
    fpt = flops_per_token(m, seq, counts=ps.counts)
    params = Params(ps.counts["params_total"], ps.counts["params_embedding"], ps.counts["params_non_embedding"],
                    ps.counts["params_active"], fpt)
    tps_gpu = mfu * device.peak(mode != "fp32") / fpt
    usable = device.memory_bytes * (1 - headroom)
    kw = dict(device="cuda", mode=mode, gpus_per_node=gpus_per_node, sequence_parallel=sequence_parallel,
              fsdp_accumulate=fsdp_accumulate)
    rows, notes = [], []
    for name in strategies:
        if name == "fsdp+tp" and t == 1:
            notes.append("no tensor-parallel row: no degree of 2, 4 or 8 divides the heads and the GPUs")
            continue
        if name in PP_SCHEDULES and auto_pp(cfg, gpus) == 1:
            if name == "pp":
                notes.append("no pipeline rows: the GPUs or the layers do not split in two")
            continue
        if name == "ep" and auto_ep(cfg, gpus) == 1:
            if cfg.model.n_experts:
                notes.append("no expert-parallel row: no degree of 2, 4 or 8 divides the experts and the GPUs")
            continue
        rows.append(_strategy_plan(cfg, name, gpus, usable, tps_gpu, tp=t if name == "fsdp+tp" else 1,
                                   pp=auto_pp(cfg, gpus), ep=auto_ep(cfg, gpus), **kw))
    tokens = tokens if tokens is not None else float(cfg.train.max_steps * rows[0].tokens_per_step)
    total_time = tokens / (tps_gpu * gpus)
    # the recomputed forward: a third of the blocks' training FLOPs (not the output layer's)
    out_flops = 6 * m.vocab_size * m.d_model
    hfu = mfu * (fpt + (fpt - out_flops) / 3) / fpt if cfg.train.grad_checkpointing else mfu
    loss = loss_bytes(m, cfg.train.batch_size, seq, numerics(mode), Layout())
    if mode == "fp32":
        notes.append(f"fp32 at the plain FP32 peak ({device.fp32 / 1e12:.1f} TFLOP/s): groundup does not enable TF32")
    return Plan(model=m.name, gpu=device, gpus=gpus, gpus_per_node=gpus_per_node, precision=mode,
                optimizer=cfg.optim.name, micro_batch=cfg.train.batch_size, seq_len=seq,
                grad_accum=cfg.train.grad_accum, checkpointing=cfg.train.grad_checkpointing, params=params,
                headroom=headroom, usable_bytes=usable, logits_chunk_bytes=loss.chunk_logits,
                full_logits_bytes=loss.full_logits, mfu=mfu, hfu=hfu, tokens_per_sec_per_gpu=tps_gpu,
                tokens=tokens, total_time_s=total_time, gpu_hours=total_time * gpus / 3600, strategies=rows,
                notes=notes)
