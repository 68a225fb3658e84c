"""The one matplotlib entry point: a Figure on its own Agg canvas.

A leaf module (no scfs imports), so evaluation reports and the viz figures draw the same way without eval
depending on viz. No pyplot: a notebook's inline backend is never switched.
"""

from __future__ import annotations


def new_figure(width: float, height: float, dpi: int = 100):
    """A matplotlib Figure on its own Agg canvas: savefig works, and no global backend is touched (notebooks keep
    their inline backend; IPython displays the returned Figure)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(fig)
    return fig
