"""MoE, expert and context parallelism: figures for benchmarks/README.md (issue 16).

    .venv/bin/python benchmarks/moe_bench.py

1. Parameter counts of the MoE library against the model cards.
2. The shipped DeepSeek-V3 two-site instance, solved by CP-SAT and the MILP.
3. DeepSeek-V3 on one 2048-GPU H100 site, PP 16, EP 8 ... 64 (EP over the NICs beyond 8),
   against DeepSeek's published 180K H800 GPU-hours per trillion tokens.
4. Context parallelism for Llama 3 405B at 32K tokens: CP 1 / 2 / 4 with TP 8, and where the
   ring attention exchange stops hiding under the attention core.
"""

from __future__ import annotations

import time
from pathlib import Path

from placer.evaluate import evaluate
from placer.io import load_instance, load_model, problem_from_data
from placer.optimize.driver import solve
from placer.perf.flops import active_param_count, param_count
from placer.perf.step import balanced_stage_layers

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


if __name__ == "__main__":
    params_table()
    shipped_instance()
    deepseek_one_site()
    llama_cp()
