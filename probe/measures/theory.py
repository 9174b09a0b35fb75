"""The paper's bounds, from the model's own weights, beside the measured residual.

Dong, Cordonnier & Loukas (2021, arXiv 2103.03404; ICML 2021).  The theorem,
corollary and section numbers below are the paper's; its equation numbers are not
cited because the paper's text could not be consulted where this was written (the
formulas were checked against the statements as the paper gives them: the
multi-head form of Theorem 2.2 with its (3^L - 1)/2 exponent, Corollary 3.2's
lambda inside the base).  Notation as in the paper:
tokens are rows, X is (n, d), res(X) = X - 1 x^T, and the composite norm is
||A||_{1,inf} = sqrt(||A||_1 ||A||_inf) (||.||_1 the largest absolute column sum,
||.||_inf the largest absolute row sum).  A head maps X to P_h X W_h with
W_h = W_V,h W_O,h (its value columns times its rows of the output projection) and
scores X W_QK,h X^T / sqrt(d_qk), W_QK,h = W_Q,h W_K,h^T.

* **Theorem 2.2** (SAN, Section 2.2; its multi-head form, Section 2.3): if every
  layer has ||W_QK||_1 ||W_h||_{1,inf} <= beta, then
  ||res(SAN(X))||_{1,inf} <= (4 gamma beta H / sqrt(d_qk))^((3^L - 1)/2) ||res(X)||^(3^L).
  It is proved layer by layer, ||res(X_l)|| <= c_l ||res(X_{l-1})||^3 with
  c_l = 4 gamma beta_l H / sqrt(d_qk); probe takes each layer's own
  beta_l = max_h ||W_QK,h||_1 ||W_h||_{1,inf} and runs that recursion from the
  measured ||res(X_0)||, which gives the theorem's closed form when every beta_l
  is equal.  gamma is the paper's term depending on the attention entries (not on
  the weights); probe draws the bound with gamma = 1 and says so.
* **Corollary 3.1** (skip connections, Section 3.1): with skip connections the
  residual need not fall at all (there are parameterisations with
  ||res(X_L)|| >= ||res(X_0)|| for any depth and any small beta): no upper bound
  to draw; the panel says so and shows the measured SAN+skip residual.
* **Corollary 3.2** (MLPs, Section 3.2): an MLP with Lipschitz constant lambda
  after each attention layer turns the constant into 4 gamma beta H lambda / sqrt(d_qk).
  probe bounds lambda for a token-wise MLP x -> s(x A_1 + b_1) A_2 + b_2 by
  lip(s) ||A_1||_{1,inf} ||A_2||_{1,inf} (both norms are sub-multiplicative for a
  right factor, and an entrywise Lipschitz s keeps them), lip(s) the largest
  slope of the activation measured on a grid.  A gated MLP (SwiGLU, GeGLU)
  grows quadratically: no global Lipschitz constant, and the panel says so.

What the theorems leave out, stated beside every panel: the norms (Section 3.3:
LayerNorm is a per-token rescaling the proofs do not carry; a post-LN SAN's
measured residual can exceed the bound), biases, rotary position embeddings
(queries and keys rotated by position: W_QK as read here ignores the rotation),
and a scale other than 1/sqrt(d_qk).  The bound is **vacuous** at a layer where
it is not below the input's own residual ||res(X_0)|| (it certifies no decrease).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np
import torch
import xarray as xr

from probe.errors import ProbeError
from probe.files.interrupts import check_interrupt
from probe.linalg.lapack import serial_threads
from probe.measures.bounds import PANEL_VARIANTS, variables
from probe.measures.theory_cache import remembered
from probe.measures.theory_norms import (
    composite,
    norm_1,
    norm_1inf,
    norm_inf,
    norms_1_inf,
    residual_norm,
    residual_norms,
)

# The norms live in probe.measures.theory_norms; they are importable from here too.
__all__ = [
    "GATED",
    "PANEL_SEQUENCES",
    "activation_lipschitz",
    "layer_constants",
    "norm_1",
    "norm_1inf",
    "norm_inf",
    "panel",
    "panels",
    "recursion",
    "residual_norm",
    "residual_norms",
]

GATED = "a gated MLP, (s(x A) * (x B)) C, which grows quadratically: no global Lipschitz constant"


#: Entries of one row block of a head's product (_product_norms): 4 MiB of float64.
_BLOCK_ENTRIES = 2**19


def _product_norms(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """(||a b||_1, ||a b||_inf) of a (n, d) by (d, m) product, float64, never forming it whole:
    a tensor of two on a's device (the caller reads a layer's in one copy, not one wait each).

    The n x m product of a head's low-rank factors (d = d_qk << n) is formed a block of rows
    at a time into ``out`` (reused for every head): a fresh n x m float64 matrix per head
    costs a page fault per 4 KiB and another pass through memory: for Llama-3.2-1B (n = 2048,
    16 layers of 32 heads) the constants took 56 s that way and 16.5 s this way on this
    project's CPU, one product at a time (on a day that took 25 s, two side by side took
    15 s).  Every entry is the same dot product as in the whole product; only the order of
    the column sums' additions differs.
    """
    blocks = -(-a.shape[0] * b.shape[1] // _BLOCK_ENTRIES)  # of equal size, the last aside
    rows = -(-a.shape[0] // blocks)
    columns = torch.zeros(b.shape[1], dtype=torch.float64, device=a.device)
    widest = torch.zeros((), dtype=torch.float64, device=a.device)
    for start in range(0, a.shape[0], rows):
        block = a[start : start + rows]
        part = out[: block.shape[0] * b.shape[1]].view(block.shape[0], b.shape[1])
        torch.matmul(block, b, out=part).abs_()
        columns += part.sum(0)
        widest = torch.maximum(widest, part.sum(1).max())
    return torch.stack([columns.max(), widest])


def _serial_pool(device: torch.device):
    """Where a layer's norms run: on a CPU with more than one thread, the threads of
    probe.linalg.lapack.serial_threads, each serial, one head's product at a time; else (or
    called from one of them) None: the calling thread.

    Each head's products are small (768 x 64 x 768 for BERT-base, a few milliseconds each),
    so a thread pool inside each product gains little even on idle cores, and on a shared
    machine every operation's barrier waits for a descheduled thread: bert-base's constants
    took 20 s of CPU time and 70 s of wall time with 2 threads under a load average of 16, and
    2 s and 7 s with one.  Whole products side by side, each in one serial thread, wait for
    each other only at the end of a layer, and a thread that is descheduled holds up its own
    product, not the others'.  The numbers do not change: each norm is computed by the same
    serial code, whichever thread runs it (each entry of a product is one dot product, each
    sum is added in one thread in one order).  The memory does not grow with the threads but
    by a buffer of row blocks (4 MiB) each.
    """
    if device.type != "cpu" or torch.get_num_threads() == 1:
        return None
    return serial_threads()  # None inside one of them: this thread, serial already


@cache
def activation_lipschitz(name: str) -> float:
    """The largest |s'(x)| of a transformers activation, on a fine grid of [-20, 20].

    Parameters
    ----------
    name
        The activation's name in transformers' `ACT2FN` (`gelu`, `relu`, `silu`, ...).

    Returns
    -------
    float
        lip(s), measured on 400,001 points; cached per name.
    """
    from transformers.activations import ACT2FN

    x = torch.linspace(-20, 20, 400_001, dtype=torch.float64, requires_grad=True)
    with torch.enable_grad():  # also inside a caller's torch.no_grad()
        ACT2FN[name](x).sum().backward()
    return float(x.grad.abs().max())


def layer_constants(probed) -> dict[str, Any]:
    """Per layer the constants of Theorem 2.2 and Corollary 3.2 from the model's weights.

    Parameters
    ----------
    probed : ProbedModel
        The loaded model; its weights are read, not run.

    Returns
    -------
    dict[str, Any]
        Lists over layers 1..L: `qk` = max_h ||W_QK,h||_1, `vo` = max_h ||W_h||_{1,inf},
        `beta` = max_h of their product, `c` = 4 beta H / sqrt(d_qk) (gamma = 1), `lambda`
        (NaN where the family gives none); and `heads`, `d_qk`, `lipschitz_activation`,
        `notes` (what the bound leaves out in this family) and `missing` (one line per
        constant the family cannot give).  Only `missing` where the family has no constants.
    """
    from probe.models.spec import SpecAdapter
    from probe.models.weights import resolve_module

    adapter, model, config = probed.adapter, probed.model, probed.config
    L = probed.n_layers
    out: dict[str, Any] = {"missing": []}
    if not isinstance(adapter, SpecAdapter) or adapter.spec.heads_of(probed.config) is None:
        out["missing"].append(
            f"beta: the {adapter.family} family's attention is not read by probe's weight "
            "walker (no query/key/value layout), so Theorem 2.2 has no constants here"
        )
        return out
    spec = adapter.spec
    H = adapter.n_heads(config)
    kv = spec.kv_heads_of(config, H)
    layers = resolve_module(model, spec.layers)
    mlp = spec.mlp_of(config)  # the family's entry says where its MLP is, or that it is gated
    mlp = None if mlp.gated else mlp
    lip = activation_lipschitz(mlp.activation_of(config)) if mlp else float("nan")
    norms, d, error = _per_layer_norms(probed, L, layers, spec, (H, kv), mlp, lip)
    if error is not None:
        out["missing"] = [f"beta: {error}"]
        return out
    qk, vo, beta, lam = norms
    if not mlp:
        out["missing"].append(f"lambda (Corollary 3.2): the {spec.name} family has {GATED}")
        lam = [float("nan")] * L
    notes = _config_notes(config, spec, layers[0])
    vo, beta, c = _branch_and_scale(config, spec, H, d, vo, beta, notes)
    out.update(
        qk=qk,
        vo=vo,
        beta=beta,
        heads=H,
        d_qk=int(d),
        c=c,
        **{"lambda": lam},
        lipschitz_activation=lip,
        notes=notes,
    )
    return out


def _per_layer_norms(probed, L: int, layers, spec, heads: tuple[int, int], mlp, lip: float):
    """Lists over layers of max_h ||W_QK,h||_1, max_h ||W_h||_{1,inf}, beta and lambda (empty
    without ``mlp``), d_qk, and None; or None, None and the error where a layer's query/key
    layout cannot be read."""
    from probe.models.weights import query_key

    H, kv = heads
    qk, vo, beta, lam = [], [], [], []
    pool = _serial_pool(probed.device)
    scratch: dict[int, torch.Tensor] = {}  # per thread: the row blocks of its products
    d = None
    for index in range(L):
        check_interrupt()  # a large model's constants take seconds per layer
        try:  # views of the weights, no arithmetic: read here
            query_keys = query_key(
                layers[index], spec.heads_of(probed.config), probed.config, H, kv
            )
        except ProbeError as error:
            return None, None, error
        values, d = _layer_norms(
            layers[index], query_keys, spec, probed.config, (H, kv), mlp, pool, scratch
        )
        heads_qk = [qk_1 for qk_1, _ in values[:H]]
        heads_vo = [composite(*pair) for pair in values[H : 2 * H]]
        qk.append(max(heads_qk))
        vo.append(max(heads_vo))
        beta.append(max(a * b for a, b in zip(heads_qk, heads_vo, strict=True)))
        if mlp:
            first_norms, second_norms = values[2 * H :]
            lam.append(lip * composite(*first_norms) * composite(*second_norms))
    return (qk, vo, beta, lam), d, None


def _config_notes(config, spec, first_layer) -> list[str]:
    """What the bound leaves out in this family, read from its config and first layer."""
    from probe.models.weights import resolve_module

    scale = getattr(config, "query_pre_attn_scalar", None)
    notes = []
    rotary = getattr(config, "rope_theta", None) is not None or "rope" in str(
        getattr(config, "rope_scaling", "") or getattr(config, "position_embedding_type", "")
    )
    if rotary or getattr(config, "rotary_dim", None) or getattr(config, "rotary_pct", None):
        notes.append("rotary position embeddings rotate queries and keys: W_QK ignores them")
    if scale is not None:
        notes.append("the attention's scale is not 1/sqrt(d_qk) in this family")
    if getattr(config, "relative_attention", False):
        notes.append("relative position terms add to the attention scores: W_QK leaves them out")
    notes += [note for note in spec.score_notes if note not in notes]
    qk_norms = [p for p in spec.qk_norms if resolve_module(first_layer, p, missing_ok=True)]
    if qk_norms:
        notes.append(
            f"query/key norms ({', '.join(qk_norms)}) rescale each token's queries and keys "
            "inside the scores: W_QK leaves them out"
        )
    return notes


def _branch_and_scale(config, spec, H: int, d, vo: list, beta: list, notes: list[str]):
    """``vo`` and ``beta`` times the family's branch multiplier, and c; ``notes`` says so."""
    m = abs(spec.branch_multiplier(config))
    if m != 1:  # Granite adds m times each branch: W_h = m W_V W_O
        vo, beta = [v * m for v in vo], [b * m for b in beta]
        notes.append(f"each branch is added times residual_multiplier {m:g}: W_V W_O includes it")
    c = [4.0 * b * H / math.sqrt(d) for b in beta]
    if spec.attention_multiplier:  # Granite: the scores' scale replaces 1/sqrt(d_qk)
        score = float(getattr(config, spec.attention_multiplier))
        notes.append(f"the scores are scaled by {spec.attention_multiplier} {score:g}: c uses it")
        c = [4.0 * b * H * score for b in beta]
    return vo, beta, c


