"""Physical and size limits on input values, as data with the reason for each.

Every number an instance, model or plan carries is finite and at most its upper bound here
(the lower bounds live next to the fields in `placer.schema`). The bounds are far above any
real deployment, so they never reject a plan someone could build, but they keep every
quantity (and its products inside the formulations) well inside int64 for OR-Tools and
float64 for HiGHS. Loader limits keep hostile files (alias bombs, deep nesting, huge
integers, multi-megabyte files) from using unbounded time or memory before validation.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limit:
    hi: float
    why: str


LIMITS: dict[str, Limit] = {
    "gpus": Limit(
        10_000_000, "GPUs at one site or in one job: 50x the largest 2025 cluster (~200k GPUs)"
    ),
    "gpus_per_node": Limit(
        1024, "scale-up domain: largest announced NVLink domain is 576 GPUs (NVL576)"
    ),
    "nics_per_node": Limit(1024, "at most one NIC per GPU of the largest scale-up domain"),
    "power_mw": Limit(100_000, "100 GW: 20x the largest planned campus (~5 GW)"),
    "pue": Limit(10, "power usage effectiveness: real facilities are 1.05-2.5"),
    "route_km": Limit(40_075, "Earth's circumference; the longest cable systems are ~39,000 km"),
    "latency_ms": Limit(10_000, "one-way latency: a geostationary hop is ~270 ms"),
    "fiber_pairs": Limit(
        10_000, "dark fiber pairs on a route: the largest cables have 432-1728 fibers"
    ),
    "capacity_gbps": Limit(1e9, "1 Ebit/s per direction: 1000x a full C+L band cable system"),
    "waves": Limit(1_000_000, "new waves on a route: 10,000 pairs x ~100 channels"),
    "usd": Limit(1e13, "10 trillion USD: above world annual GDP / 10"),
    "usd_per_unit": Limit(1e12, "a catalog price per item (port, mux, amplifier, module)"),
    "usd_per_mwh": Limit(1e6, "energy price: spot peaks are ~1e4 USD/MWh"),
    "years": Limit(1000, "amortization period"),
    "global_batch": Limit(
        1_000_000, "sequences per step: ~100x the largest published batches (16k sequences)"
    ),
    "seq_len": Limit(100_000_000, "tokens per sequence: 100x the longest context windows"),
    "model_dim": Limit(10_000_000, "layers, hidden, heads, ffn, vocab: 100x the largest models"),
    "parallel_degree": Limit(
        10_000_000, "a tp/pp/dp/micro-batch candidate (bounded by the GPU count)"
    ),
    "candidates": Limit(4096, "entries of a candidate list"),
    "every_steps": Limit(1_000_000, "outer sync interval of DiLoCo modes"),
    "step_time_s": Limit(1e7, "seconds per step: ~4 months"),
    "slowdown": Limit(1000, "allowed slowdown factor under failure"),
    "sites_per_replica": Limit(
        16, "sites one pipeline chain may visit (chain types grow as sites^K)"
    ),
    "paths_per_pair": Limit(16, "candidate paths per site pair"),
    "seed": Limit(2**31 - 1, "CP-SAT's random_seed is an int32"),
    "tflops": Limit(1e8, "dense peak per GPU, TFLOP/s (100 EFLOP/s)"),
    "hbm_gb": Limit(1e7, "memory per GPU, GB"),
    "watts": Limit(1e8, "power per item, W"),
    "gbps": Limit(1e9, "a line rate, Gbit/s or GB/s"),
    "ghz": Limit(1e7, "optical spectrum, GHz"),
    "reach_km": Limit(1e6, "optic reach, km"),
    "seconds": Limit(1e7, "a latency or duration in the catalog, s"),
    "per_km": Limit(1e6, "a per-km figure (us/km, amplifier spacing km)"),
    "memory_gb": Limit(1e7, "memory reserve, GB"),
}


def hi(key: str) -> float:
    return LIMITS[key].hi


# ----------------------------------------------------------------------------- search space

MAX_SITES = 256  # routing and data-parallel sync are per site pair: 256 sites = 32,640 pairs
MAX_ROUTES = 8192  # routes of the fiber graph (a dense 128-site mesh)
MAX_CHAIN_CANDIDATES = 200_000  # site orders x stage cuts one configuration may enumerate
STOP_GRACE_S = 10.0  # after SIGINT/SIGTERM, the search has this long to wind down before exit

# ----------------------------------------------------------------------------- loader

MAX_FILE_BYTES = 4_000_000  # a 1,000-site instance with 5,000 routes is ~300 kB
MAX_DEPTH = 64  # the deepest schema path is ~6 levels (catalog.gpus.<key>.<field>)
MAX_NODES = 500_000  # YAML nodes after alias expansion (an alias bomb grows exponentially)
MAX_INT_DIGITS = 40  # 128-bit range; every integer field is bounded far below
MAX_NAME_CHARS = 128  # names (sites, instance, model); keeps messages and tables linear
MAX_TEXT_CHARS = 100_000  # free text (descriptions, sources)
MESSAGE_VALUE_CHARS = 80  # longest echo of a bad value in an error message
MESSAGE_LINE_CHARS = 2_000  # longest line of an error message
