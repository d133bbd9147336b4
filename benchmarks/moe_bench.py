"""MoE, expert and context parallelism: figures for benchmarks/README.md (issue 16).

    .venv/bin/python benchmarks/moe_bench.py

1. Parameter counts of the MoE library against the model cards.
2. The shipped DeepSeek-V3 two-site instance, solved by CP-SAT and the MILP.
3. DeepSeek-V3 on one 2048-GPU H100 site, PP 16, EP 8 ... 64 (EP over the NICs beyond 8),
   against DeepSeek's published 180K H800 GPU-hours per trillion tokens.
4. Context parallelism for Llama 3 405B at 32K tokens: CP 1 / 2 / 4 with TP 8, and where the
   ring attention exchange stops hiding under the attention core.
5. Published MoE runs (NVIDIA Megatron-Bridge performance tables, DeepSeek-V3 tech report)
   at their own layouts against the model's tokens/s/GPU (issue 16 items 2 and 6).

    .venv/bin/python benchmarks/moe_bench.py decompose   # each row's MoE layer by term, the gap
    .venv/bin/python benchmarks/moe_bench.py fit         # catalog moe_layer_host_s: fit / held out
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from placer.evaluate import evaluate
from placer.io import load_instance, load_model, problem_from_data
from placer.optimize.driver import solve
from placer.perf.flops import active_param_count, param_count
from placer.perf.step import balanced_chunk_layers, balanced_stage_layers

ROOT = Path(__file__).resolve().parent.parent
ACTIVE_WITH_EMBEDDING = {
    "deepseek-v3": True,
    "qwen3-235b-a22b": True,
    "mixtral-8x22b": True,
    "gpt-oss-120b": False,
}


def params_table() -> None:
    print("| model | total (B) | card | active (B) | card |")
    print("|---|---:|---:|---:|---:|")
    for name, with_emb in ACTIVE_WITH_EMBEDDING.items():
        m = load_model(name)
        print(
            f"| {name} | {param_count(m) / 1e9:.2f} | {m.published_params_b:g} | "
            f"{active_param_count(m, with_emb) / 1e9:.2f} | {m.published_active_params_b:g} |"
        )


def shipped_instance() -> None:
    path = ROOT / "instances" / "deepseek-v3-two-sites.yaml"
    print("\n| backend | status | seconds | step s | plan | tokens/s/GPU | MFU |")
    print("|---|---|---:|---:|---|---:|---:|")
    for backend in ("cpsat", "milp"):
        prob = load_instance(path)
        t = time.perf_counter()
        res = solve(prob, backend=backend, time_limit_s=120)
        dt = time.perf_counter() - t
        ev = evaluate(prob, res.plan)
        gpus = sum(ev.gpus_by_site.values())
        par = res.plan.parallelism
        print(
            f"| {backend} | {res.status} | {dt:.2f} | {ev.step_time_s:.3f} | "
            f"tp{par.tp} ep{par.ep} pp{par.pp} dp{par.dp} | "
            f"{ev.tokens_per_s / gpus:.0f} | {ev.mfu:.3f} |"
        )
    print("breakdown:", {k: round(v, 3) for k, v in ev.breakdown.items()})


def single_site(ep: int, precision: str) -> tuple[float, float, dict]:
    m = load_model("deepseek-v3")
    inst = {
        "name": "ds3-one-site",
        "sites": [{"name": "dc", "gpu": "h100-sxm", "gpus": 2048}],
        "job": {
            "model": "deepseek-v3",
            "global_batch": 15360 // 4,
            "recompute": "full",
            "precision": precision,
        },
    }
    prob = problem_from_data(inst)
    dp = 2048 // (16 * ep)
    plan = {
        "parallelism": {"tp": 1, "pp": 16, "dp": dp, "ep": ep, "micro_batch": 1},
        "stage_layers": list(balanced_stage_layers(m.layers, 16)),
        "replica_groups": [{"count": dp, "stage_sites": ["dc"] * 16}],
    }
    ev = evaluate(prob, plan)
    assert ev.feasible, ev.violations
    return ev.tokens_per_s / 2048, ev.step_time_s, ev.breakdown


def deepseek_one_site() -> None:
    published = 1e12 / (180e3 * 3600)  # tokens per GPU-second from 180K GPU-hours / 1T tokens
    print(f"\npublished (DeepSeek-V3, 2048 H800, FP8, DualPipe): {published:.0f} tokens/s/GPU")
    print("| EP | precision | step s | tokens/s/GPU | model / published | ep_comm_s |")
    print("|---:|---|---:|---:|---:|---:|")
    for precision in ("bf16", "fp8"):
        for ep in (8, 16, 32, 64):
            tok, step, bd = single_site(ep, precision)
            print(
                f"| {ep} | {precision} | {step:.2f} | {tok:.0f} | {tok / published:.2f} | "
                f"{bd.get('ep_comm_s', 0.0):.2f} |"
            )


def llama_cp() -> None:
    print("\nLlama 3 405B at seq 32768, 1024 H100, TP 8, PP 16, selective recompute")
    print("| CP | step s | tokens/s/GPU | cp_comm_s exposed | activations GB (stage 0) |")
    print("|---:|---:|---:|---:|---:|")
    from placer.perf.flops import config_stage_memory_bytes

    for cp in (1, 2, 4):
        dp = 1024 // (8 * 16 * cp)
        inst = {
            "name": "l3-cp",
            "sites": [{"name": "dc", "gpu": "h100-sxm", "gpus": 1024}],
            "job": {"model": "llama3-405b", "global_batch": 64, "seq_len": 32768},
        }
        prob = problem_from_data(inst)
        plan = {
            "parallelism": {"tp": 8, "pp": 16, "dp": dp, "cp": cp, "micro_batch": 1},
            "stage_layers": list(balanced_stage_layers(126, 16)),
            "replica_groups": [{"count": dp, "stage_sites": ["dc"] * 16}],
        }
        ev = evaluate(prob, plan)
        mem = config_stage_memory_bytes(prob.model, ev.config, 0)["activations"] / 1e9
        print(
            f"| {cp} | {ev.step_time_s:.2f} | {ev.tokens_per_s / 1024:.0f} | "
            f"{ev.breakdown.get('cp_comm_s', 0.0):.3f} | {mem:.1f} |"
        )


# ----------------------------------------------------------------------------- published runs

MB = "NVIDIA Megatron-Bridge docs/performance-summary-archive.md"
# Megatron-Bridge's MoE benchmarks "force-balance the token distribution among experts"
# (its performance-summary notes): expert_load_imbalance 1.0 for those rows. Settings not in
# the table (dispatcher, EP overlap, TP overlap, recompute) are read from the Megatron-Bridge
# release each container shipped (branch moefid4): commit f37f883a8 for 25.09 (the DeepSeek-V3
# perf script), tag v0.2.0 for 25.11, v0.3.0 for 26.02 (scripts/performance/configs/*, the
# recipes and model providers they call: a preset without moe_flex_dispatcher_backend runs the
# provider's alltoall dispatcher). Recompute: Qwen3's perf configs switch it off ('none');
# the others recompute chosen modules (layernorm, moe_act, mla_up_proj, mlp), priced as
# placer's 'selective'.
# CUDA graphs per row (`graphs`, job.moe_cuda_graphs) from Megatron-Bridge's
# scripts/performance/configs/{gpt_oss,qwen,deepseek}/*_workload_base_configs.py presets
# (cuda_graph_impl / cuda_graph_scope; absent = eager, Megatron-Core's default).
PUBLISHED: list[dict] = [
    dict(
        row="GPT-OSS-120B, 26.02",
        src=MB + ", 26.02, DGX-H100",
        model="gpt-oss-120b",
        gpu="h100-sxm",
        gpus=64,
        precision="bf16",
        gbs=1280,
        mbs=1,
        tp=1,
        pp=4,
        ep=8,
        published=5993,
    ),
    dict(
        row="GPT-OSS-120B, 25.11",
        src=MB + ", 25.11, DGX-H100",
        model="gpt-oss-120b",
        gpu="h100-sxm",
        gpus=64,
        precision="bf16",
        gbs=512,
        mbs=4,
        tp=1,
        pp=4,
        ep=8,
        published=5630,
    ),
    dict(
        row="DeepSeek-V3, 25.09 dropless",
        src=MB + ", 25.09, DGX-H100 (VP 4: placer's balanced uneven chunks)",
        model="deepseek-v3",
        gpu="h100-sxm",
        gpus=1024,
        precision="fp8",
        gbs=8192,
        mbs=1,
        tp=2,
        pp=8,
        ep=64,
        v=4,
        # Megatron-Bridge f37f883a8 (the 25.09 DeepSeek-V3 perf script, run_script.py): for
        # h100 enable_deepep = True and A2A_1F1B = True -> overlap_moe_expert_parallel_comm
        # and delay_wgrad_compute True
        dispatcher="deepep",
        overlap=True,
        # recipes/deepseek/deepseek_v3.py at f37f883a8: CommOverlapConfig(tp_comm_overlap=False)
        # (the perf script sets no userbuffer config for DeepSeek-V3)
        tp_overlap=False,
        published=1297,
    ),
    dict(
        row="GPT-OSS-120B, 25.11",
        src=MB + ", 25.11, DGX-B200 (EP 64: the 25.11 preset's, the table prints 8)",
        model="gpt-oss-120b",
        gpu="b200",
        gpus=64,
        precision="bf16",
        gbs=512,
        mbs=4,
        tp=1,
        pp=1,
        # The table's EP column says 8; Megatron-Bridge v0.2.0 (the 25.11 release)
        # GPT_OSS_120B_B200_BF16_BASE_CONFIG runs expert_model_parallel_size = 64, mbs 4
        # (alltoall, eager, no overlap), as its 26.02 preset, whose table row says EP 64 at
        # 8047 tokens/s/GPU (this row: 8213). At EP 8 placer needs 185.9 GB per GPU of 174.
        ep=64,
        published=8213,
    ),
    dict(
        row="Qwen3-235B-A22B, 25.11",
        src=MB + ", 25.11, DGX-B200 (FP8-MX)",
        model="qwen3-235b-a22b",
        gpu="b200",
        gpus=64,
        precision="fp8",
        gbs=1024,
        mbs=1,
        tp=1,
        pp=8,
        ep=8,
        v=2,
        # v0.2.0 (25.11) QWEN3_235B_A22B_B200_FP8_MX_BASE_CONFIG: moe_a2a_overlap = True, no
        # flex backend (the provider's alltoall); set_qwen3_common_configs: no recompute
        overlap=True,
        recompute="none",
        param_gather=False,  # qwen3_235b_a22b_b200_config: fp8_mx turns overlap_param_gather off
        published=3269,
    ),
    dict(
        row="DeepSeek-V3 (with MTP), 25.11",
        src=MB + ", 25.11, DGX-B200 (FP8-MX; placer leaves the MTP module out)",
        model="deepseek-v3",
        gpu="b200",
        gpus=256,
        precision="fp8",
        gbs=2048,
        mbs=1,
        tp=1,
        pp=16,
        ep=8,
        # v0.2.0 (25.11) DEEPSEEK_V3_B200_BASE_CONFIG: no flex backend (DeepSeekProvider's
        # alltoall dispatcher), moe_a2a_overlap = False
        published=2139,
    ),
    dict(
        row="GPT-OSS-120B, 26.02",
        src=MB + ", 26.02, DGX-GB200",
        model="gpt-oss-120b",
        gpu="gb200",
        gpus=64,
        precision="bf16",
        gbs=1280,
        mbs=4,
        tp=1,
        pp=1,
        ep=64,
        # v0.3.0 (26.02) GPT_OSS_120B_PRETRAIN_CONFIG_GB200_BF16_V2: no flex backend
        # (GPTOSSProvider's alltoall), moe_a2a_overlap False (WorkloadBaseConfig default), eager
        published=15784,
    ),
    dict(
        row="Qwen3-235B-A22B, 26.02",
        src=MB + ", 26.02, DGX-GB200 (MXFP8)",
        model="qwen3-235b-a22b",
        gpu="gb200",
        gpus=256,
        precision="fp8",
        gbs=8192,
        mbs=1,
        tp=1,
        pp=8,
        ep=32,
        dispatcher="deepep",
        graphs=True,  # QWEN3_235B_A22B_PRETRAIN_CONFIG_GB200_FP8_MX_V2 (attn, router, preprocess)
        recompute="none",  # v0.3.0 set_qwen3_common_configs: recompute_granularity None
        published=5448,
    ),
]


def _h800() -> dict:
    """H800 SXM: the H100 SXM with NVLink cut to 400 GB/s (both directions; DeepSeek-V3
    section 3.2.2 gives 160 GB/s achievable per direction). The catalog has no H800: an
    instance catalog addition copied from h100-sxm with that one field changed."""
    from placer.io import build_catalog

    spec = build_catalog().gpus["h100-sxm"].model_dump(exclude_none=True)
    spec["nvlink_gbytes_per_s_bidir"] = 400
    spec["source"] = "assumption: h100-sxm with the H800's 400 GB/s NVLink"
    return {"gpus": {"h800": spec}}


PUBLISHED.append(
    dict(
        row="DeepSeek-V3 pre-training",
        src="arXiv 2412.19437 section 1 / Table 1: 180K H800 GPU-hours per trillion tokens",
        model="deepseek-v3",
        gpu="h800",
        catalog=_h800(),
        gpus=2048,
        precision="fp8",
        gbs=15360,
        mbs=1,
        tp=1,
        pp=16,
        ep=64,
        # DualPipe (section 3.2.1), priced as DualPipeV (parallelism.pipeline_schedule):
        # the same bubble per the DualPipe README table, 1x parameters per rank where DualPipe
        # holds 2x (both directions' copies); the F&B pairs hide the EP all-to-all
        # (Config.ep_overlap), which torchtitan runs without activation checkpointing only:
        # placer's "selective" (flash attention recomputes the attention core in its
        # backward; DeepSeek also recomputes RMSNorm and the MLA up-projections, section
        # 3.2.3, not priced)
        schedule="dualpipev",
        recompute="selective",
        overlap=True,
        dispatcher="deepep",
        dispatch_precision="fp8",
        published=round(1e12 / (180e3 * 3600)),
    )
)
# Qwen3-235B-A22B on 256 H100 with TP 2 x EP 32, PP 8: Megatron-Core folds EP over the
# TP x DP ranks of a stage (32 GPUs), expert TP 1 (Megatron-Bridge recipes/qwen/h100/
# qwen3_moe.py: expert_tensor_parallel_size = 1; perf_recipes/qwen/h100/qwen3_moe.py
# fp8cs: alltoall dispatcher, overlap_moe_expert_parallel_comm = True, VP 4). placer's
# folded layout (parallelism.etp = 1): a replica stage of lcm(2, 32) = 32 GPUs. VP 4 needs
# Megatron-Bridge's account_for_embedding/loss_in_pipeline_split (96 = 94 layers + 2 over
# 32 chunks): parallelism.chunk_layers, placer's balanced chunk split (2, 3 x 30, 2), which
# is that split (tests/test_chunk_layers.py, consumers/test_interleaved.py).
for _row, _gbs, _pub in (("25.11", 2048, 1575), ("26.02", 8192, 1633)):
    PUBLISHED.append(
        dict(
            row=f"Qwen3-235B-A22B, {_row}",
            src=MB + f", {_row}, DGX-H100 (FP8-CS; VP 4)",
            model="qwen3-235b-a22b",
            gpu="h100-sxm",
            gpus=256,
            precision="fp8",
            gbs=_gbs,
            mbs=1,
            tp=2,
            pp=8,
            ep=32,
            etp=1,
            v=4,
            overlap=True,  # v0.2.0 / v0.3.0 H100 presets: moe_a2a_overlap = True, alltoall
            recompute="none",  # set_qwen3_common_configs: recompute_granularity None
            tp_overlap=False,  # qwen3_235b_a22b_h100_config: tp_comm_overlap=False
            published=_pub,
        )
    )
# Rows placer could not express before parallelism.chunk_layers (issue 16): VP 3 / 4 with 61
# or 94 layers. DeepSeek-V3 at PP 4 VP 4 takes Megatron-Bridge's own layout for (4, 4)
# (recipes/deepseek/deepseek_v3.py _get_deepseek_v3_pipeline_layout: embedding + 4 | 4 x 14 |
# 1 + loss, the MTP layer left out as placer does); the others placer's balanced split.
# Dispatcher: HybridEP (deepep) as the Megatron-Bridge DeepSeek-V3 / Qwen3 GB200 recipes;
# EP overlap off (the DeepSeek-V3 recipe's overlap_moe_expert_parallel_comm = False).
DS3_LAYOUT_4X4 = [4] + [4] * 14 + [1]
# CUDA graphs (job.moe_cuda_graphs): every GB200 DeepSeek-V3 / Qwen3-235B recipe captures
# the MoE router and preprocessing (cuda_graph_scope attn, moe_router, moe_preprocess) or the
# whole iteration (FP8-MX: full_iteration), so these four rows set it; the H100 / B200 rows and
# GPT-OSS BF16 on GB200 run eagerly (no cuda_graph_impl in their presets).
NEW_ROWS: list[dict] = [
    dict(
        row="DeepSeek-V3 (w/o MTP), 25.11",
        src=MB + ", 25.11, DGX-GB200 (BF16; Megatron-Bridge's PP 4 VP 4 layout)",
        model="deepseek-v3",
        gpu="gb200",
        gpus=256,
        precision="bf16",
        gbs=4096,
        mbs=1,
        tp=1,
        pp=4,
        ep=64,
        v=4,
        chunks=DS3_LAYOUT_4X4,
        dispatcher="deepep",
        graphs=True,
        published=3139,
    ),
    dict(
        row="DeepSeek-V3 (w/o MTP), 25.11",
        src=MB + ", 25.11, DGX-GB200 (FP8-MX; PP 8 VP 4, placer's balanced chunks)",
        model="deepseek-v3",
        gpu="gb200",
        gpus=256,
        precision="fp8",
        gbs=4096,
        mbs=1,
        tp=1,
        pp=8,
        ep=32,
        v=4,
        dispatcher="deepep",
        graphs=True,
        param_gather=False,  # v0.2.0 deepseek_v3_gb200_config: fp8_mx, overlap_param_gather off
        published=4018,
    ),
    dict(
        row="DeepSeek-V3, 26.02",
        src=MB + ", 26.02, DGX-GB200 (MXFP8; Megatron-Bridge's PP 4 VP 4 layout)",
        model="deepseek-v3",
        gpu="gb200",
        gpus=256,
        precision="fp8",
        gbs=4096,
        mbs=1,
        tp=1,
        pp=4,
        ep=64,
        v=4,
        chunks=DS3_LAYOUT_4X4,
        dispatcher="deepep",
        graphs=True,
        published=3955,
    ),
    dict(
        row="Qwen3-235B-A22B, 25.11",
        src=MB + ", 25.11, DGX-GB200 (BF16; PP 8 VP 3: embedding and loss counted, 3 | 4 x 22 | 3)",
        model="qwen3-235b-a22b",
        gpu="gb200",
        gpus=256,
        precision="bf16",
        gbs=8192,
        mbs=1,
        tp=1,
        pp=8,
        ep=32,
        v=3,
        dispatcher="deepep",
        graphs=True,
        recompute="none",  # v0.2.0 set_qwen3_common_configs: recompute_granularity None
        published=4916,
    ),
    # The 26.02 table's GPT-OSS on DGX-B200 (not in the 25.11-era set): EP 64 over 8 nodes,
    # v0.3.0 GPT_OSS_120B_PRETRAIN_CONFIG_B200_BF16_V2 (mbs 4, gbs 1280, alltoall, no overlap,
    # eager, recompute layernorm / moe_act).
    dict(
        row="GPT-OSS-120B, 26.02",
        src=MB + ", 26.02, DGX-B200",
        model="gpt-oss-120b",
        gpu="b200",
        gpus=64,
        precision="bf16",
        gbs=1280,
        mbs=4,
        tp=1,
        pp=1,
        ep=64,
        published=8047,
    ),
]
# The rows above whose run interleaved at a VP placer could not express before issue 16,
# with the stand-in placer ran instead (v, stage_layers rule): for the before/after table.
STAND_INS = {
    ("DeepSeek-V3, 25.09 dropless", "h100-sxm"): 1,
    ("Qwen3-235B-A22B, 25.11", "h100-sxm"): 2,
    ("Qwen3-235B-A22B, 26.02", "h100-sxm"): 2,
}
NOT_EXPRESSIBLE: list[str] = []


def published_row(r: dict, host_s: float | None = None) -> tuple[float, float, dict]:
    """The row's tokens/s/GPU, step seconds and breakdown; `host_s` overrides the GPU's
    catalog moe_layer_host_s (the what-if scans and the fit)."""
    m = load_model(r["model"])
    v = r.get("v", 1)
    job = {
        "model": r["model"],
        "global_batch": r["gbs"],
        "precision": r["precision"],
        "recompute": r.get("recompute", "selective"),
        "expert_load_imbalance": r.get("imbalance", 1.0),
        "overlap": {
            "ep_comm": r.get("overlap", False),
            "tp_comm": r.get("tp_overlap", True),
            "param_gather": r.get("param_gather", True),
        },
        "moe_dispatcher": r.get("dispatcher", "alltoall"),
        "moe_dispatch_precision": r.get("dispatch_precision", "bf16"),
        "moe_cuda_graphs": r.get("graphs", False),
    }
    inst = {"name": "pub", "sites": [{"name": "dc", "gpu": r["gpu"], "gpus": r["gpus"]}]}
    inst["job"] = job
    if "catalog" in r:
        inst["catalog"] = r["catalog"]
    prob = problem_from_data(inst)
    if host_s is not None:
        gpus = prob.catalog.gpus
        gpus[r["gpu"]] = gpus[r["gpu"]].model_copy(update={"moe_layer_host_s": host_s})
    pp, tp, ep, etp = r["pp"], r["tp"], r["ep"], r.get("etp")
    width = tp * ep if etp is None else math.lcm(tp, ep * etp)  # rules.Config.width, cp = 1
    dp = r["gpus"] // (pp * width)
    layers = list(balanced_stage_layers(m.layers, pp))
    chunks = r.get("chunks")
    dual = r.get("schedule") == "dualpipev"
    if dual:  # DualPipeV: the optimizer's split of the 2 pp model stages (space.dualpipev_split)
        from placer.optimize.space import SpaceReport, dualpipev_split

        found = dualpipev_split(m.layers, pp, 2 * pp, SpaceReport())
        assert found is not None
        layers, dual_chunks = list(found[0]), found[1]
        chunks = list(dual_chunks) if dual_chunks is not None else None
    elif v > 1 and chunks is None and m.layers % v:  # uneven chunks: the optimizer's split
        chunks = list(balanced_chunk_layers(m.layers, pp, v))
    if dual:
        pass
    elif chunks is not None:
        layers = [sum(chunks[c * pp + k] for c in range(v)) for k in range(pp)]
    elif v > 1:  # equal chunks: round each stage to a multiple of v, the remainder to the middle
        layers = [x - x % v for x in layers]
        k = pp // 2
        while sum(layers) < m.layers:
            layers[k] += v
            k = (k + 1) % pp
    plan = {
        "parallelism": {
            "tp": tp,
            "pp": pp,
            "dp": dp,
            "ep": ep,
            **({"etp": etp} if etp is not None else {}),
            "micro_batch": r["mbs"],
            "virtual_stages": v,
            **({"chunk_layers": chunks} if chunks is not None else {}),
            **({"pipeline_schedule": "dualpipev"} if dual else {}),
        },
        "stage_layers": layers,
        "replica_groups": [{"count": dp, "stage_sites": ["dc"] * pp}],
    }
    ev = evaluate(prob, plan)
    return ev.tokens_per_s / r["gpus"], ev.step_time_s, {**ev.breakdown, "feasible": ev.feasible}


ALL_ROWS = PUBLISHED + NEW_ROWS
N_ROWS_BEFORE_MOEFID4 = 15  # the set earlier branches report on; row 15 (GPT-OSS B200 26.02) is new


def _micro_batches(r: dict) -> int:
    """Micro-batches per attention data-parallel rank (cp = 1): gbs / (mbs x gpus / (pp tp))."""
    return max(1, r["gbs"] // (r["mbs"] * (r["gpus"] // (r["pp"] * r["tp"]))))


def decompose() -> None:
    """Issue 16: each row's MoE layer forward on its busiest rank, by term (ms per micro-batch,
    one MoE layer), and the extra time per MoE layer forward that would match the published
    step (the whole gap put on the MoE layers: (published step - model step) / (MoE layers
    per rank x micro-batches); x1 forward, the backward priced at 2x the compute as usual)."""
    from placer.io import build_catalog
    from placer.perf import compute as C

    cat = build_catalog()
    print("\nMoE layer forward by term (ms, one micro-batch, one rank) and the gap per layer")
    print(
        "| # | run | GPUs | tok/expert | attention | router | experts | shared | "
        "memory-bound | host | a2a exposed (fwd + bwd) | gap per layer | error |"
    )
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for i, r in enumerate(ALL_ROWS):
        m = load_model(r["model"])
        gpu = cat.gpus["h100-sxm" if r["gpu"] == "h800" else r["gpu"]]
        tok, step, bd = published_row(r)
        pub_step = step * tok / r["published"]
        tp, ep, etp, prec = r["tp"], r["ep"], r.get("etp") or 1, r["precision"]
        e = m.moe
        tokens = r["mbs"] * m.seq_len
        n_tok = C.moe_tokens_per_rank(tokens, tp)
        local = max(1, e.experts // ep)
        per = max(1, math.ceil(n_tok * e.top_k * etp / local))
        router = C.gemm_s(gpu, C.Gemm("router", round(n_tok), e.experts, m.hidden), prec)
        experts = local * sum(
            C.gemm_s(gpu, g, prec) for g in C.ffn_gemms(m, per, etp, e.expert_ffn_hidden)
        )
        shared = (
            sum(C.gemm_s(gpu, g, prec) for g in C.ffn_gemms(m, tokens, tp, e.shared_ffn))
            if e.shared_ffn
            else 0.0
        )
        attn = sum(
            C.gemm_s(gpu, g, prec) for g in C.attention_gemms(m, tokens, tp)
        ) + C.attention_core_s(gpu, m, tokens, tp)
        mem = C.hbm_s(gpu, C.layer_memory_bytes(m, tokens, tp, tp > 1, m.rotary, True, 1.0, etp))
        host = C.moe_host_s(gpu, m, r.get("graphs", False))
        passes = math.ceil(m.layers / r["pp"]) * _micro_batches(r)
        a2a = bd.get("ep_comm_s", 0.0) / passes
        gap = (pub_step - step) / passes
        print(
            f"| {i} | {r['row']} | {r['gpus']} {r['gpu']} | {per} | {attn * 1e3:.2f} | "
            f"{router * 1e3:.3f} | {experts * 1e3:.2f} | {shared * 1e3:.2f} | {mem * 1e3:.2f} | "
            f"{host * 1e3:.2f} | {a2a * 1e3:.2f} | {gap * 1e3:+.2f} | "
            f"{tok / r['published'] - 1:+.1%} |"
        )


# The host-time fit (catalog moe_layer_host_s): the eager rows of the 25.11 container fit it,
# every other row is held out (the 26.02 / 25.09 eager rows, DeepSeek's own run, and the CUDA
# graph rows, which the term does not touch). Chosen before the fit: one container's rows.
HOST_GRID = [k * 0.25e-3 for k in range(25)]


def _is_fit_row(r: dict) -> bool:
    return "25.11" in r["row"] and not r.get("graphs", False)


def fit_host() -> None:
    """The catalog's moe_layer_host_s against the published rows: mean |error| over the fit
    rows on a grid, and the error of every row (fit / held out) without it and at the best."""
    errs = {h: [published_row(r, h)[0] / r["published"] - 1 for r in ALL_ROWS] for h in HOST_GRID}
    fit = [i for i, r in enumerate(ALL_ROWS) if _is_fit_row(r)]
    held = [i for i in range(len(ALL_ROWS)) if i not in fit]
    eager_held = [i for i in held if not ALL_ROWS[i].get("graphs", False)]

    def mean(h: float, ix: list[int]) -> float:
        return sum(abs(errs[h][i]) for i in ix) / len(ix)

    best = min(HOST_GRID, key=lambda h: (mean(h, fit), h))
    print(f"\nHost time per eager MoE layer forward: fit on rows {fit}, held out {held}")
    print("| h (ms) | fit mean | held-out mean | held-out eager | all | max |")
    print("|---:|---:|---:|---:|---:|---:|")
    for h in HOST_GRID[::2] + ([best] if best not in HOST_GRID[::2] else []):
        mark = " (best)" if h == best else ""
        print(
            f"| {h * 1e3:.2f}{mark} | {mean(h, fit):.1%} | {mean(h, held):.1%} | "
            f"{mean(h, eager_held):.1%} | {mean(h, list(range(len(ALL_ROWS)))):.1%} | "
            f"{max(abs(e) for e in errs[h]):.1%} |"
        )
    print("\n| # | run | GPUs | CUDA graphs | set | error h = 0 | error h = best |")
    print("|---:|---|---|---|---|---:|---:|")
    for i, r in enumerate(ALL_ROWS):
        print(
            f"| {i} | {r['row']} | {r['gpus']} {r['gpu']} | {r.get('graphs', False)} | "
            f"{'fit' if i in fit else 'held out'} | {errs[0.0][i]:+.1%} | {errs[best][i]:+.1%} |"
        )


def deepseek_ablation() -> None:
    """DeepSeek-V3 at DeepSeek's layout (PP 16, EP 64, 2048 GPUs), one change at a time from
    the old part-3 setting to the published run's settings."""
    base = dict(next(r for r in PUBLISHED if r["row"] == "DeepSeek-V3 pre-training"))
    steps = [
        ("part 3's setting: H100, full recompute, gbs 3840, alltoall, bf16 dispatch", {}),
        ("+ selective recompute", {"recompute": "selective"}),
        ("+ global batch 15360 (DeepSeek's, section 4.2)", {"gbs": 15360}),
        ("+ per-node dedup, at most 4 nodes per token (deepep)", {"dispatcher": "deepep"}),
        ("+ FP8 dispatch", {"dispatch_precision": "fp8"}),
        ("+ H800 NVLink 400 GB/s", {"gpu": "h800", "catalog": _h800()}),
        ("+ DualPipeV (EP overlap off)", {"schedule": "dualpipev"}),
        ("+ EP overlap under the F&B pairs (the row)", {"overlap": True}),
    ]
    cur = {
        **base,
        "gpu": "h100-sxm",
        "recompute": "full",
        "gbs": 3840,
        "dispatcher": "alltoall",
        "dispatch_precision": "bf16",
        "overlap": False,
        "schedule": "1f1b",
    }
    cur.pop("catalog", None)
    pub = base["published"]
    print("\nDeepSeek-V3, PP 16, EP 64, FP8, 2048 GPUs: one change at a time")
    print("| setting | tokens/s/GPU | model / published | exposed a2a s |")
    print("|---|---:|---:|---:|")
    for label, change in steps:
        cur.update(change)
        tok, _, bd = published_row(cur)
        print(f"| {label} | {tok:.0f} | {tok / pub:.2f} | {bd.get('ep_comm_s', 0.0):.2f} |")


