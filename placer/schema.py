"""Input and output data model (CONTRACT sections 1-3 and 5).

Strict, frozen pydantic v2 models in the Calliope style: unknown keys are errors, every
default is visible in `placer schema`. Cross-field checks that need the catalog or the
model library (GPU keys, model names) happen in `placer.io` after the catalog is merged.
"""

from __future__ import annotations

import warnings
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)

from placer.limits import MAX_NAME_CHARS, MAX_ROUTES, MAX_SITES, MAX_TEXT_CHARS, hi

NAME_PATTERN = r"^[A-Za-z0-9_.-]+$"
HOST_PATTERN = r"^[A-Za-z0-9_.:-]+$"  # a host name or address, as SLURM and torchrun take it
SyncMode = Literal["synchronous", "diloco", "streaming-diloco"]
Precision = Literal["bf16", "fp16", "fp8"]
Recompute = Literal["none", "selective", "full"]
Backend = Literal["cpsat", "milp", "brute"]
PipelineSchedule = Literal["1f1b", "dualpipev"]


def _not_bool(v: Any) -> Any:
    """YAML `true` is not 1: a boolean where a number belongs is an error."""
    if isinstance(v, bool):
        raise ValueError(f"must be a number, got {'true' if v else 'false'}")
    return v


# numbers: never booleans; never inf or nan (Strict sets allow_inf_nan=False)
Int = Annotated[int, BeforeValidator(_not_bool)]
Num = Annotated[float, BeforeValidator(_not_bool)]


def _not_dots(v: str) -> str:
    """'.' and '..' match the pattern but would name the current or parent folder (out/<name>)."""
    if set(v) == {"."}:
        raise ValueError(f"must not consist of dots only, got '{v}'")
    return v


Name = Annotated[
    str,
    StringConstraints(pattern=NAME_PATTERN, max_length=MAX_NAME_CHARS),
    AfterValidator(_not_dots),
]
Text = Annotated[str, StringConstraints(max_length=MAX_TEXT_CHARS)]
Key = Annotated[str, StringConstraints(max_length=MAX_NAME_CHARS)]  # a reference to a name


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# ----------------------------------------------------------------------------- cross-field checks

# Validation context key: models skip their cross-field checks, so that placer.io can run every
# model's checks after the fields validate and list all problems at once (with its own, the
# catalog's and the model library's), instead of pydantic stopping at the first model that fails.
DEFER_CROSS_FIELD = "placer_defer_cross_field"