def _layer_norms(layer, query_keys, spec, config, heads: tuple[int, int], mlp, pool, scratch):
    """One layer's norms, read in one copy: (||.||_1, ||.||_inf) of each head's W_QK (from
    ``query_keys``, its (w_q, w_k)), then of each head's W_V W_O, then of the MLP's two
    matrices (where it has them); and d_qk.  Each of them is one task for ``pool`` (or, where
    it is None, for this thread); ``scratch``: thread id -> its buffer for the row blocks of
    ``_product_norms``, made once per thread and reused for every head and layer."""
    from probe.models.weights import resolve_module, value_output

    H, kv = heads
    w_q, w_k = query_keys
    with torch.no_grad():
        w_v, _, w_o, _ = value_output(layer, spec.heads_of(config), config, H, kv)
        d = w_q.shape[-1]
        size = _BLOCK_ENTRIES + w_q.shape[1]
        w_q, w_k, w_v, w_o = (w.double() for w in (w_q, w_k, w_v, w_o))
        tasks = [(w_q[h], w_k[h].T) for h in range(H)] + [(w_v[h], w_o[h]) for h in range(H)]
        if mlp:
            first = resolve_module(layer, mlp.first).weight.detach().double()
            second = resolve_module(layer, mlp.second).weight.detach().double()
            if mlp.layout == "linear":  # nn.Linear y = x W^T: the right factor is W^T
                first, second = first.T, second.T
            tasks += [(first, None), (second, None)]
        if pool is None:
            norms = [_norms_of(a, b, size, scratch) for a, b in tasks]
        else:
            pending = [pool.submit(_norms_of, a, b, size, scratch) for a, b in tasks]
            try:
                norms = [future.result() for future in pending]
            finally:  # an interrupt: the norms not yet started are not started
                for future in pending:
                    future.cancel()
        # Every norm of the layer as one tensor, read in one copy: on CUDA a float() per
        # norm made the host wait for the device 48 times a layer (bert-base).
        return torch.stack(norms).tolist(), d