def published_runs() -> None:
    print("\nPublished MoE runs at their own layouts (tokens/s/GPU)")
    print(
        "| run | GPUs | layout | precision | published | model | error | exposed a2a s | "
        "memory fits |"
    )
    print("|---|---|---|---|---:|---:|---:|---:|---|")
    errs = []
    for r in ALL_ROWS:
        tok, step, bd = published_row(r)
        err = tok / r["published"] - 1
        errs.append(abs(err))
        lay = f"tp{r['tp']} pp{r['pp']} ep{r['ep']}" + (f" etp{r['etp']}" if "etp" in r else "")
        lay += f" v{r['v']}" if r.get("v", 1) > 1 else ""
        lay += " dualpipev" if r.get("schedule") == "dualpipev" else ""
        extra = ", ".join(
            x
            for x in (
                "ep overlap" if r.get("overlap") else "",
                r.get("dispatcher", "alltoall"),
                "graphs" if r.get("graphs") else "eager",
                f"recompute {r.get('recompute', 'selective')}",
            )
            if x
        )
        print(
            f"| {r['row']} | {r['gpus']} {r['gpu']} | "
            f"{lay} (mb {r['mbs']}, gbs {r['gbs']}; {extra}) "
            f"| {r['precision']} | {r['published']} | {tok:.0f} | {err:+.1%} | "
            f"{bd.get('ep_comm_s', 0.0):.2f} | {bd['feasible']} |"
        )
    n = N_ROWS_BEFORE_MOEFID4
    print(
        f"mean |error| over the {n} rows before branch moefid4: {sum(errs[:n]) / n:.1%} "
        f"(max {max(errs[:n]):.1%}); over all {len(errs)}: {sum(errs) / len(errs):.1%} "
        f"(max {max(errs):.1%})"
    )
    for s in NOT_EXPRESSIBLE:
        print("not expressible:", s)


