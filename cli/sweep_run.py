"""Running a checked sweep: the points into their store, then one result and its report.

One process runs every point not yet in the store; a torchrun job's ranks take them round
robin (:func:`probe.analyses.sweep.execute`'s ``part``) and rank 0 publishes once every rank
has finished (:func:`cli.sharded.run_sharded`).  Either way the result is gathered from the
store's files, so one process and a torchrun job read the same bytes: the results are
equal bit for bit.  An interrupt or a failure keeps the finished points, and says where.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import xarray as xr
from rich.table import Table

from probe import distributed
from probe.analyses import sweep as analysis
from probe.errors import ProbeError
from probe.files.interrupts import Interrupted
from probe.measures.stats import point_order_text, shown

from . import console
from .console import Reporter, checked, named, out, say, warn, wrote
from .output import check_out_dir, no_empty_folder, write_index, write_pair
from .sharded import rank_warn, run_sharded


def run(plan, out_dir: Path, name: str) -> None:
    """Run ``plan``'s points (those the store lacks), then publish the result."""
    check_out_dir(out_dir)
    checked()  # every check has passed: warnings held so far are printed, no more are held
    here = distributed.world()
    if here.parallel:
        device = distributed.device_for(plan.model.device, here)
        plan.model = replace(plan.model, device=device)
        store = plan.store(out_dir)

        def work(_) -> None:
            with store.using():
                _work(plan, store, (here.rank, here.size), rank_warn(here))

        def publish(_) -> None:
            with store.using():
                _publish(plan, store, out_dir, name, here.size)

        with distributed.process_group(here, device):
            run_sharded(here, out_dir, work, publish)
        return
    store = plan.store(out_dir)
    with no_empty_folder(out_dir), store.using():
        _work(plan, store, (0, 1), warn)
        _publish(plan, store, out_dir, name, 1)


def _work(plan, store, part: tuple[int, int], warn_) -> None:
    """This process's points into the store; on a stop, say which points are kept."""
    reporter = Reporter()
    mine = len(range(part[0], len(plan.points), part[1]))
    try:
        with reporter.bar(mine):
            analysis.execute(plan, store, part, progress=reporter.update, warn=warn_)
    except Interrupted:
        _kept(plan, store)
        raise
    except ProbeError as err:
        done = sum(store.done(plan.points))
        if done:
            points = "point is" if done == 1 else "points are"
            raise ProbeError(
                f"{err}; {done} finished {points} kept in {store.folder}, for this command "
                "or any sweep that holds them"
            ) from None
        raise
    if any(store.done(plan.points[part[0] :: part[1]])):
        wrote(store.folder)


def _kept(plan, store) -> None:
    """The interrupt's one line says how many points are kept, and that they resume."""
    done = sum(store.done(plan.points))
    if done:
        wrote(store.folder)
        console.kept[:] = [f"{done} of {len(plan.points)} points are kept there, and the same "
                           "command resumes from them"]  # fmt: skip


def _publish(plan, store, out_dir: Path, name: str, world_size: int) -> None:
    """Every point from the store, gathered into the result and its report; the points are
    then removed from the store (the result holds them) unless another sweep is using it."""
    from probe.reports.sweep_report import render_sweep

    datasets = [store.read(point) for point in plan.points]
    missing = [p.label() for p, ds in zip(plan.points, datasets, strict=True) if ds is None]
    if missing:
        raise ProbeError(f"point {missing[0]} is not in {store.folder}; run the command again")
    ds = analysis.gather(plan, datasets)
    ds.attrs["world_size"] = int(world_size)
    nc, html = write_pair(ds, out_dir, name, render_sweep(ds, result_file=f"{name}.nc"))
    others = store.clean(plan.points)
    print_summary(ds)
    named("result", nc)
    named("report", html)
    named("index", write_index(out_dir))
    if others:
        say(f"probe: note: {store.folder} keeps {others} points of other sweeps, which resume "
            "from them; delete the folder if none will")  # fmt: skip


def _value(at: xr.Dataset, name: str, variant: str, floor_of: xr.Dataset | None = None) -> str:
    """One variant's summary; with ``floor_of`` (the sweep) a distance to rank one, shown
    as below the run's precision floor where it is."""
    if variant not in at.variant.values:
        return "-"
    number = float(at[name].sel(variant=variant))
    if floor_of is not None:
        return shown(number, floor_of, missing="-")
    return f"{number:.3g}" if np.isfinite(number) else "-"


def _rate(at: xr.Dataset, variant: str) -> str:
    """One variant's fitted rate of mu(X) with its R^2, briefly (the report says why one is
    missing)."""
    if variant not in at.variant.values:
        return "-"
    rate, r2 = (
        float(at["mu_rate"].sel(variant=variant)),
        float(at["mu_rate_r2"].sel(variant=variant)),
    )
    if not np.isfinite(rate):
        return "-"
    return f"{rate:.3g} (R² {r2:.2f})" if np.isfinite(r2) else f"{rate:.3g}"


def print_summary(ds: xr.Dataset) -> None:
    """One row per point and init: the summaries of its transformer and its SAN."""
    from probe.figures.plot_sweep import swept

    dims = swept(ds)
    table = Table(title=f"{ds.attrs.get('model', '?')} · sweep", title_justify="left")
    for column in (*dims, "init", "final r (transformer)", "final r (SAN)", "SAN < 1e-3 at",
                   "SAN order", "SAN mu(X) rate", "eff. rank", "sink rate"):  # fmt: skip
        table.add_column(column, justify="right")
    flat = ds[["final_residual", "first_below", "order", "final_effective_rank", "sink_rate",
               "mu_rate", "mu_rate_r2"]].stack(point=dims)  # fmt: skip
    variants = list(ds.variant.values)
    for index in range(flat.sizes["point"]):
        one = flat.isel(point=index)
        for init in ds.init.values:
            at = one.sel(init=init)

            below = int(at["first_below"].sel(variant="SAN")) if "SAN" in variants else -1
            table.add_row(
                *(str(one[d].item()) for d in dims),
                str(init),
                _value(at, "final_residual", "transformer", ds),
                _value(at, "final_residual", "SAN", ds),
                "never" if below < 0 else str(below),
                point_order_text(at, "SAN", ds, missing="-"),
                _rate(at, "SAN"),
                _value(at, "final_effective_rank", "transformer"),
                f"{float(at['sink_rate']):.3g}" if np.isfinite(float(at["sink_rate"])) else "-",
            )
    out.print(table)
    if ds.attrs.get("inputs") == "synthetic ids":
        say("probe: note: no tokenizer could be loaded; inputs are seeded random token ids")