def _norms_of(a: torch.Tensor, b: torch.Tensor | None, size: int, scratch: dict) -> torch.Tensor:
    """(||.||_1, ||.||_inf) of the product a b (``_product_norms``, in this thread's buffer of
    ``size`` entries) or, where b is None, of a itself."""
    if b is None:
        return norms_1_inf(a)
    buffer = scratch.get(threading.get_ident())
    if buffer is None:
        buffer = torch.empty(size, dtype=torch.float64, device=a.device)
        scratch[threading.get_ident()] = buffer
    return _product_norms(a, b, buffer)


def recursion(r0: np.ndarray, c: list[float], lam: list[float] | None = None) -> np.ndarray:
    """The bound run layer by layer: R_0 = r0, R_l = c_l (lambda_l) R_{l-1}^3.

    Computed in log space: a bound past float64's range is inf, never NaN.

    Parameters
    ----------
    r0
        (sequence,): the measured ||res(X_0)||_{1,inf}.
    c
        c_l of layers 1..L (Theorem 2.2).
    lam
        lambda_l of layers 1..L (Corollary 3.2); None: Theorem 2.2 alone.

    Returns
    -------
    numpy.ndarray
        (layer 0..L, sequence).
    """
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        log_r = [np.log(r0)]
        for index, c_l in enumerate(c):
            factor = c_l * (lam[index] if lam is not None else 1.0)
            log_r.append(np.log(factor) + 3.0 * log_r[-1])
        return np.exp(np.stack(log_r))