def _row_cells(r: dict) -> tuple[str, float, bool]:
    tok, _, bd = published_row(r)
    v = r.get("v", 1)
    lay = f"pp{r['pp']} v{v}" + (
        " chunks" if r.get("chunks") or (v > 1 and load_model(r["model"]).layers % v) else ""
    )
    return lay, tok / r["published"] - 1, bd["feasible"]


def vp_rows() -> None:
    """Issue 16: the published rows at their run's real VP (uneven chunks where the layers
    do not divide), against the stand-in placer ran before (VP 1 or 2), and the rows that
    were not expressible at all."""
    print("\nPublished rows at their real VP (uneven chunks) vs the stand-in before issue 16")
    print(
        "| run | GPUs | before (stand-in) | error before | after (real VP) | error after | fits |"
    )
    print("|---|---|---|---:|---|---:|---|")
    before_all, after_all = [], []
    for r in PUBLISHED:
        key = (r["row"], r["gpu"])
        if key not in STAND_INS:
            continue
        old = {**r, "v": STAND_INS[key]}
        old.pop("chunks", None)
        lay0, e0, _ = _row_cells(old)
        lay1, e1, fit = _row_cells(r)
        before_all.append(abs(e0))
        after_all.append(abs(e1))
        print(
            f"| {r['row']} | {r['gpus']} {r['gpu']} | {lay0} | {e0:+.1%} | {lay1} | "
            f"{e1:+.1%} | {fit} |"
        )
    for r in NEW_ROWS:
        lay1, e1, fit = _row_cells(r)
        after_all.append(abs(e1))
        print(
            f"| {r['row']} | {r['gpus']} {r['gpu']} | not expressible | - | {lay1} | "
            f"{e1:+.1%} | {fit} |"
        )
    n0 = len(before_all)
    print(
        f"mean |error|: the {n0} re-run rows {sum(before_all) / n0:.1%} before, "
        f"{sum(after_all[:n0]) / n0:.1%} after; with the {len(NEW_ROWS)} new rows "
        f"{sum(after_all) / len(after_all):.1%} over {len(after_all)}"
    )
    base = [abs(published_row(r)[0] / r["published"] - 1) for r in PUBLISHED]
    every = base + after_all[n0:]
    print(
        f"mean |error| of the whole published set: {sum(base) / len(base):.1%} over "
        f"{len(base)} rows; with the new rows {sum(every) / len(every):.1%} over {len(every)}"
    )


