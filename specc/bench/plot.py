"""A PNG chart of a benchmark document: speedup by category, and the
histogram of accepted draft tokens per round."""

from __future__ import annotations

from pathlib import Path

from specc.bench.systems import ENGINE


def write_chart(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [2, 1]})
    _speedup_bars(left, doc)
    _accepted_histogram(right, doc)
    fig.suptitle(f"specc bench: {doc['engine']['method']} on {doc['model']['model_type']} "
                 f"({doc['settings']['prompt_set']}, {doc['settings']['max_new_tokens']} new tokens)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _speedup_bars(ax, doc: dict) -> None:
    groups = {**doc["categories"], "overall": doc["overall"]} if len(doc["categories"]) > 1 else \
        {"overall": doc["overall"]}
    labels = {s["name"]: s["label"] for s in doc["systems"]}
    baselines = list(doc["overall"]["speedup"])
    width = 0.8 / len(baselines)
    for b, baseline in enumerate(baselines):
        medians = [g["speedup"][baseline]["median"] for g in groups.values()]
        below = [m - g["speedup"][baseline]["min"] for m, g in zip(medians, groups.values())]
        above = [g["speedup"][baseline]["max"] - m for m, g in zip(medians, groups.values())]
        xs = [i + (b - (len(baselines) - 1) / 2) * width for i in range(len(groups))]
        ax.bar(xs, medians, width, yerr=[below, above], capsize=2, label=f"over {labels[baseline]}")
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(groups)), list(groups), rotation=30, ha="right")
    ax.set_ylabel("speedup (median, min-max over repeats)")
    ax.set_title("speedup of the engine by prompt category")
    ax.legend(fontsize="small")


def _accepted_histogram(ax, doc: dict) -> None:
    acceptance = doc["overall"]["systems"][ENGINE].get("acceptance")
    histogram = acceptance["accepted_per_round_histogram"] if acceptance else {}
    ax.set_title("accepted draft tokens per round")
    if not histogram:
        ax.text(0.5, 0.5, "no draft rounds", ha="center", va="center", transform=ax.transAxes)
        return
    depths = [int(k) for k in histogram]
    ax.bar(depths, list(histogram.values()), color="tab:gray")
    ax.set_xticks(depths)
    ax.set_xlim(-0.6, max(depths) + 0.6 if len(depths) > 1 else 1.6)
    ax.set_xlabel(f"accepted tokens (M = {acceptance['mean_accepted_length']:.2f} incl. bonus)")
    ax.set_ylabel("draft rounds (all timed runs)")