#: The panel measures the first this many sequences of a run's first batch.
PANEL_SEQUENCES = 8


def panel(
    probed,
    input_ids: torch.Tensor,
    mask: torch.Tensor,
    measured: dict[str, np.ndarray] | None = None,
) -> dict[str, Any]:
    """The theory panel's numbers for one model: constants, measured residuals of SAN,
    SAN+MLP and SAN+skip on these sequences, the two bounds and where they are vacuous.

    Parameters
    ----------
    probed : ProbedModel
        The loaded model.
    input_ids
        The sequences measured, as [`layer_values`][probe.surgery.trace.layer_values] takes them.
    mask
        (sequence, token), 1 at real tokens.
    measured
        Variant -> (layer, sequence) residual norms
        ([`residual_norms`][probe.measures.theory.residual_norms]) a caller already took from its own
        forward passes of these sequences (the collapse run does); a variant it lacks is
        traced here.

    Returns
    -------
    dict[str, Any]
        `init` and the entries of [`layer_constants`][probe.measures.theory.layer_constants]; where
        the family gives the constants, also `measured` (variant -> median residual per
        layer) and `bounds` (per bound: its `variant`, and per layer the median `bound`, the
        median `ratio` measured / bound, and `vacuous`, None at layer 0).

    Raises
    ------
    ProbeError
        A trace the model cannot run (see [`layer_values`][probe.surgery.trace.layer_values]).
    """
    from probe.loading import onloaded
    from probe.surgery.ablate import PRESETS
    from probe.surgery.trace import layer_values

    def compute() -> dict[str, Any]:
        with onloaded(probed.model):  # weights a device_map offloaded, read in for them
            return layer_constants(probed)

    found = remembered(probed, compute)  # a pure function of the weights: kept once computed
    result: dict[str, Any] = {"init": probed.init, **found}
    if "beta" not in found:
        return result
    measured = dict(measured or {})
    for name in PANEL_VARIANTS:
        if name not in measured:
            values = layer_values(probed, input_ids, PRESETS[name], residual_norm, mask)
            measured[name] = np.stack(values)  # (layer, sequence)
    r0 = measured["SAN"][0]
    bounds = {"Theorem 2.2 (SAN)": recursion(r0, found["c"])}
    if not np.isnan(found["lambda"]).any():
        bounds["Corollary 3.2 (SAN+MLP)"] = recursion(r0, found["c"], found["lambda"])
    against = {"Theorem 2.2 (SAN)": "SAN", "Corollary 3.2 (SAN+MLP)": "SAN+MLP"}
    result["measured"] = {k: np.median(v, axis=1).tolist() for k, v in measured.items()}
    result["bounds"] = {}
    for name, bound in bounds.items():
        # A bound of 0 (the input is already rank one: r_0 = 0) has no ratio: NaN, silently.
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = measured[against[name]] / bound
        # Layer 0 is the input itself (bound = measured): vacuity is a question from layer 1.
        vacuous = [None] + [bool(b >= np.median(r0)) for b in np.median(bound, axis=1)[1:]]
        result["bounds"][name] = {
            "variant": against[name],
            "bound": np.median(bound, axis=1).tolist(),
            "ratio": np.median(ratio, axis=1).tolist(),
            "vacuous": vacuous,
        }
    return result