# Dense Llama 3 runs of the same Megatron-Bridge tables (25.11, FP8-CS), at placer's v = 1
# (the runs use VP 8 / VP 5; Llama 3 70B on GB200 uses FSDP 64, run here as dp 64): does
# the H100 efficiency fit copied to B200 / GB200 make dense Blackwell runs too fast as well?
DENSE_CHECK = [
    ("LLAMA3.1_405B", "llama3-405b", "h100-sxm", 1024, 512, 1, 8, 8, 2, 292),
    ("LLAMA3_70B", "llama3-70b", "h100-sxm", 64, 128, 1, 4, 8, 1, 1602),
    ("LLAMA3.1_405B", "llama3-405b", "b200", 128, 64, 1, 4, 8, 2, 661),
    ("LLAMA3_70B", "llama3-70b", "gb200", 64, 256, 2, 1, 1, 1, 4312),
]


def dense_blackwell() -> None:
    print("\nDense Llama 3 rows (Megatron-Bridge 25.11, FP8-CS, seq 8192), placer at v = 1")
    print("| run | GPUs | layout | published | model | error |")
    print("|---|---|---|---:|---:|---:|")
    for name, model, gpu, gpus, gbs, mbs, tp, pp, cp, pub in DENSE_CHECK:
        m = load_model(model)
        inst = {
            "name": "dense",
            "sites": [{"name": "dc", "gpu": gpu, "gpus": gpus}],
            "job": {"model": model, "global_batch": gbs, "precision": "fp8", "seq_len": 8192},
        }
        dp = gpus // (tp * pp * cp)
        plan = {
            "parallelism": {
                "tp": tp,
                "pp": pp,
                "dp": dp,
                "micro_batch": mbs,
                **({"cp": cp} if cp > 1 else {}),
            },
            "stage_layers": list(balanced_stage_layers(m.layers, pp)),
            "replica_groups": [{"count": dp, "stage_sites": ["dc"] * pp}],
        }
        ev = evaluate(problem_from_data(inst), plan)
        tok = ev.tokens_per_s / gpus
        print(
            f"| {name} | {gpus} {gpu} | tp{tp} pp{pp} cp{cp} mb{mbs} gbs{gbs} | {pub} | "
            f"{tok:.0f} | {tok / pub - 1:+.1%} |"
        )


