# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 2. What do the links buy? Link capex against step time, three sites
#
# **Question.** Llama 3 70B runs on three sites: `a` and `b` 80 km apart (metro, 800ZR),
# `c` 300 km from `a` and 500 km from `b` (long haul, 800ZR+ with amplifiers),
# `instances/three-sites-80-300-500km.yaml`. Each new coherent wave costs money. How fast
# can the job run for a given link budget, which budgets are worth paying, and where do
# the returns stop?
#
# The study (`notebooks/studies/links_vs_cost.yaml`) sweeps the capex budget
# `objective.max_cost_usd` from $0 to $2M; at each budget the optimizer returns the
# fastest plan, which may spend less than the budget (tp = 8 as the instance has it; the
# pipeline depth, the placement and the sync policy are left free). The non-dominated
# points (no other plan is both cheaper and faster) form the Pareto front of link capex vs
# step time.

# %%
import os
from pathlib import Path

import pandas as pd

from placer.study.plot import pareto_mask, plot_pareto, save_figure
from placer.study.sweep import load_study, run_sweep

ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "instances").is_dir())
OUT = Path(os.environ.get("PLACER_NOTEBOOK_OUT", ROOT / "out" / "notebooks")) / "02_links_vs_cost"
WORKERS = int(os.environ.get("PLACER_WORKERS", os.cpu_count() or 1))

study = load_study(ROOT / "notebooks" / "studies" / "links_vs_cost.yaml")
res = run_sweep(study, OUT, workers=WORKERS, progress=False)
df = res.table
print(
    f"{len(df)} points: {res.counts}; solved {len(res.computed)}, reused {len(res.reused)} (results in {OUT})"  # noqa: E501
)
df["budget_usd"] = df["objective.max_cost_usd"]
df["front"] = pareto_mask(df, "capex_usd", "step_time_s")

# %% [markdown]
# ## The Pareto front

# %%
fig = plot_pareto(df, title="Llama 3 70B on three sites: link capex vs step time")
save_figure(fig, OUT / "pareto.png")
fig  # noqa: B018 (shown by Jupyter)

# %%
pd.set_option("display.width", 160)
cols = [
    "budget_usd",
    "status",
    "step_time_s",
    "capex_usd",
    "front",
    "layout",
    "sync_mode",
    "sites_used",
    "gpus",
    "pp",
    "dp",
]
cols += [c for c in df.columns if c.startswith("waves[")]
print(df[cols].to_string(index=False))

# %% [markdown]
# ## Must-hold checks
#
# Every point is proven optimal: a front of time-limited plans is not a front (a plan cut
# short can be slower than a smaller budget's optimum). A larger budget only widens the
# search, so the best step time never gets worse as the budget grows, and no plan spends
# more than its budget.

# %%
assert (df["status"] == "optimal").all(), df[["budget_usd", "status", "gap"]].to_string()
opt = df.sort_values("budget_usd")
t = opt["step_time_s"].to_numpy()
assert all(b <= a * (1 + 1e-9) for a, b in zip(t, t[1:], strict=False)), (
    "step time got worse with a larger budget"
)
assert (df["capex_usd"].fillna(0) <= df["budget_usd"] + 1e-6).all(), (
    "a plan spends more than its budget"
)
print(
    "checks passed: every point proven optimal; step time non-increasing in the budget; "
    "capex within budget"
)

# %% [markdown]
# ## Conclusion (computed from the numbers above)

# %%
ok = df[df["status"].isin(["optimal", "feasible"])]
front = ok[ok["front"]].sort_values("capex_usd")
no_links = ok[ok["capex_usd"] == 0].sort_values("step_time_s").iloc[0]
fastest = ok.sort_values(["step_time_s", "capex_usd"]).iloc[0]
speedup_total = no_links["step_time_s"] - fastest["step_time_s"]
print(
    f"Without new links the fastest plan runs on {int(no_links['sites_used'])} site(s), {int(no_links['gpus'])} GPUs: "  # noqa: E501
    f"{no_links['step_time_s']:.3f} s per step."
)
print(
    f"The fastest plan at any budget: {fastest['step_time_s']:.3f} s per step on {int(fastest['sites_used'])} sites, "  # noqa: E501
    f"{int(fastest['gpus'])} GPUs, {fastest['layout']}, for ${fastest['capex_usd']:,.0f} of links "
    f"({(1 - fastest['step_time_s'] / no_links['step_time_s']) * 100:.1f}% less step time than without links)."  # noqa: E501
)
print("\nPareto front (each step buys this much step time):")
prev = None
for _, r in front.iterrows():
    if prev is None:
        print(
            f"  ${r['capex_usd']:>11,.0f}  {r['step_time_s']:.4f} s  ({r['layout']}, {int(r['gpus'])} GPUs)"  # noqa: E501
        )
    else:
        dt = prev["step_time_s"] - r["step_time_s"]
        dc = r["capex_usd"] - prev["capex_usd"]
        print(
            f"  ${r['capex_usd']:>11,.0f}  {r['step_time_s']:.4f} s  (+${dc:,.0f} buys {dt * 1e3:.1f} ms, "  # noqa: E501
            f"{dt / speedup_total * 100:.1f}% of the total gain; {r['layout']}, {int(r['gpus'])} GPUs)"  # noqa: E501
        )
    prev = r
# the knee: the cheapest front point that gets 99% of the total gain
knee = front[no_links["step_time_s"] - front["step_time_s"] >= 0.99 * speedup_total].iloc[0]
rest = fastest["capex_usd"] - knee["capex_usd"]
print(
    f"\nConclusion: ${knee['capex_usd']:,.0f} of links ({knee['capex_usd'] / max(fastest['capex_usd'], 1) * 100:.0f}% of the "  # noqa: E501
    f"fastest plan's capex) already buys {(no_links['step_time_s'] - knee['step_time_s']) / speedup_total * 100:.1f}% of the "  # noqa: E501
    f"achievable step-time gain; the remaining ${rest:,.0f} buys "
    f"{(knee['step_time_s'] - fastest['step_time_s']) * 1e3:.2f} ms per step "
    f"({(knee['step_time_s'] / fastest['step_time_s'] - 1) * 100:.2f}%)."
)
print(
    f"Budgets between ${fastest['capex_usd']:,.0f} and ${df['budget_usd'].max():,.0f} buy nothing more: "  # noqa: E501
    "the fastest plan does not spend them."
)