def panels(
    models,
    inputs,
    batch_size: int,
    sequences: int = PANEL_SEQUENCES,
    measured: list[dict[str, np.ndarray]] | None = None,
    unread: Callable[[Any], str] | None = None,
) -> xr.Dataset:
    """The theory panel of every init of a collapse run, as result variables.

    Parameters
    ----------
    models : list[ProbedModel]
        The run's models, one per init.
    inputs : probe.requests.inputs.Encoded
        The run's encoded inputs.
    batch_size
        The run's batch size.
    sequences
        The panel measures the first this many sequences of the first batch.
    measured
        Per model, what [`panel`][probe.measures.theory.panel] may take instead of tracing.
    unread
        Why the panel may not read a model's heads ("" where it may): the identity `probe
        check` holds the entry's `heads` to (`probe.analyses.path_checks.problem`); a model
        refused so has no constants, and the reason as its missing line.

    Returns
    -------
    xarray.Dataset
        The panel's variables (`probe.measures.bounds.variables`) on the run's `init` and `layer`
        coordinates.  A model whose panel raised a [`ProbeError`][probe.errors.ProbeError]
        has NaN throughout, and the error as its missing line.
    """
    _, ids, mask = next(iter(inputs.batches(min(batch_size, sequences))))
    found = []
    for index, probed in enumerate(models):
        if unread is not None and (why := unread(probed)):
            found.append({"init": probed.init, "missing": [f"beta: {why}"]})
            continue
        try:
            found.append(panel(probed, ids, mask, measured[index] if measured else None))
        except ProbeError as error:
            found.append({"init": probed.init, "missing": [str(error)]})
    return variables(found, np.arange(models[0].n_layers + 1))
