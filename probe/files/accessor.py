"""``ds.probe``: a probe result in a notebook.

Registered on ``import probe``.  Displaying ``ds.probe`` in Jupyter shows a
compact HTML summary of a collapse result (model, inputs, the layer at which each
variant falls under 1e-3, the final relative residual) above the paper's figure
on a log axis; ``ds.probe.plot()`` returns that figure and ``ds.probe.summary()``
the numbers behind the text.
"""

from __future__ import annotations

import base64
import html
import io

import xarray as xr
from matplotlib.figure import Figure

from probe.figures import plot
from probe.measures import stats


@xr.register_dataset_accessor("probe")
class ProbeAccessor:
    """`ds.probe`: a probe result in a notebook.

    Registered as xarray's `probe` Dataset accessor on `import probe`.  Displayed in
    Jupyter, a collapse result shows a compact HTML summary (model, inputs, the layer at
    which each variant falls under 1e-3, the final relative residual) above the paper's
    figure on a log axis; any other Dataset shows as xarray shows it.

    Parameters
    ----------
    ds
        The Dataset the accessor belongs to (xarray passes it).
    """

    def __init__(self, ds: xr.Dataset) -> None:
        self._ds = ds

    def plot(self, log: bool = True, **kwargs) -> Figure:
        """The result's figure.

        Of a collapse result, the paper's figure ([`probe.figures.plot.collapse`][probe.figures.plot.collapse]:
        relative residual against layer); of an attention result, the layer x head heatmaps
        of sink score and entropy (`probe.figures.plot_attention`); of a sweep, its phase diagram
        or curves (`probe.figures.plot_sweep.figure`).

        Parameters
        ----------
        log
            Draw the relative residual on a log axis (collapse results only).
        **kwargs
            Passed on to [`probe.figures.plot.collapse`][probe.figures.plot.collapse] (`metric`, `norm`,
            `fit`).

        Returns
        -------
        Figure
            A matplotlib figure, not shown and not held by pyplot.
        """
        if self._ds.attrs.get("analysis") == "sweep":
            from probe.figures.plot_sweep import figure

            return figure(self._ds)
        if self._ds.attrs.get("analysis") == "attention":
            from probe.figures.plot_attention import heatmaps

            return heatmaps(self._ds)
        return plot.collapse(self._ds, log=log, **kwargs)

    def summary(self, threshold: float = 1e-3) -> dict:
        """The numbers behind the summary of a collapse result (`probe.measures.stats.summarise`).

        Parameters
        ----------
        threshold
            The relative residual whose first crossing is reported.

        Returns
        -------
        dict
            `{variant: {init: {...}}}` of plain Python values, per variant and init with
            data: `first_below` (the first layer whose mean relative residual is under
            `threshold`, None if never), `final` and `final_text` (the mean at the last
            layer with data, as a number and as text), `final_layer`, `order` (the fitted
            order of collapse, None where missing) and `order_note`.
        """
        return stats.summarise(self._ds, threshold=threshold)

    def _repr_html_(self) -> str:
        ds = self._ds
        if ds.attrs.get("analysis") != "collapse" or "relative_residual" not in ds:
            return ds._repr_html_()
        attrs = {
            key: html.escape(str(ds.attrs.get(key, "?")))
            for key in ("model", "family", "inputs", "dtype")
        }
        rows = []
        for variant, by_init in self.summary().items():
            for init, numbers in by_init.items():
                below = numbers["first_below"]
                rows.append(
                    f"<tr><td>{html.escape(variant)}</td><td>{html.escape(init)}</td>"
                    f"<td>{'never' if below is None else below}</td>"
                    f"<td>{html.escape(numbers['final_text'])}</td></tr>"
                )
        shape = f"{ds.sizes['sequence']} x {ds.attrs.get('tokens', '?')} tokens"
        return (
            f"<div><b>probe collapse</b> · {attrs['model']} ({attrs['family']}) · {shape}, "
            f"{attrs['inputs']}, {attrs['dtype']}"
            "<table><thead><tr><th>variant</th><th>init</th><th>layer where r &lt; 1e-3</th>"
            f"<th>final r</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
            f'<img alt="relative residual against layer" src="data:image/png;base64,{_png(self.plot())}"/>'
            "</div>"
        )


def _png(fig: Figure) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")