# What-if scans of two candidate MoE terms (not in the model): the error of every published
# row with each term added, fitted on the GPT-OSS H100 pair (rows 0 and 1) and reported on
# the others (held out). grouped: each routed-expert GEMM of M tokens per expert at
# e M / (M + M_half) (grouped GEMMs with few tokens per expert); overhead: a fixed time per
# MoE layer forward (x3 with the backward: router, permutation, launch overhead).
FIT_ROWS = (0, 1)


def _scan(name: str, values: list[float], wrap) -> None:  # noqa: ANN001
    from placer.perf import compute

    orig = compute.moe_ffn_s
    print(f"\nWhat-if: {name} (fit on rows {FIT_ROWS}, the GPT-OSS H100 pair; the rest held out)")
    print("| value | " + " | ".join(str(i) for i in range(len(PUBLISHED))) + " | fit | held out |")
    print("|---:|" + "---:|" * (len(PUBLISHED) + 2))
    try:
        for v in values:
            compute.moe_ffn_s = wrap(orig, v)
            errs = [published_row(r)[0] / r["published"] - 1 for r in PUBLISHED]
            fit = [abs(e) for i, e in enumerate(errs) if i in FIT_ROWS]
            held = [abs(e) for i, e in enumerate(errs) if i not in FIT_ROWS]
            print(
                f"| {v:g} | "
                + " | ".join(f"{e:+.0%}" for e in errs)
                + f" | {sum(fit) / len(fit):.1%} | {sum(held) / len(held):.1%} |"
            )
    finally:
        compute.moe_ffn_s = orig


