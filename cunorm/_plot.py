"""The ``--plot`` of ``python -m cunorm bench``: GB/s against N, one panel per op and pass,
a line per (system, dtype), the copy bandwidth drawn as the ceiling. matplotlib is optional
(``pip install 'cunorm[plot]'``): drawing charts is its job, not ours."""
from __future__ import annotations


def require_matplotlib() -> str | None:
    """Why the plot cannot be drawn here, or None."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        return "matplotlib is not installed (pip install 'cunorm[plot]')"
    return None


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    rows = result["rows"]
    copy = result["copy_GBps"]
    ops = sorted({r["op"] for r in rows})
    fig, axes = plt.subplots(len(ops), 2, figsize=(12, 4 * len(ops)), squeeze=False)
    for i, op in enumerate(ops):
        for j, (direction, label) in enumerate((("fwd", "forward"), ("bwd", "backward"))):
            ax = axes[i][j]
            for key, (xs, ys, style) in sorted(_lines(rows, op, direction, result["peers"]).items()):
                ax.plot(xs, ys, style, marker="o", markersize=3, label=key)
            ax.axhline(copy, color="black", linestyle=":", linewidth=1, label=f"copy {copy:.0f} GB/s")
            ax.set_xscale("log", base=2)
            ax.set_ylim(0, copy * 1.08)
            ax.set_xlabel("N (row length)")
            ax.set_ylabel("GB/s (bytes that must move / median time)")
            ax.set_title(f"{op} {label}")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _lines(rows, op, direction, peers) -> dict:
    """{label: (N values, GB/s values, line style)} for one panel."""
    lines: dict = {}

    def add(label, n, gbps, style):
        xs, ys, _ = lines.setdefault(label, ([], [], style))
        xs.append(n)
        ys.append(gbps)

    for r in sorted((r for r in rows if r["op"] == op), key=lambda r: r["N"]):
        m = "" if r.get("default_m", True) else f" M={r['M']}"
        add(f"cunorm {r['dtype']}{m}", r["N"], r[f"{direction}_GBps"], "-")
        for name in peers:
            add(f"{name} {r['dtype']}{m}", r["N"], r[name][f"{direction}_GBps"], "--")
    return lines