class CrossFieldErrors(ValueError):
    """Several problems one model's cross-field check found, each `field.path: message`
    relative to that model. pydantic carries it as one error; placer.io lists one line each."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


def check_cross_field(model: Any, info: ValidationInfo) -> Any:
    """The body of every cross-field model validator: raise all of `model.cross_field_problems()`
    (one problem: a plain ValueError, so messages read as before), unless deferred."""
    if info.context and info.context.get(DEFER_CROSS_FIELD):
        return model
    problems = model.cross_field_problems()
    if len(problems) == 1:
        raise ValueError(problems[0])
    if problems:
        raise CrossFieldErrors(problems)
    return model


# ----------------------------------------------------------------------------- catalog

# Units read the same in every catalog key (issue 14): `_gbps` and `_tbps` are bits per second
# (nic_gbps, line_rate_gbps, a route's capacity_gbps), a byte rate says `bytes` and `_gb` is a
# memory size in gigabytes. Keys renamed for it: old key -> (new key, unit). The old key is still
# read, with a deprecation warning (`placer validate`, report.md, plan.json, DeprecationWarning);
# both given with different values is an error.
RENAMED_GPU_KEYS: dict[str, tuple[str, str]] = {
    "nvlink_gbps_bidir": ("nvlink_gbytes_per_s_bidir", "GB/s"),
    "hbm_tbps": ("hbm_tbytes_per_s", "TB/s"),
}
RENAMED_KEYS_REMOVED_IN = "placer 0.3"


def renamed_key_warning(old: str) -> str:
    new, unit = RENAMED_GPU_KEYS[old]
    return (
        f"deprecated key: write '{new}' (same value, in {unit}); '_gbps' and '_tbps' name bits "
        f"per second in the catalog (nic_gbps), '{old}' goes away in {RENAMED_KEYS_REMOVED_IN}"
    )


def upgrade_gpu_keys(entry: dict[str, Any]) -> tuple[dict[str, Any], list[str], list[str]]:
    """A GPU catalog entry with renamed keys under their new names, the deprecated keys it
    used, and one `new_key: message` per key given under both names with different values."""
    out, used, conflicts = dict(entry), [], []
    for old, (new, unit) in RENAMED_GPU_KEYS.items():
        if old not in out:
            continue
        used.append(old)
        value = out.pop(old)
        if new not in out:
            out[new] = value
        elif out[new] != value:
            conflicts.append(
                f"{new}: {out[new]!r} and the deprecated '{old}': {value!r} are both given and "
                f"differ (one bandwidth in {unit}, under its new and its old name); keep '{new}'"
            )
    return out, used, conflicts


class GpuSpec(Strict):
    peak_tflops_bf16: Num = Field(gt=0, le=hi("tflops"), description="dense BF16 peak, TFLOP/s")
    hbm_gb: Num = Field(gt=0, le=hi("hbm_gb"))
    tdp_w: Num = Field(gt=0, le=hi("watts"))
    all_in_w: Num = Field(
        gt=0, le=hi("watts"), description="IT power per GPU incl. host, NICs, switches, W"
    )
    nvlink_gbytes_per_s_bidir: Num = Field(
        gt=0,
        le=hi("gbps"),
        description="scale-up (NVLink) bandwidth per GPU, GB/s (bytes), both directions summed; was nvlink_gbps_bidir",  # noqa: E501
    )
    nic_gbps: Num = Field(
        gt=0, le=hi("gbps"), description="scale-out NIC line rate per GPU, Gbit/s"
    )
    gpus_per_node: Int = Field(
        ge=1, le=hi("gpus_per_node"), description="scale-up (NVLink) domain size"
    )
    gpus_per_host: Int | None = Field(
        default=None,
        ge=1,
        le=hi("gpus_per_node"),
        description="GPUs per host (OS instance) that launch files address; null = the domain size (one host per domain)",  # noqa: E501
    )
    nics_per_node: Int | None = Field(
        default=None,
        ge=1,
        le=hi("nics_per_node"),
        description="scale-out NICs per node; null = one per GPU",
    )
    cuda_arch: Num | None = Field(
        default=None,
        gt=0,
        le=100,
        description="CUDA compute capability (e.g. 9.0); launch files use it for framework requirements",  # noqa: E501
    )
    matmul_efficiency: Num = Field(
        gt=0,
        le=1,
        description="e_max: achievable fraction of peak for large GEMMs (placer.perf.compute; fitted, see the catalog)",  # noqa: E501
    )
    matmul_half_dim: Num = Field(
        default=0.0,
        ge=0,
        le=hi("model_dim"),
        description="GEMM size d_half: e = e_max d / (d + d_half), d the smallest matrix dimension a TP rank sees",  # noqa: E501
    )
    attention_efficiency: Num = Field(
        gt=0,
        le=1,
        description="fraction of peak for the attention core (flash / fused softmax), on 4 s h FLOPs per token",  # noqa: E501
    )
    hbm_tbytes_per_s: Num = Field(
        gt=0,
        le=hi("gbps"),
        description="HBM bandwidth, TB/s (bytes; memory-bound operators and the optimizer step); was hbm_tbps",  # noqa: E501
    )
    hbm_efficiency: Num = Field(
        default=0.85,
        gt=0,
        le=1,
        description="achievable fraction of HBM bandwidth for element-wise kernels (default 0.85: assumption)",  # noqa: E501
    )
    fp8_gemm_speedup: Num = Field(
        default=1.0,
        ge=1,
        le=100,
        description="GEMM speed-up of FP8 over BF16 (1 = no FP8 tensor cores)",
    )
    tp_comm_overlap: Num = Field(
        default=0.0,
        ge=0,
        le=1,
        description="fraction of tensor-parallel communication hidden under compute when job.overlap.tp_comm (built-in catalog: fitted on the H100 table, reused elsewhere as an assumption)",  # noqa: E501
    )
    moe_layer_host_s: Num = Field(
        default=0.0,
        ge=0,
        le=1,
        description="seconds of host (CPU) time exposed per MoE layer forward (and recomputed forward) when the job runs the MoE layers eagerly (job.moe_cuda_graphs false): Megatron-Core's dispatchers copy the tokens-per-expert counts to the host every MoE layer, which drains the GPU's queue, so the kernels after it wait for the host to launch them (placer.perf.compute.moe_host_s); 0 = not priced",  # noqa: E501
    )
    deepep_sm_fraction: Num = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="fraction of the GPU's SMs that the deepep dispatcher's dispatch / combine kernels occupy while they run (Megatron-Core moe_deepep_num_sms, 20 by default, over the GPU's SM count): under job.overlap.ep_comm the compute that hides them runs on the rest, so a layer's hidden all-to-all still costs this fraction of its time (placer.perf.compute.ep_exposed_s); 0 = not priced",  # noqa: E501
    )
    source: str

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not any(k in data for k in RENAMED_GPU_KEYS):
            return data
        data, used, conflicts = upgrade_gpu_keys(data)
        if len(conflicts) == 1:
            raise ValueError(conflicts[0])
        if conflicts:
            raise CrossFieldErrors(conflicts)
        for old in used:
            warnings.warn(f"{old}: {renamed_key_warning(old)}", DeprecationWarning, stacklevel=2)
        return data

    # the old attribute names, for code written against them (same values and units)
    @property
    def nvlink_gbps_bidir(self) -> float:
        warnings.warn(
            "GpuSpec.nvlink_gbps_bidir: renamed nvlink_gbytes_per_s_bidir",
            DeprecationWarning,
            stacklevel=2,
        )  # noqa: E501
        return self.nvlink_gbytes_per_s_bidir

    @property
    def hbm_tbps(self) -> float:
        warnings.warn(
            "GpuSpec.hbm_tbps: renamed hbm_tbytes_per_s", DeprecationWarning, stacklevel=2
        )
        return self.hbm_tbytes_per_s


class OpticSpec(Strict):
    line_rate_gbps: Num = Field(
        gt=0, le=hi("gbps"), description="line rate of one wave, Gbit/s per direction"
    )
    reach_km: Num = Field(gt=0, le=hi("reach_km"))
    module_w: Num = Field(ge=0, le=hi("watts"))
    grid_ghz: Num = Field(gt=0, le=hi("ghz"))
    module_cost_usd: Num = Field(ge=0, le=hi("usd_per_unit"))
    source: str


class NetworkSpec(Strict):
    fiber_us_per_km: Num = Field(gt=0, le=hi("per_km"))
    c_band_ghz: Num = Field(gt=0, le=hi("ghz"))
    wave_payload_efficiency: Num = Field(gt=0, le=1)
    amplifier_spacing_km: Num = Field(gt=0, le=hi("per_km"))
    intra_site_latency_s: Num = Field(ge=0, le=hi("seconds"))
    nic_efficiency: Num = Field(gt=0, le=1)
    nvlink_efficiency: Num = Field(gt=0, le=1)
    source: str


class CostSpec(Strict):
    router_port_usd: Num = Field(ge=0, le=hi("usd_per_unit"))
    mux_usd: Num = Field(ge=0, le=hi("usd_per_unit"))
    amplifier_usd: Num = Field(ge=0, le=hi("usd_per_unit"))
    amplifier_w: Num = Field(ge=0, le=hi("watts"))
    energy_usd_per_mwh: Num = Field(ge=0, le=hi("usd_per_mwh"))
    amortization_years: Num = Field(gt=0, le=hi("years"))
    source: str


class ResilienceSpec(Strict):
    optcc_eps: Num = Field(
        ge=0, le=hi("slowdown"), description="OptCC time over the lower bound, minus one"
    )
    source: str


class MemorySpec(Strict):
    reserve_gb: Num = Field(ge=0, le=hi("memory_gb"))
    source: str


class PlausibilitySpec(Strict):
    """Ceilings for warnings: values past them validate but are most likely typos."""

    max_route_km: Num = Field(gt=0, le=hi("route_km"))
    max_site_mw: Num = Field(gt=0, le=hi("power_mw"))
    max_pue: Num = Field(ge=1, le=hi("pue"))
    vacuum_us_per_km: Num = Field(
        gt=0, le=hi("per_km"), description="speed of light in vacuum: a latency floor"
    )
    source: str


class PrecisionSpec(Strict):
    fp8_peak_factor: Num = Field(
        gt=0, le=100, description="dense FP8 peak over the dense BF16 peak (job.precision fp8)"
    )
    source: str


class Catalog(Strict):
    gpus: dict[str, GpuSpec]
    optics: dict[str, OpticSpec]
    network: NetworkSpec
    costs: CostSpec
    memory: MemorySpec
    resilience: ResilienceSpec
    plausibility: PlausibilitySpec
    precision: PrecisionSpec

    def channels_per_pair(self, optic: str) -> int:
        """DWDM channels one fiber pair carries for this optic's grid spacing."""
        return int(self.network.c_band_ghz // self.optics[optic].grid_ghz)


# ----------------------------------------------------------------------------- model


class MoESpec(Strict):
    """Mixture-of-experts FFN (Megatron-Core MoE: --num-experts, --moe-router-topk,
    --moe-ffn-hidden-size, --moe-shared-expert-intermediate-size, --moe-layer-freq)."""

    experts: Int = Field(ge=1, le=hi("model_dim"), description="routed experts per MoE layer")
    top_k: Int = Field(ge=1, le=hi("model_dim"), description="routed experts per token")
    expert_ffn_hidden: Int = Field(ge=1, le=hi("model_dim"), description="FFN width of one expert")
    shared_experts: Int = Field(
        default=0, ge=0, le=hi("model_dim"), description="experts every token goes through"
    )
    shared_expert_ffn_hidden: Int | None = Field(
        default=None,
        ge=1,
        le=hi("model_dim"),
        description="width of one shared expert; null = expert_ffn_hidden",
    )
    first_dense_layers: Int = Field(
        default=0,
        ge=0,
        le=hi("model_dim"),
        description="leading layers with the dense FFN (ffn_hidden)",
    )
    layer_freq: Int = Field(
        default=1,
        ge=1,
        le=hi("model_dim"),
        description="after the dense layers, every layer_freq-th layer is MoE (the others dense)",
    )
    router: Literal["softmax", "sigmoid"] = Field(
        default="softmax", description="router score function (--moe-router-score-function)"
    )
    router_expert_bias: bool = Field(
        default=False,
        description="auxiliary-loss-free balancing bias (DeepSeek-V3; --moe-router-enable-expert-bias)",  # noqa: E501
    )
    max_nodes_per_token: Int | None = Field(
        default=None,
        ge=1,
        le=hi("model_dim"),
        description="node-limited routing: a token's experts lie on at most this many nodes of the EP group (DeepSeek-V3: 4, arXiv 2412.19437 section 2.1.2; Megatron --moe-router-num-groups = nodes, --moe-router-group-topk = this); null = any node",  # noqa: E501
    )

    @model_validator(mode="after")
    def _topk(self) -> MoESpec:
        if self.top_k > self.experts:
            raise ValueError(f"top_k: {self.top_k} exceeds experts ({self.experts})")
        return self

    @property
    def shared_ffn(self) -> int:
        return self.shared_experts * (self.shared_expert_ffn_hidden or self.expert_ffn_hidden)


class MLASpec(Strict):
    """Multi-head latent attention (DeepSeek-V2/V3): low-rank Q and joint KV compression."""

    q_lora_rank: Int | None = Field(
        default=None, ge=1, le=hi("model_dim"), description="null = no query compression"
    )
    kv_lora_rank: Int = Field(ge=1, le=hi("model_dim"))
    qk_nope_head_dim: Int = Field(ge=1, le=hi("model_dim"))
    qk_rope_head_dim: Int = Field(ge=0, le=hi("model_dim"))
    v_head_dim: Int = Field(ge=1, le=hi("model_dim"))


class ModelSpec(Strict):
    name: Name
    layers: Int = Field(ge=1, le=hi("model_dim"))
    hidden: Int = Field(ge=1, le=hi("model_dim"))
    heads: Int = Field(ge=1, le=hi("model_dim"))
    kv_heads: Int | None = Field(
        default=None, ge=1, le=hi("model_dim"), description="GQA; null = heads"
    )
    ffn_hidden: Int | None = Field(
        default=None, ge=1, le=hi("model_dim"), description="null = 4 * hidden"
    )
    gated_ffn: bool = False
    head_dim: Int | None = Field(
        default=None, ge=1, le=hi("model_dim"), description="per-head width; null = hidden / heads"
    )
    moe: MoESpec | None = Field(default=None, description="mixture-of-experts FFN; null = dense")
    mla: MLASpec | None = Field(
        default=None, description="multi-head latent attention (DeepSeek); null = MHA/GQA"
    )
    vocab: Int = Field(ge=1, le=hi("model_dim"))
    seq_len: Int = Field(ge=1, le=hi("seq_len"))
    tied_embeddings: bool = False
    rotary: bool = Field(
        default=False,
        description="rotary position embeddings (Llama); false = learned absolute positions (GPT)",
    )
    description: Text | None = None
    source: Text | None = None
    published_params_b: Num | None = Field(
        default=None,
        gt=0,
        le=hi("model_dim"),
        description="published parameter count, billions (for tests)",
    )
    published_active_params_b: Num | None = Field(
        default=None,
        gt=0,
        le=hi("model_dim"),
        description="published parameters active per token (MoE), billions (for tests)",
    )

    @model_validator(mode="after")
    def _heads_divide(self, info: ValidationInfo) -> ModelSpec:
        return check_cross_field(self, info)

    def cross_field_problems(self) -> list[str]:
        out = []
        if self.hidden % self.heads:
            out.append(f"hidden: {self.hidden} is not divisible by heads ({self.heads})")
        if self.kv_heads is not None and self.heads % self.kv_heads:
            out.append(
                f"kv_heads: heads ({self.heads}) is not divisible by kv_heads ({self.kv_heads})"
            )
        return out

    @property
    def kv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def hd(self) -> int:
        """Per-head width (Qwen3: 128 with 64 heads on hidden 4096, so q is wider than h)."""
        return self.head_dim or self.hidden // self.heads

    def is_moe_layer(self, i: int) -> bool:
        """Layer i (0-based) has the MoE FFN: after the dense ones, every layer_freq-th."""
        e = self.moe
        return (
            e is not None
            and i >= e.first_dense_layers
            and (i - e.first_dense_layers) % e.layer_freq == 0
        )

    def moe_layers_in(self, first: int, count: int) -> int:
        if self.moe is None:
            return 0
        return sum(self.is_moe_layer(i) for i in range(first, first + count))

    @property
    def ffn(self) -> int:
        return self.ffn_hidden or 4 * self.hidden


# ----------------------------------------------------------------------------- instance


class Site(Strict):
    name: Name
    gpu: Key = Field(description="key of the GPU catalog")
    gpus: Int = Field(ge=0, le=hi("gpus"), description="accelerators available to this job")
    gpus_per_node: Int | None = Field(
        default=None,
        ge=1,
        le=hi("gpus_per_node"),
        description="scale-up (NVLink) domain size; default: GPU catalog",
    )
    gpus_per_host: Int | None = Field(
        default=None,
        ge=1,
        le=hi("gpus_per_node"),
        description="GPUs per host (OS instance); default: GPU catalog",
    )
    hosts: list[Annotated[str, Field(pattern=HOST_PATTERN, max_length=MAX_NAME_CHARS)]] | None = (
        Field(
            default=None,
            description="real host names of the site in order (host i = GPUs i*gpus_per_host ...); launch files use them instead of placeholders",  # noqa: E501
        )
    )
    hostfile: Text | None = Field(
        default=None,
        description="file with one host name per line ('#' comments), relative to the instance file; alternative to hosts",  # noqa: E501
    )
    power_mw: Num | None = Field(
        default=None, ge=0, le=hi("power_mw"), description="null = unlimited"
    )
    pue: Num = Field(default=1.2, ge=1.0, le=hi("pue"))
    gpu_usd_per_hour: Num | None = Field(
        default=None,
        ge=0,
        le=hi("usd_per_unit"),
        description="price of one GPU-hour at this site (rent, or capex amortized plus upkeep); charged per node in use "  # noqa: E501
        "by cost_per_token; null = the GPUs are sunk cost",
    )
    lat: Num | None = Field(
        default=None, ge=-90, le=90, description="optional latitude (degrees), for plan pictures"
    )
    lon: Num | None = Field(
        default=None, ge=-180, le=180, description="optional longitude (degrees), for plan pictures"
    )


class Route(Strict):
    sites: tuple[Key, Key]
    km: Num = Field(gt=0, le=hi("route_km"), description="fiber route length")
    latency_ms: Num | None = Field(
        default=None, ge=0, le=hi("latency_ms"), description="one-way; default km * 4.9 us"
    )
    fiber_pairs: Int = Field(default=1, ge=0, le=hi("fiber_pairs"))
    capacity_gbps: Num = Field(
        default=0,
        ge=0,
        le=hi("capacity_gbps"),
        description="existing capacity per direction, Gbit/s",
    )
    max_waves: Int | None = Field(default=None, ge=0, le=hi("waves"))
    fiber_usd_per_pair_km_year: Num | None = Field(
        default=None,
        ge=0,
        le=hi("usd_per_unit"),
        description="optional fiber lease price (opex) per lit pair-km-year",
    )

    @field_validator("sites")
    @classmethod
    def _distinct(cls, v: tuple[str, str]) -> tuple[str, str]:
        if v[0] == v[1]:
            raise ValueError(f"a route joins two different sites, got [{v[0]}, {v[1]}]")
        return v

    @property
    def key(self) -> tuple[str, str]:
        a, b = self.sites
        return (a, b) if a <= b else (b, a)


class Sync(Strict):
    mode: SyncMode | list[SyncMode] = "synchronous"
    every_steps: Int = Field(
        default=1, ge=1, le=hi("every_steps"), description="outer sync interval H (diloco modes)"
    )
    bits: Int = Field(default=16, ge=1, le=32, description="bits per value across sites")

    @property
    def modes(self) -> list[SyncMode]:
        return list(self.mode) if isinstance(self.mode, list) else [self.mode]

    @field_validator("mode")
    @classmethod
    def _nonempty(cls, v: Any) -> Any:
        if isinstance(v, list) and not v:
            raise ValueError("list of sync modes must not be empty")
        return v


Candidates = Annotated[
    list[Annotated[Int, Field(le=hi("parallel_degree"))]], Field(max_length=int(hi("candidates")))
]


class Parallelism(Strict):
    tp: Candidates | None = None
    pp: Candidates | None = None
    dp: Candidates | None = None
    micro_batch: Candidates | None = None
    cp: Candidates | None = Field(
        default=None,
        description="context-parallel degrees (ring attention inside a site); null = [1]",
    )
    ep: Candidates | None = Field(
        default=None,
        description="expert-parallel degrees (inside a site); null = [1] for a dense model, the powers of two dividing the expert count up to the largest scale-up domain for an MoE model",  # noqa: E501
    )
    etp: Candidates | None = Field(
        default=None,
        description="expert tensor-parallel sizes (Megatron-Core --expert-tensor-parallel-size) of folded expert layouts the optimizer may choose besides the unfolded ones: the expert layers run expert TP etp and the ep x etp expert group is drawn from a pipeline stage's tp x cp x dp ranks (Megatron-Core MoE parallel folding), a replica stage of lcm(tp x cp, ep x etp) GPUs; null = no folded layouts (the unfolded replica stage of tp x cp x ep GPUs, expert TP 1)",  # noqa: E501
    )
    dp_shard: Candidates = Field(
        default=[1],
        description="FSDP / ZeRO-3 shard-group sizes the optimizer may choose (torchtitan data_parallel_shard_degree): each replica is dp_shard data-parallel ranks inside one site that shard parameters, gradients and optimizer state (per-layer all-gather and reduce-scatter, overlapped with compute); the dp replicas form the replicate group (data_parallel_replicate_degree), across sites: HSDP. default [1]: no FSDP; needs ep = 1",  # noqa: E501
    )
    stage_layers: (
        Annotated[
            list[Annotated[list[Annotated[Int, Field(le=hi("model_dim"))]], Field(min_length=1)]],
            Field(max_length=int(hi("candidates"))),
        ]
        | Literal["even", "all"]
        | None
    ) = Field(
        default=None,
        description="candidate layer splits (each: layers per pipeline stage, summing to the model's layers; a pp is searched only with its listed splits, pp defaults to their lengths); 'even' (the even split only); 'all' (every split: enumerated when few, else searched over candidates with a bound on the rest); null = every split when at most 16, else the even split and the min-max split of each GPU-type sequence (README 'Layers per stage')",  # noqa: E501
    )
    virtual_stages: Candidates = Field(
        default=[1],
        description="interleaved 1F1B model chunks per pipeline rank the optimizer may choose "
        "(Megatron's virtual pipeline size); default [1]: no interleaving unless asked, as "
        "Megatron runs by default; e.g. [1, 2, 4] lets the optimizer weigh the smaller "
        "bubble against v times the pipeline messages and more in-flight activations",
    )
    pipeline_schedule: (
        Annotated[list[PipelineSchedule], Field(min_length=1, max_length=2)] | None
    ) = Field(
        default=None,
        description="pipeline schedules the optimizer may choose: '1f1b' (1F1B, interleaved "
        "with virtual_stages > 1) and 'dualpipev' (DeepSeek's DualPipeV, torchtitan "
        "pipeline_parallel_schedule DualPipeV: 2 chunks per rank in a V, pp >= 2, at least "
        "2 x pp micro-batches, virtual_stages 1; no Megatron export); null = ['1f1b']",
    )

    @field_validator(
        "tp", "pp", "dp", "micro_batch", "cp", "ep", "etp", "virtual_stages", "dp_shard"
    )
    @classmethod
    def _positive(cls, v: list[int] | None) -> list[int] | None:
        if v is not None:
            if not v:
                raise ValueError("candidate list must not be empty (use null for all)")
            if min(v) < 1:
                raise ValueError(f"candidates must be >= 1, got {min(v)}")
        return v

    @field_validator("stage_layers")
    @classmethod
    def _splits(cls, v: list[list[int]] | str | None) -> list[list[int]] | str | None:
        if isinstance(v, list):
            if not v:
                raise ValueError("candidate list must not be empty (use null for all)")
            for i, split in enumerate(v):
                if min(split) < 1:
                    raise ValueError(
                        f"split {i}: every stage needs at least one layer, got {split}"
                    )
        return v


class Overlap(Strict):
    """What the training framework overlaps with compute (Megatron-LM / Transformer Engine).
    The defaults are what Megatron-Core recipes run with."""

    grad_reduce: bool = Field(
        default=True,
        description="--overlap-grad-reduce: the gradient reduce runs in buckets under the last micro-batch's backward",  # noqa: E501
    )
    param_gather: bool = Field(
        default=True,
        description="--overlap-param-gather (ZeRO-1): the parameter all-gather runs under the next step's first forward",  # noqa: E501
    )
    tp_comm: bool = Field(
        default=True,
        description="--tp-comm-overlap (needs sequence_parallel): the GPU catalog tp_comm_overlap fraction of TP communication is hidden",  # noqa: E501
    )
    ep_comm: bool = Field(
        default=False,
        description="--overlap-moe-expert-parallel-comm (MoE, EP > 1; Megatron-Core's default is off): the 1F1B phase runs one micro-batch's forward with another's backward, each MoE layer's token all-to-all hidden under the other direction's compute of that layer, only the excess exposed; Megatron-Core needs no full recompute and, with pipelining, virtual_stages > 1 (elsewhere the all-to-all stays exposed)",  # noqa: E501
    )


class Fsdp(Strict):
    """How FSDP2 (torch.distributed.fsdp.fully_shard) runs when job.parallelism.dp_shard > 1."""

    reshard_after_forward: bool = Field(
        default=True,
        description="free each layer's gathered parameters after its forward and all-gather them again in the backward (fully_shard's default; torchtitan fsdp_reshard_after_forward 'always'); false keeps the stage's parameters gathered from forward to backward (more memory, one all-gather less per micro-batch; 'never')",  # noqa: E501
    )


class Job(Strict):
    model: Annotated[str, StringConstraints(max_length=4096)] | ModelSpec
    global_batch: Int = Field(
        ge=1, le=hi("global_batch"), description="sequences per optimizer step"
    )
    seq_len: Int | None = Field(default=None, ge=1, le=hi("seq_len"))
    precision: Precision = "bf16"
    gpus: Int | None = Field(
        default=None, ge=1, le=hi("gpus"), description="exact GPU count; null = any"
    )
    recompute: Recompute = "selective"
    zero1: bool = Field(default=True, description="shard optimizer state over dp (ZeRO-1)")
    sequence_parallel: bool = Field(
        default=True, description="Megatron sequence parallelism with TP (--sequence-parallel)"
    )
    overlap: Overlap = Overlap()
    fsdp: Fsdp = Fsdp()
    expert_load_imbalance: Num = Field(
        default=1.1,
        ge=1.0,
        le=hi("slowdown"),
        description="MoE: tokens of the busiest expert-parallel rank / the mean; it scales the expert GEMMs, activations and all-to-all. assumption: 1.1, i.e. MaxVio = 0.1 in the metric of Wang et al. (arXiv 2408.15664), not a published per-rank figure for these models",  # noqa: E501
    )
    moe_dispatcher: Literal["alltoall", "deepep"] = Field(
        default="alltoall",
        description="MoE token dispatcher: alltoall (--moe-token-dispatcher-type alltoall: each token-expert copy to its EP rank) or deepep (--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep: one copy per destination node over the NICs, then NVLink fan-out, arXiv 2412.19437 section 3.2.2)",  # noqa: E501
    )
    moe_dispatch_precision: Literal["bf16", "fp8"] = Field(
        default="bf16",
        description="wire precision of the forward token dispatch (fp8: 1 byte per value plus an fp32 scale per 128, DeepSeek-V3's FP8 dispatch with BF16 combine, arXiv 2412.19437 section 3.3; needs precision fp8 and moe_dispatcher deepep)",  # noqa: E501
    )
    moe_cuda_graphs: bool = Field(
        default=False,
        description="MoE: the router and the dispatcher's preprocessing run captured in CUDA graphs (Megatron-Core --cuda-graph-impl transformer_engine --cuda-graph-scope moe_router moe_preprocess, or full_iteration), so no host sync stalls the GPU per MoE layer; false (Megatron-Core's default, and what placer's launch files run) prices the catalog's moe_layer_host_s per MoE layer forward",  # noqa: E501
    )
    replica_schedule: Literal["lockstep", "staggered"] = Field(
        default="lockstep",
        description="lockstep: every replica sends its stage boundary's message at the same pipeline tick, so the replicas whose chains cross a route share it tick by tick (Megatron's synchronous 1F1B); staggered: replicas are offset so that they time-share the routes and only the step-average route load binds (Atlas, arXiv 2411.14458; needs a launcher that staggers the replicas)",  # noqa: E501
    )
    sync: Sync = Sync()
    parallelism: Parallelism = Parallelism()

    @model_validator(mode="after")
    def _moe_settings(self, info: ValidationInfo) -> Job:
        return check_cross_field(self, info)

    def cross_field_problems(self) -> list[str]:
        """Combinations Megatron-Core refuses (TransformerConfig.__post_init__)."""
        out = []
        if self.overlap.ep_comm and self.recompute == "full":
            out.append(
                "overlap.ep_comm: Megatron-Core's --overlap-moe-expert-parallel-comm needs "
                "recompute 'selective' or 'none', got 'full'"
            )
        if self.moe_cuda_graphs and self.recompute == "full":
            out.append(
                "moe_cuda_graphs: Megatron-Core captures the MoE router and preprocessing in "
                "CUDA graphs only with recompute 'selective' or 'none' (full recompute needs a "
                "full-iteration graph), got 'full'"
            )
        if self.moe_dispatch_precision == "fp8" and (
            self.precision != "fp8" or self.moe_dispatcher != "deepep"
        ):
            out.append(
                "moe_dispatch_precision: fp8 needs precision: fp8 and moe_dispatcher: deepep, got "
                f"precision: {self.precision}, moe_dispatcher: {self.moe_dispatcher}"
            )
        return out


class Objective(Strict):
    minimize: Literal["step_time", "cost", "cost_per_token"] = "step_time"
    max_step_time_s: Num | None = Field(default=None, gt=0, le=hi("step_time_s"))
    max_cost_usd: Num | None = Field(default=None, ge=0, le=hi("usd"))
    within_fastest: Num | None = Field(
        default=None,
        ge=0,
        le=hi("slowdown"),
        description="with minimize: cost, the cheapest plan whose step is at most (1 + this) x the fastest "  # noqa: E501
        "step (lexicographic: the fastest step is solved first, then the cheapest plan within it)",
    )

    @model_validator(mode="after")
    def _cost_needs_time(self, info: ValidationInfo) -> Objective:
        return check_cross_field(self, info)

    def cross_field_problems(self) -> list[str]:
        out = []
        if self.minimize == "cost" and self.max_step_time_s is None and self.within_fastest is None:
            out.append(
                "max_step_time_s: required when minimize is 'cost' unless within_fastest is given "
                "(otherwise buying nothing is optimal)"
            )
        if self.within_fastest is not None and self.minimize != "cost":
            out.append(f"within_fastest: goes with minimize: cost, got minimize: {self.minimize}")
        return out


class Resilience(Strict):
    survive: list[Literal["wave", "fiber_pair", "nic"]] = []
    collective: Literal["ring", "optcc"] = "optcc"
    max_slowdown: Num = Field(default=0.05, ge=0, le=hi("slowdown"))
    nic_failure_rate: Num | None = Field(default=None, ge=0, le=1)


MAX_THREADS = (
    1024  # solver threads accepted (CP-SAT rejects absurd worker counts as an invalid model)
)


class SolverOptions(Strict):
    backend: Backend = "cpsat"
    time_limit_s: float = Field(default=60, gt=0, allow_inf_nan=False)
    threads: int | None = Field(
        default=None,
        ge=1,
        le=MAX_THREADS,
        description=f"solver threads, 1 to {MAX_THREADS}; null = all cores (CP-SAT: at least its 8-worker portfolio, time-sliced on fewer cores)",  # noqa: E501
    )
    seed: Int = Field(default=0, ge=0, le=hi("seed"))
    max_sites_per_replica: Int = Field(
        default=2,
        ge=1,
        le=hi("sites_per_replica"),
        description="pipeline chains visit at most this many sites",
    )
    paths_per_pair: Int = Field(
        default=2,
        ge=1,
        le=hi("paths_per_pair"),
        description="candidate paths per site pair for routing inter-site traffic (the k "
        "lowest-latency simple paths of the route graph); 1 = shortest path only",
    )
    symmetry: bool = Field(
        default=False,
        description="break the symmetry between interchangeable sites (equal sites, "
        "equally connected): the objective solve orders their replica-stages, the "
        "tie-break and the plan are unchanged. Off by default: measured slower as often "
        "as faster (benchmarks/README.md, symmetry_bench.py)",
    )
    options: dict[str, Any] = Field(default_factory=dict, description="passed to the backend")


class Instance(Strict):
    name: Name
    description: Text | None = None
    sites: list[Site] = Field(min_length=1, max_length=MAX_SITES)
    routes: list[Route] = Field(default=[], max_length=MAX_ROUTES)
    job: Job
    objective: Objective = Objective()
    resilience: Resilience | None = None
    solver: SolverOptions = SolverOptions()
    catalog: dict[str, Any] = Field(default_factory=dict, description="additions/overrides")

    @model_validator(mode="after")
    def _topology(self, info: ValidationInfo) -> Instance:
        return check_cross_field(self, info)

    def cross_field_problems(self) -> list[str]:
        out = []
        names = [s.name for s in self.sites]
        seen: set[str] = set()
        for i, n in enumerate(names):
            if n in seen:
                out.append(f"sites[{i}].name: duplicate site name '{n}'")
            seen.add(n)
        keys: dict[tuple[str, str], int] = {}
        for i, r in enumerate(self.routes):
            for j, end in enumerate(r.sites):
                if end not in seen:
                    out.append(
                        f"routes[{i}].sites[{j}]: unknown site '{end}' (known: {', '.join(names)})"
                    )
            if r.key in keys:
                out.append(
                    f"routes[{i}].sites: duplicate of routes[{keys[r.key]}] ({r.key[0]}-{r.key[1]})"
                )
            keys.setdefault(r.key, i)
        return out

    def site(self, name: str) -> Site:
        """The site by name, from an index (the performance model looks sites up ~10^6
        times in one model build on 8 sites: the scan took 5 s of a 40 s build). The index
        remembers the list it was built from, so a copy with other sites rebuilds it."""
        cached = self.__dict__.get("_site_index")
        if cached is None or cached[0] is not self.sites:
            cached = (self.sites, {s.name: s for s in self.sites})
            self.__dict__["_site_index"] = cached  # not a field: frozen models allow this
        return cached[1][name]


# ----------------------------------------------------------------------------- plan


class PlanParallelism(Strict):
    tp: Int = Field(ge=1, le=hi("parallel_degree"))
    pp: Int = Field(ge=1, le=hi("parallel_degree"))
    dp: Int = Field(ge=1, le=hi("parallel_degree"))
    micro_batch: Int = Field(ge=1, le=hi("parallel_degree"))
    num_micro_batches: Int | None = Field(default=None, ge=1, le=hi("global_batch"))
    cp: Int | None = Field(
        default=None, ge=1, le=hi("parallel_degree"), description="context parallel; null = 1"
    )
    ep: Int | None = Field(
        default=None,
        ge=1,
        le=hi("parallel_degree"),
        description="expert parallel, null = 1; a replica is tp x cp x ep GPUs per stage and Megatron's data-parallel size is dp x ep (unless etp is set)",  # noqa: E501
    )
    etp: Int | None = Field(
        default=None,
        ge=1,
        le=hi("parallel_degree"),
        description="expert tensor parallel (Megatron-Core --expert-tensor-parallel-size) of a folded expert layout; null = unfolded (expert TP 1, a replica stage of tp x cp x ep GPUs). Set: the ep x etp expert group is drawn from the stage's tp x cp x dp ranks, a replica stage is lcm(tp x cp, ep x etp) GPUs and Megatron's data-parallel size is dp x lcm(tp x cp, ep x etp) / (tp x cp)",  # noqa: E501
    )
    dp_shard: Int | None = Field(
        default=None,
        ge=1,
        le=hi("parallel_degree"),
        description="FSDP shard group, null = 1: a replica is tp x cp x dp_shard GPUs per stage inside one site whose dp_shard data-parallel ranks shard parameters, gradients and optimizer state (torchtitan data_parallel_shard_degree); the dp replicas are the replicate group (data_parallel_replicate_degree = dp): HSDP",  # noqa: E501
    )
    virtual_stages: Int = Field(
        default=1,
        ge=1,
        le=hi("parallel_degree"),
        description="interleaved 1F1B: model chunks per pipeline rank (Megatron's virtual "
        "pipeline size); rank k's stage_layers[k] layers split evenly into them (or as "
        "chunk_layers says), model stage c*pp + k being chunk c of rank k",
    )
    chunk_layers: list[Annotated[Int, Field(ge=1, le=hi("model_dim"))]] | None = Field(
        default=None,
        max_length=int(hi("model_dim")),
        description="interleaved 1F1B with uneven chunks: the decoder layers of each of the "
        "virtual_stages x pp model stages in model order (entry c*pp + k is chunk c of rank k, "
        "Megatron-Core's --pipeline-model-parallel-layout order), each >= 1, rank k's chunks "
        "summing to stage_layers[k]; null = every chunk of rank k holds stage_layers[k] / "
        "virtual_stages layers (which must then divide)",
    )
    pipeline_schedule: PipelineSchedule | None = Field(
        default=None,
        description="null or '1f1b': 1F1B (interleaved with virtual_stages > 1); 'dualpipev': "
        "DeepSeek's DualPipeV (torchtitan DualPipeV; placer.perf.dualpipe): each rank k holds "
        "2 model stages in a V, k and 2 pp - 1 - k (chunk_layers then lists the 2 pp model "
        "stages in model order, null = each rank's layers halved); needs pp >= 2, "
        "virtual_stages 1 and num_micro_batches >= 2 pp",
    )


class ReplicaGroup(Strict):
    count: Int = Field(ge=1, le=hi("parallel_degree"))
    stage_sites: list[Key] = Field(min_length=1, max_length=int(hi("model_dim")))


class Link(Strict):
    sites: tuple[Key, Key]
    waves: Int = Field(ge=0, le=hi("waves"))
    optic: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        a, b = self.sites
        return (a, b) if a <= b else (b, a)


Phase = Literal["pipeline", "data_parallel"]


class PathShare(Strict):
    via: list[Key] = Field(min_length=2, description="sites along the path, first to last")
    share: Num = Field(ge=0, le=1, description="fraction of the pair's bytes on this path")


class PairRouting(Strict):
    """How one site pair's traffic of one phase is split over paths of the route graph.
    Its latency is that of the slowest path listed (a split transfer ends when its last
    part arrives). Pairs not listed use their lowest-latency path."""

    phase: Phase
    sites: tuple[Key, Key]
    paths: list[PathShare] = Field(min_length=1)

    @model_validator(mode="after")
    def _shares(self, info: ValidationInfo) -> PairRouting:
        return check_cross_field(self, info)

    def cross_field_problems(self) -> list[str]:
        out = []
        total = sum(p.share for p in self.paths)
        if abs(total - 1.0) > 1e-6:
            out.append(f"paths: shares sum to {total:.6g}, must sum to 1")
        a, b = self.sites
        if a == b:
            out.append(f"sites: a pair needs two different sites, got {a} twice")
            return out  # the paths cannot run between one site and itself
        for i, p in enumerate(self.paths):
            if {p.via[0], p.via[-1]} != {a, b}:
                out.append(
                    f"paths[{i}].via: must run between {a} and {b}, got {p.via[0]} ... {p.via[-1]}"
                )
            if len(set(p.via)) != len(p.via):
                out.append(f"paths[{i}].via: visits a site twice")
        return out

    @property
    def key(self) -> tuple[Phase, tuple[str, str]]:
        a, b = self.sites
        return self.phase, ((a, b) if a <= b else (b, a))


class SolverInfo(Strict):
    backend: str
    seconds: float
    gap: float
    bound_step_time_s: float | None = None
    status: str | None = None
    configs_total: int | None = None
    configs_solved: int | None = None
    objective: float | None = None
    bound: float | None = None
    splits: str | None = Field(
        default=None,
        description="the layer splits `optimal` ranges over: all | listed | even | candidates, or several joined by + when shapes were searched differently (interleaved shapes, v > 1, search the even split only: e.g. listed+even) (README 'Layers per stage')",  # noqa: E501
    )
    lexicographic: dict[str, Any] | None = Field(
        default=None,
        description="objective.within_fastest: the fastest step, its status and the step limit used",  # noqa: E501
    )


class PlanWarning(Strict):
    kind: str = Field(
        description="implausible | unreachable | single_point_of_failure | unused_site | deprecated"
    )
    where: str = Field(description="field path or plan element")
    message: str


def dualpipev_problems(plan: Plan) -> list[str]:
    """Why a DualPipeV plan's pipeline cannot run (empty: it can): DualPipeV (DeepSeek's
    dualpipev.py, torch's ScheduleDualPipeV) holds exactly 2 stages per rank in a V, so
    pp >= 2 (one rank would be no pipeline), no interleaving on top (virtual_stages 1: the
    two chunks are the schedule's own), at least 2 pp micro-batches (DualPipeV.step asserts
    num_chunks >= num_ranks * 2; torch: at least as many micro-batches as stages) and the
    layers split into 2 pp chunks of >= 1 layer, rank k's chunks k and 2 pp - 1 - k summing
    to stage_layers[k]. Replica groups and the batch are checked with the other fields."""
    p = plan.parallelism
    out = []
    if p.pp < 2:
        out.append(f"parallelism.pipeline_schedule: dualpipev needs pp >= 2 (pp is {p.pp})")
    if p.virtual_stages > 1:
        out.append(
            f"parallelism.pipeline_schedule: dualpipev runs 2 chunks per rank of its own; "
            f"virtual_stages must be 1 (is {p.virtual_stages})"
        )
    m = p.num_micro_batches
    if m is not None and m < 2 * p.pp:
        out.append(
            f"parallelism.num_micro_batches: dualpipev needs at least 2 x pp = {2 * p.pp} "
            f"micro-batches, got {m}"
        )
    pp = len(plan.stage_layers)
    if p.chunk_layers is None:
        for k, n in enumerate(plan.stage_layers):
            if n % 2:
                out.append(
                    f"stage_layers[{k}]: {n} layers do not split into the 2 equal chunks of "
                    "dualpipev; parallelism.chunk_layers gives the 2 x pp chunks"
                )
    elif len(p.chunk_layers) != 2 * pp:
        out.append(
            f"parallelism.chunk_layers: {len(p.chunk_layers)} entries, dualpipev has "
            f"2 x pp = {2 * pp} model stages"
        )
    else:
        for k, n in enumerate(plan.stage_layers):
            a, b = p.chunk_layers[k], p.chunk_layers[2 * pp - 1 - k]
            if a + b != n:
                out.append(
                    f"parallelism.chunk_layers: rank {k}'s chunks [{k}] and "
                    f"[{2 * pp - 1 - k}] sum to {a + b}, stage_layers[{k}] is {n}"
                )
    return out


def chunk_layer_problems(chunks: list[int], stage_layers: list[int], pp: int, v: int) -> list[str]:
    """Why parallelism.chunk_layers does not describe the plan's pipeline (empty: it does):
    v x pp entries in model-stage order (chunk c of rank k at c pp + k, as Megatron-Core's
    PipelineParallelLayerLayout reads its stages), rank k's chunks summing to
    stage_layers[k]; every chunk >= 1 layer (placer prices a model stage by its decoder
    layers; Megatron-Core would accept an empty one, placer does not plan them)."""
    out = []
    if len(chunks) != v * pp:
        out.append(
            f"parallelism.chunk_layers: {len(chunks)} entries, virtual_stages x pp is "
            f"{v} x {pp} = {v * pp}"
        )
        return out
    for k, n in enumerate(stage_layers[:pp]):
        mine = [chunks[c * pp + k] for c in range(v)]
        if sum(mine) != n:
            where = ", ".join(f"[{c * pp + k}]" for c in range(v))
            out.append(
                f"parallelism.chunk_layers: rank {k}'s chunks {where} sum to {sum(mine)}, "
                f"stage_layers[{k}] is {n}"
            )
    return out


class Plan(Strict):
    instance: str | None = None
    status: Literal["optimal", "feasible", "infeasible", "time_limit"] | None = None
    parallelism: PlanParallelism
    stage_layers: list[Annotated[Int, Field(le=hi("model_dim"))]] = Field(
        min_length=1, max_length=int(hi("model_dim"))
    )
    replica_groups: list[ReplicaGroup] = Field(min_length=1)
    links: list[Link] = []
    routing: list[PairRouting] = Field(
        default_factory=list,
        description="split of inter-site traffic over paths; unlisted pairs use the shortest",
    )
    sync_mode: SyncMode | None = Field(default=None, description="chosen sync policy")
    step_time_s: float | None = None
    breakdown: dict[str, float] | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    cost: dict[str, float] | None = None
    power_mw: dict[str, float] | None = None
    solver: SolverInfo | None = None
    resilience: dict[str, Any] | None = Field(
        default=None, description="failure analysis (output only)"
    )
    warnings: list[PlanWarning] = Field(
        default_factory=list, description="what a planner should look at (output only)"
    )

    @model_validator(mode="after")
    def _shape(self, info: ValidationInfo) -> Plan:
        return check_cross_field(self, info)

    def cross_field_problems(self) -> list[str]:
        out = []
        p = self.parallelism
        if len(self.stage_layers) != p.pp:
            out.append(f"stage_layers: {len(self.stage_layers)} entries, parallelism.pp is {p.pp}")
        for k, n in enumerate(self.stage_layers):
            if n < 1:
                out.append(f"stage_layers[{k}]: every stage needs at least one layer, got {n}")
        v = p.virtual_stages
        dual = p.pipeline_schedule == "dualpipev"
        if dual:
            out += dualpipev_problems(self)
        elif p.chunk_layers is not None:
            out += chunk_layer_problems(p.chunk_layers, self.stage_layers, p.pp, v)
        if v > 1 and not dual:
            if p.pp == 1:
                out.append(f"parallelism.virtual_stages: {v} needs pipeline parallelism (pp is 1)")
            for k, n in enumerate(self.stage_layers):
                if p.chunk_layers is None and n % v:
                    out.append(
                        f"stage_layers[{k}]: {n} layers do not split into virtual_stages={v} "
                        "equal chunks (Megatron-Core's even split needs each rank's layers "
                        "divisible by the virtual pipeline size; parallelism.chunk_layers gives "
                        "uneven chunks, exported as --pipeline-model-parallel-layout)"
                    )
        total = sum(g.count for g in self.replica_groups)
        if total != p.dp:
            out.append(f"replica_groups: counts sum to {total}, parallelism.dp is {p.dp}")
        for i, g in enumerate(self.replica_groups):
            if len(g.stage_sites) != p.pp:
                out.append(
                    f"replica_groups[{i}].stage_sites: {len(g.stage_sites)} entries, parallelism.pp is {p.pp}"  # noqa: E501
                )
        return out
