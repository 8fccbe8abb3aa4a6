"""Draws the latency distributions of a silt-bench result.json as a PNG.

usage: python plot.py results/latest/result.json results/latest/latency.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter  # noqa: E402

COLORS = {("silt", 1): "#1f77b4", ("silt", 3): "#17becf", ("nats", 1): "#d62728", ("nats", 3): "#ff7f0e"}
STYLES = ["-", "--", ":"]


def xs(dist):
    # HdrHistogram's percentile plot: x = 1 / (1 - quantile), the max drawn at 10^6.
    return [1.0 / (1.0 - q) if q < 1.0 else 1e6 for q, _ in dist]


def main(src, out):
    r = json.load(open(src))
    runs = [x for x in r["runs"] if x["available"] and x["produce_ack"]["count"] > 0]
    workloads = list(dict.fromkeys(x["workload"] for x in runs))
    if not workloads:
        print(f"no latency to plot in {src} (only replay workloads ran); {out} not written")
        return
    fig, axes = plt.subplots(len(workloads), 2, figsize=(13, 4.6 * max(1, len(workloads))), squeeze=False)
    disk = r["limits_start"]["write_4k_fdatasync"]["distribution"]
    for row, w in enumerate(workloads):
        rates = list(dict.fromkeys(x["rate"] for x in runs if x["workload"] == w and x["rate"] != "max"))
        for col, (key, title) in enumerate([("produce_ack", "produce-ack latency"), ("end_to_end", "end-to-end latency")]):
            ax = axes[row][col]
            for x in runs:
                if x["workload"] != w or x["rate"] not in rates or not x[key]["distribution"]:
                    continue
                style = STYLES[rates.index(x["rate"]) % len(STYLES)]
                d = x[key]["distribution"]
                ax.plot(xs(d), [v for _, v in d], style, color=COLORS.get((x["system"], x["replication"]), "k"),
                        label=f'{x["system"]} R={x["replication"]}, {x["rate"]}'
                        f' ({x["throughput_msgs_per_s"]:,.0f} msg/s)')
            ax.plot(xs(disk), [v for _, v in disk], "-", color="0.6", lw=2.5, alpha=0.6,
                    label="disk: 4 KiB write + fdatasync")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ticks = [2, 10, 100, 1000, 10000, 100000, 1e6]
            labels = ["50%", "90%", "99%", "99.9%", "99.99%", "99.999%", "max"]
            ax.xaxis.set_major_locator(FixedLocator(ticks))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: labels[ticks.index(v)] if v in ticks else ""))
            ax.xaxis.set_minor_locator(FixedLocator([]))
            ax.set_xlim(1, 1.5e6)
            ax.set_ylabel("ms")
            ax.set_title(f"{w}: {title}", fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("silt-bench latency by percentile (same machine, same run)", fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