def _grouped(orig, half: float):  # noqa: ANN001, ANN202
    from placer.perf import compute

    def f(gpu, m, tokens, tp, ep, imb, precision, etp=1):  # noqa: ANN001, ANN202
        e = m.moe
        n_tok = compute.moe_tokens_per_rank(tokens, tp)
        local = max(1, e.experts // ep)
        per = max(1, math.ceil(n_tok * e.top_k * imb * etp / local))
        experts = sum(
            compute.gemm_s(gpu, g, precision)
            for g in compute.ffn_gemms(m, per, etp, e.expert_ffn_hidden)
        )
        return orig(gpu, m, tokens, tp, ep, imb, precision, etp) + local * experts * half / per

    return f


def _overhead(orig, seconds: float):  # noqa: ANN001, ANN202
    return lambda *a, **k: orig(*a, **k) + seconds


def term_scans() -> None:
    print("\nrows: " + "; ".join(f"{i} {r['row']} {r['gpu']}" for i, r in enumerate(PUBLISHED)))
    _scan("grouped-GEMM M_half (tokens per expert)", [0, 512, 1024, 2048], _grouped)
    _scan("fixed time per MoE layer forward (s)", [0, 0.5e-3, 1e-3, 2e-3], _overhead)


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["vp"]:
        vp_rows()
    elif sys.argv[1:] == ["decompose"]:
        decompose()
    elif sys.argv[1:] == ["fit"]:
        fit_host()
    elif sys.argv[1:] == ["published"]:
        published_runs()
        deepseek_ablation()
        dense_blackwell()
        term_scans()
    else:
        params_table()
        shipped_instance()
        deepseek_one_site()
        llama_cp()
        published_runs()
        vp_rows()
        deepseek_ablation()
        dense_blackwell()
        term_scans()
