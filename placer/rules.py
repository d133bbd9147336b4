"""Resource rules: the one place where a node, a site's power, a cost rate, a failure's
lost waves and a plan's configuration are defined.

The evaluator (placer.evaluate), the formulations (placer.optimize), the failure model
(placer.resilience) and the outputs all read these, so that a rule changed here changes
everywhere at once. Nothing here depends on the evaluator or a backend.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING

from placer.schema import Catalog, Job, Plan

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
    staggered: bool = False  # job.replica_schedule: replicas time-share the routes (Atlas)

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    def label(self) -> str:
        return f"tp{self.tp}-pp{self.pp}-dp{self.dp}-mb{self.micro_batch}-{self.sync_mode}"


def num_micro_batches(job: Job, micro_batch: int, dp: int) -> int:
    """Micro-batches per replica and step: global_batch / (micro_batch x dp), at least one."""
    return max(1, job.global_batch // (micro_batch * dp))


def job_config(
    job: Job,
    tp: int,
    pp: int,
    dp: int,
    micro_batch: int,
    num_micro: int,
    stage_layers: tuple[int, ...],
    sync_mode: str,
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
        staggered=job.replica_schedule == "staggered",
    )


def sync_mode_of(problem: Problem, plan: Plan) -> str:
    return plan.sync_mode or problem.instance.job.sync.modes[0]


def config_of(problem: Problem, plan: Plan) -> Config:
    """The configuration a plan runs (micro-batches derived when the plan leaves them out)."""
    job, par = problem.instance.job, plan.parallelism
    m = par.num_micro_batches or num_micro_batches(job, par.micro_batch, par.dp)
    return job_config(
        job,
        par.tp,
        par.pp,
        par.dp,
        par.micro_batch,
        m,
        tuple(plan.stage_layers),
        sync_mode_of(problem, plan),
    )


# ----------------------------------------------------------------------------- nodes and power


def tp_groups_per_node(gpus_per_node: int, tp: int) -> int:
    """TP groups stay inside one node: a node hosts gpus_per_node // tp of them."""
    return gpus_per_node // tp


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
