"""Resource rules: the one place where a node, a site's power, a cost rate, a failure's
lost waves and a plan's configuration are defined.

The evaluator (placer.evaluate), the formulations (placer.optimize), the failure model
(placer.resilience) and the outputs all read these, so that a rule changed here changes
everywhere at once. Nothing here depends on the evaluator or a backend.
"""

from __future__ import annotations

import math
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING

from placer.schema import Catalog, Job, ModelSpec, Plan

if TYPE_CHECKING:
    from placer.io import Problem

J_PER_MWH = 3.6e9
SECONDS_PER_YEAR = 365.25 * 86400


# ----------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class Config:
    """A parallel configuration: degrees, micro-batching, layer split and sync policy, with
    the job settings the performance model reads (derived once from the job, `job_config`)."""

    tp: int
    pp: int
    dp: int
    micro_batch: int
    num_micro_batches: int
    stage_layers: tuple[int, ...]
    sync_mode: str = "synchronous"
    _: KW_ONLY
    recompute: str
    precision: str
    zero1: bool
    sync_bits: int
    every_steps: int
    sequence_parallel: bool = True
    overlap_grad_reduce: bool = True  # job.overlap: what the framework hides under compute
    overlap_param_gather: bool = True
    overlap_tp_comm: bool = True
    cp: int = 1  # context parallel: each sequence split over cp ranks (ring attention)
    ep: int = 1  # expert parallel: a replica holds ep data-parallel ranks sharing the experts
    expert_load_imbalance: float = 1.0  # busiest EP rank's tokens / the mean (job field)
    # FSDP / ZeRO-3 shard group: a replica holds dp_shard data-parallel ranks (side by side,
    # like ep) that shard parameters, gradients and optimizer state (torchtitan dp_shard);
    # the dp replicas are the replicate group (dp_replicate): HSDP when dp > 1
    dp_shard: int = 1
    reshard_after_forward: bool = True  # job.fsdp.reshard_after_forward (FSDP2 fully_shard)
    overlap_ep_comm: bool = False  # job.overlap.ep_comm (where Megatron-Core accepts it)
    moe_dispatcher: str = "alltoall"  # job.moe_dispatcher: alltoall or deepep (node dedup)
    moe_dispatch_precision: str = "bf16"  # job.moe_dispatch_precision (forward dispatch)
    moe_cuda_graphs: bool = False  # job.moe_cuda_graphs: no host sync exposed per MoE layer
    # expert tensor parallel size (Megatron-Core --expert-tensor-parallel-size) when the plan
    # folds EP over the stage's ranks (expert_fold); None: the unfolded layout, expert TP 1
    # and a replica stage of tp x cp x ep GPUs (placer's layout before ETP)
    etp: int | None = None

    @property
    def expert_tp(self) -> int:
        """Expert tensor parallelism: etp when folded, else 1."""
        return self.etp or 1

    @property
    def width(self) -> int:
        """GPUs of one replica at one stage, consecutive ranks inside a site (Megatron's
        tp-cp-ep-dp-pp order, torchtitan's [dp_shard, cp, tp] inner dims), so EP, CP and
        the FSDP shard group never cross a site: tp x cp x ep x dp_shard unfolded; folded
        (etp set), the smallest block holding whole tp x cp groups of the dense layers and
        whole ep x etp groups of the expert layers, lcm(tp cp, ep etp) (expert_fold)."""
        if self.etp is not None:
            return expert_fold_width(self.tp, self.cp, self.ep, self.etp)
        return self.tp * self.cp * self.ep * self.dp_shard

    @property
    def expert_dp_per_replica(self) -> int:
        """Expert data-parallel ranks inside one replica stage (ranks holding the same expert
        shard): width / (ep x etp); unfolded tp x cp x dp_shard."""
        return self.width // (self.ep * self.expert_tp)

    @property
    def optimizer_shard_over_dp(self) -> int:
        """The dp replicas' further division of the optimizer step: ZeRO-1 shards it over
        them; under FSDP (dp_shard > 1) the replicate group holds full copies of the shard
        group's state (HSDP), so 1."""
        return self.dp if self.zero1 and self.dp_shard == 1 else 1

    @property
    def ranks_per_replica(self) -> int:
        """Data-parallel ranks of one replica (sequences side by side): width / (tp x cp),
        ep x dp_shard unfolded."""
        return self.width // (self.tp * self.cp)

    staggered: bool = False  # job.replica_schedule: replicas time-share the routes (Atlas)
    # interleaved 1F1B: model chunks per pipeline rank (Megatron's virtual pipeline size);
    # stage_layers[k] // virtual_stages layers per chunk of rank k, model stage c pp + k
    virtual_stages: int = 1
    # parallelism.chunk_layers: the layers of each of the v pp model stages when they are
    # not stage_layers[k] / v (uneven chunks, Megatron-Core's pipeline layout); None: even
    chunk_split: tuple[int, ...] | None = None
    # parallelism.pipeline_schedule: "1f1b" (1F1B, interleaved for virtual_stages > 1) or
    # "dualpipev" (DeepSeek's DualPipeV, placer.perf.dualpipe: 2 chunks per rank in a V,
    # model stage s on rank s for s < pp, else 2 pp - 1 - s)
    pipeline_schedule: str = "1f1b"

    @property
    def dualpipev(self) -> bool:
        return self.pipeline_schedule == "dualpipev"

    @property
    def chunks_per_rank(self) -> int:
        """Model chunks per pipeline rank: virtual_stages, 2 under DualPipeV."""
        return 2 if self.dualpipev else self.virtual_stages

    @property
    def model_stages(self) -> int:
        """Model stages (chunks) of the pipeline: pp x chunks_per_rank."""
        return self.pp * self.chunks_per_rank

    def stage_rank(self, s: int) -> int:
        """The pipeline rank of model stage s: s mod pp (1F1B, interleaved), the V
        (DualPipeV: s for s < pp, else 2 pp - 1 - s)."""
        if self.dualpipev:
            return s if s < self.pp else 2 * self.pp - 1 - s
        return s % self.pp

    def rank_stages(self, k: int) -> tuple[int, ...]:
        """The model stages of rank k, chunk 0 first."""
        if self.dualpipev:
            return (k, 2 * self.pp - 1 - k)
        return tuple(c * self.pp + k for c in range(self.virtual_stages))

    @property
    def gpus(self) -> int:
        return self.width * self.pp * self.dp

    @property
    def ep_overlap(self) -> bool:
        """Whether the MoE all-to-all overlap (job.overlap.ep_comm) runs: Megatron-Core
        accepts --overlap-moe-expert-parallel-comm only with EP > 1, without full
        recompute and, with pipelining, with a virtual pipeline (TransformerConfig
        __post_init__, megatron-core 0.16.1); elsewhere the all-to-all stays exposed and
        the launch files do not ask for the overlap. Under DualPipeV (pp > 1) the overlap is
        the schedule's F&B pairs, which torchtitan runs with EP > 1 and no activation
        checkpointing only (torchtitan 0.2.2 distributed/dual_pipe_v.py get_dual_pipe_v_flag:
        NotImplementedError with activation_checkpoint.mode other than "none"). That is
        placer's "selective" as well as "none": torchtitan's attention is PyTorch SDPA,
        whose flash / memory-efficient kernels keep no s x s scores and recompute them in
        the backward (Dao et al. 2022, arXiv 2205.14135), which is what "selective" prices
        (Korthikanti et al.'s attention-core recompute); only "full" is checkpointing."""
        if self.dualpipev and self.pp > 1:
            return self.overlap_ep_comm and self.ep > 1 and self.recompute != "full"
        return (
            self.overlap_ep_comm
            and self.ep > 1
            and self.recompute != "full"
            and (self.pp == 1 or self.virtual_stages > 1)
        )

    @property
    def data_parallel_size(self) -> int:
        """Megatron's --data-parallel-size: the dense layers' replicas, ranks_per_replica
        (ep x dp_shard unfolded) per replica."""
        return self.dp * self.ranks_per_replica

    @property
    def chunk_layers(self) -> tuple[int, ...]:
        """Layers of each model stage (v pp of them; model stage s on rank s mod pp): the
        plan's chunk_layers, else stage_layers[k] / v for every chunk of rank k."""
        if self.chunk_split is not None:
            return self.chunk_split
        v = self.chunks_per_rank
        return tuple(self.stage_layers[self.stage_rank(s)] // v for s in range(self.model_stages))

    @property
    def uneven_chunks(self) -> bool:
        """Whether some rank's chunks differ in size (exports need a pipeline layout)."""
        return any(len(set(self.rank_chunks(k))) > 1 for k in range(self.pp))

    def rank_chunks(self, k: int) -> tuple[int, ...]:
        """The layers of rank k's chunks (v, 2 under DualPipeV), chunk 0 first."""
        c = self.chunk_layers
        return tuple(c[s] for s in self.rank_stages(k))

    def label(self) -> str:
        """tp[-cp][-ep][-fsdp]-pp-dp-mb[-v]-sync, and the layers per stage when they are not all
        equal."""
        extra = (f"-cp{self.cp}" if self.cp > 1 else "") + (f"-ep{self.ep}" if self.ep > 1 else "")
        if self.etp is not None:
            extra += f"-etp{self.etp}"
        if self.dp_shard > 1:
            extra += f"-fsdp{self.dp_shard}"
        v = f"-v{self.virtual_stages}" if self.virtual_stages > 1 else ""
        if self.dualpipev:
            v += "-dualpipev"
        base = (
            f"tp{self.tp}{extra}-pp{self.pp}-dp{self.dp}-mb{self.micro_batch}{v}-{self.sync_mode}"
        )
        if self.uneven_chunks:
            base += "-C" + ".".join(map(str, self.chunk_layers))
        if len(set(self.stage_layers)) <= 1:
            return base
        return base + "-L" + ".".join(map(str, self.stage_layers))


def num_micro_batches(job: Job, micro_batch: int, dp: int, ep: int = 1, dp_shard: int = 1) -> int:
    """Micro-batches per replica and step: global_batch / (micro_batch x dp x ep x dp_shard),
    at least one (a replica of expert-parallel degree ep and FSDP shard group dp_shard runs
    ep x dp_shard sequences side by side)."""
    return max(1, job.global_batch // (micro_batch * dp * ep * dp_shard))


def job_config(
    job: Job,
    tp: int,
    pp: int,
    dp: int,
    micro_batch: int,
    num_micro: int,
    stage_layers: tuple[int, ...],
    sync_mode: str,
    cp: int = 1,
    ep: int = 1,
    virtual_stages: int = 1,
    dp_shard: int = 1,
    etp: int | None = None,
    chunk_split: tuple[int, ...] | None = None,
    pipeline_schedule: str = "1f1b",
) -> Config:
    """A configuration with the job's recompute, precision, ZeRO and sync settings."""
    return Config(
        tp,
        pp,
        dp,
        micro_batch,
        num_micro,
        tuple(stage_layers),
        sync_mode,
        recompute=job.recompute,
        precision=job.precision,
        zero1=job.zero1,
        sync_bits=job.sync.bits,
        every_steps=job.sync.every_steps,
        sequence_parallel=job.sequence_parallel,
        overlap_grad_reduce=job.overlap.grad_reduce,
        overlap_param_gather=job.overlap.param_gather,
        overlap_tp_comm=job.overlap.tp_comm,
        cp=cp,
        ep=ep,
        expert_load_imbalance=job.expert_load_imbalance,
        overlap_ep_comm=job.overlap.ep_comm,
        moe_dispatcher=job.moe_dispatcher,
        moe_dispatch_precision=job.moe_dispatch_precision,
        moe_cuda_graphs=job.moe_cuda_graphs,
        staggered=job.replica_schedule == "staggered",
        virtual_stages=virtual_stages,
        dp_shard=dp_shard,
        reshard_after_forward=job.fsdp.reshard_after_forward,
        etp=etp,
        chunk_split=tuple(chunk_split) if chunk_split is not None else None,
        pipeline_schedule=pipeline_schedule,
    )


def expert_fold_width(tp: int, cp: int, ep: int, etp: int) -> int:
    """GPUs of a folded replica stage: lcm(tp x cp, ep x etp).

    Megatron-Core builds two rank generators over the same world (parallel_state.
    initialize_model_parallel, megatron-core 0.16): the decoder one in order tp-cp-ep-dp-pp
    with ep = 1 and the expert one in order tp-ep-dp-pp with tp = expert_tensor_parallel_size
    and cp = 1 (RankGenerator(tp=expert_tensor_parallel_size, ep=expert_model_parallel_size,
    dp=expert_data_parallel_size, pp=pipeline_model_parallel_size, cp=1, order=order),
    expert_data_parallel_size = world / (etp ep pp)); pp is the outermost dimension of both,
    so the expert model-parallel group of ep x etp consecutive ranks is drawn from a
    pipeline stage's tp x cp x dp ranks. The smallest block of consecutive ranks holding
    whole groups of both is this lcm."""
    return math.lcm(tp * cp, ep * etp)


def etp_problems(
    model: ModelSpec, tp: int, cp: int, ep: int, etp: int | None, dp_shard: int
) -> list[str]:
    """Why a folded expert layout cannot run (empty: it can, or it is not folded), as
    Megatron-LM's validate_args and the MoE layer would refuse it: expert TP needs an MoE
    model whose expert FFN it divides, and (above 1) no linear biases (placer exports them
    for non-gated models); placer prices folding without FSDP; ep x etp must
    fit in the stage (checked by the world size)."""
    if etp is None:
        return []
    out = []
    e = model.moe
    if e is None:
        out.append(f"etp={etp} needs a mixture-of-experts model ('{model.name}' is dense)")
    elif e.expert_ffn_hidden % etp:
        out.append(f"etp={etp} does not divide the expert FFN width {e.expert_ffn_hidden}")
    if e is not None and etp > 1 and not model.gated_ffn:
        # placer exports linear biases for non-gated (GPT-style) models; Megatron-Core's
        # TransformerConfig: "Bias in Moe is only supported when ETP==1"
        out.append(
            f"etp={etp} with linear biases ('{model.name}' is not gated): "
            "Megatron-Core supports MoE biases only with expert TP 1"
        )
    if dp_shard > 1:
        out.append(f"etp={etp} with dp_shard={dp_shard}: FSDP with folded experts is not modelled")
    return out


def dp_shard_problems(ep: int, dp_shard: int) -> list[str]:
    """Why an FSDP shard group cannot be combined (empty: it can): placer models dp_shard
    with expert parallelism 1 only (torchtitan borrows EP ranks from dp_shard x cp, a layout
    whose expert-state sharding placer does not price)."""
    if dp_shard > 1 and ep > 1:
        return [f"dp_shard={dp_shard} with ep={ep}: FSDP with expert parallelism is not modelled"]
    return []


def cp_ep_problems(
    model: ModelSpec, tp: int, cp: int, ep: int, sequence_parallel: bool
) -> list[str]:
    """Why a (tp, cp, ep) cannot run the model, as Megatron-Core would refuse it (empty:
    it can): EP needs experts it divides; CP splits each sequence into 2 cp chunks (the
    load-balanced causal split); MoE with TP > 1 needs sequence parallelism."""
    out = []
    e = model.moe
    if ep > 1 and e is None:
        out.append(f"ep={ep} needs a mixture-of-experts model ('{model.name}' is dense)")
    if e is not None and e.experts % ep:
        out.append(f"ep={ep} does not divide the {e.experts} experts")
    if cp > 1 and model.seq_len % (2 * cp):
        out.append(f"cp={cp}: seq_len {model.seq_len} is not divisible by 2 x cp")
    if e is not None and tp > 1 and not sequence_parallel:
        out.append(f"tp={tp} with MoE layers needs sequence_parallel (Megatron-Core)")
    return out


def plan_side(plan: Plan) -> int:
    """Data-parallel ranks of one replica of a plan (Config.ranks_per_replica)."""
    par = plan.parallelism
    tp, cp, ep = par.tp, par.cp or 1, par.ep or 1
    if par.etp is not None:
        return expert_fold_width(tp, cp, ep, par.etp) // (tp * cp)
    return ep * (par.dp_shard or 1)


def sync_mode_of(problem: Problem, plan: Plan) -> str:
    return plan.sync_mode or problem.instance.job.sync.modes[0]


def config_of(problem: Problem, plan: Plan) -> Config:
    """The configuration a plan runs (micro-batches derived when the plan leaves them out)."""
    job, par = problem.instance.job, plan.parallelism
    shard = par.dp_shard or 1
    etp = par.etp
    m = par.num_micro_batches or num_micro_batches(job, par.micro_batch, par.dp, plan_side(plan))
    return job_config(
        job,
        par.tp,
        par.pp,
        par.dp,
        par.micro_batch,
        m,
        tuple(plan.stage_layers),
        sync_mode_of(problem, plan),
        par.cp or 1,
        par.ep or 1,
        virtual_stages=par.virtual_stages,
        dp_shard=shard,
        etp=etp,
        chunk_split=_uneven_chunks(plan),
        pipeline_schedule=par.pipeline_schedule or "1f1b",
    )


def _uneven_chunks(plan: Plan) -> tuple[int, ...] | None:
    """The plan's chunk_layers, or None when they are the even split (one Config, and one
    cache key, per pipeline whichever way the plan writes it)."""
    par = plan.parallelism
    if par.chunk_layers is None:
        return None
    v, p = par.virtual_stages, par.pp
    if par.pipeline_schedule == "dualpipev":
        even = [plan.stage_layers[s if s < p else 2 * p - 1 - s] // 2 for s in range(2 * p)]
    else:
        even = [plan.stage_layers[s % p] // v for s in range(v * p)]
    return None if list(par.chunk_layers) == even else tuple(par.chunk_layers)


# ----------------------------------------------------------------------------- nodes and power


def tp_groups_per_node(gpus_per_node: int, tp: int) -> int:
    """TP groups stay inside one node: a node hosts gpus_per_node // tp of them."""
    return gpus_per_node // tp


def replica_slots(gpus_per_node: int, tp: int, width: int) -> tuple[int, int]:
    """How replica-stages of `width` = tp x cp x ep GPUs pack into nodes: (slots per block,
    nodes per block). Narrower than a node: gpus_per_node // width per node; wider: whole
    nodes, width / gpus_per_node of them (the width must be a multiple of the node). TP
    stays inside a node. (0, 1) when it cannot be placed."""
    if tp > gpus_per_node:
        return 0, 1
    if width <= gpus_per_node:
        return gpus_per_node // width, 1
    if width % gpus_per_node or gpus_per_node % tp:
        return 0, 1
    return 1, width // gpus_per_node


def nodes_for(gpus_per_node: int, tp: int, width: int, replica_stages: int) -> int:
    """Nodes that `replica_stages` replica-stages of the given width occupy at a site."""
    per, block = replica_slots(gpus_per_node, tp, width)
    if replica_stages <= 0:
        return 0
    if per == 0:
        return math.ceil(replica_stages * width / gpus_per_node)
    return math.ceil(replica_stages / per) * block


def site_gpus_per_node(problem: Problem, site: str) -> int:
    s = problem.instance.site(site)
    return s.gpus_per_node or problem.catalog.gpus[s.gpu].gpus_per_node


def site_gpus_per_host(problem: Problem, site: str) -> int:
    """GPUs per host (OS instance) of a site: its own `gpus_per_host`, else the catalog's when
    that divides the site's NVLink domain, else the domain (one host per domain, as before
    hosts were modelled). A domain is a whole number of hosts (checked when loading)."""
    s = problem.instance.site(site)
    return default_gpus_per_host(
        s.gpus_per_host,
        site_gpus_per_node(problem, site),
        problem.catalog.gpus[s.gpu].gpus_per_host,
    )


def default_gpus_per_host(own: int | None, domain: int, catalog_host: int | None) -> int:
    if own is not None:
        return own
    if catalog_host is not None and domain % catalog_host == 0:
        return catalog_host
    return domain


def node_it_w(problem: Problem, site: str) -> float:
    """All-in IT power of one node of the site (GPUs x all-in W, before PUE)."""
    s = problem.instance.site(site)
    return site_gpus_per_node(problem, site) * problem.catalog.gpus[s.gpu].all_in_w


def site_power_w(problem: Problem, site: str, nodes: int, optic_modules_w: float = 0.0) -> float:
    """Facility power of a site: its nodes in use plus the coherent modules, times the PUE.
    One node alone (`nodes=1`) is the site's node draw."""
    return (nodes * node_it_w(problem, site) + optic_modules_w) * problem.instance.site(site).pue


# ----------------------------------------------------------------------------- costs


def amortization_s(catalog: Catalog) -> float:
    """The horizon over which link capex is spread (catalog `costs.amortization_years`)."""
    return catalog.costs.amortization_years * SECONDS_PER_YEAR


def energy_usd_per_j(catalog: Catalog) -> float:
    return catalog.costs.energy_usd_per_mwh / J_PER_MWH


def usd_per_second(
    problem: Problem,
    capex_usd: float,
    power_mw: dict[str, float],
    nodes_by_site: dict[str, int] | None = None,
) -> float:
    """Running cost of the plan: link capex amortized over `costs.amortization_years`, the
    energy of every site (power incl. PUE x `costs.energy_usd_per_mwh`), and the GPUs of
    the nodes in use at sites that give a `gpu_usd_per_hour` (elsewhere they are sunk)."""
    costs = problem.catalog.costs
    energy = sum(power_mw.values()) * 1e6 * costs.energy_usd_per_mwh / J_PER_MWH
    gpus = sum(node_usd_per_s(problem, s) * n for s, n in (nodes_by_site or {}).items())
    return capex_usd / amortization_s(problem.catalog) + energy + gpus


def node_usd_per_s(problem: Problem, site: str) -> float:
    """What one node of the site costs per second of the job: its GPUs x the GPU-hour price."""
    price = problem.instance.site(site).gpu_usd_per_hour
    return 0.0 if price is None else site_gpus_per_node(problem, site) * price / 3600.0


# ----------------------------------------------------------------------------- failures


def waves_lost(klass: str, waves: int, channels_per_pair: int) -> int:
    """Waves a single failure takes from a route lit with `waves`: one (`wave`), or the
    fullest fiber pair (`fiber_pair`: waves are packed into the fewest pairs)."""
    if waves <= 0:
        return 0
    return 1 if klass == "wave" else min(waves, channels_per_pair)
