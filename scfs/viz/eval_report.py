"""Figures and the table of notebook 3's evaluation report, drawn from the eval CLIs' metrics documents
(`metrics.json` of `scfs.eval.knn` / `scfs.eval.linear`); running the evaluations is `scfs.workbench.reports`."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from scfs.plotting import new_figure

log = logging.getLogger("scfs.viz.eval_report")


def checkpoint_label(doc: Mapping[str, Any]) -> str:
    """The name a metrics document's checkpoint goes by in legends and tables: its label, else its id."""
    return str(doc["checkpoint"].get("label") or doc["checkpoint"].get("id"))


def accuracy_vs_k_figure(docs: Sequence[Mapping[str, Any]]):
    """kNN top-1 against k, one line per checkpoint (the linear probe's top-1 as a dashed level of its colour)."""
    fig = new_figure(7.4, 3.6)
    ax = fig.add_subplot()
    colors: dict[str, Any] = {}
    ks: list[int] = []
    for d in docs:
        if d["kind"] == "knn" and d.get("knn_curve"):
            ks = [r["k"] for r in d["knn_curve"]]
            (line,) = ax.plot(ks, [r["top1"] for r in d["knn_curve"]], marker="o", label=f"{checkpoint_label(d)} kNN")
            colors[checkpoint_label(d)] = line.get_color()
    for d in docs:
        if d["kind"] == "linear":
            ax.axhline(d["metrics"]["top1"], ls="--", lw=1, color=colors.get(checkpoint_label(d), "grey"),
                       label=f"{checkpoint_label(d)} linear probe")
    ax.set_xscale("log")
    if ks:
        ax.set_xticks(ks, labels=[str(k) for k in ks])
        ax.minorticks_off()
    ax.set_xlabel("k (neighbours voting)")
    ax.set_ylabel("top-1 accuracy on val (%)")
    ax.set_title("kNN accuracy vs k (dashed: linear probe)", fontsize=10)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig


def per_class_figure(docs: Sequence[Mapping[str, Any]], kind: str = "knn"):
    """Grouped bars: per-class accuracy of each checkpoint for one evaluation kind."""
    sel = [d for d in docs if d["kind"] == kind and d.get("per_class")]
    if not sel:
        return None
    names = [r["name"] for r in sel[0]["per_class"]]
    x = np.arange(len(names))
    width = 0.8 / len(sel)
    fig = new_figure(max(6.0, 0.55 * len(names) + 1.5) + 1.6, 3.6)
    ax = fig.add_subplot()
    for j, d in enumerate(sel):
        ax.bar(x + (j - (len(sel) - 1) / 2) * width, [r["accuracy"] for r in d["per_class"]], width,
               label=checkpoint_label(d))
    ax.set_xticks(x, labels=names, rotation=45, ha="right", fontsize=8)
    ax.set_ylim(0, 100)
    ax.set_ylabel("accuracy (%)")
    ax.set_title(f"Per-class accuracy ({'kNN' if kind == 'knn' else 'linear probe'}, val)", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig


def report_table(docs: Sequence[Mapping[str, Any]]) -> str:
    """The side-by-side markdown table (`scfs.eval.compare`), or a plain one if that is unavailable."""
    try:
        from scfs.eval.compare import compare_table

        return compare_table(list(docs))
    except Exception as err:
        log.warning("scfs.eval.compare unavailable (%s): plain table", err)
    labels = list(dict.fromkeys(checkpoint_label(d) for d in docs))
    lines = ["| metric | " + " | ".join(labels) + " |", "|---" + "|---:" * len(labels) + "|"]
    for kind in ("knn", "linear"):
        vals = {checkpoint_label(d): d["metrics"]["top1"] for d in docs if d["kind"] == kind}
        lines.append(f"| {kind} top-1 | " + " | ".join(f"{vals[x]:.2f}" if x in vals else "-" for x in labels) + " |")
    return "\n".join(lines)
