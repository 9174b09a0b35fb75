"""The CUDA code paths against the CPU on the same inputs (marker ``cuda``).

Each test runs one path on the device under test and the same work on the CPU, with the
same weights (read from a folder, so that no device draws them), and compares:

* ``collapse.run`` through the CUDA measuring loop (layers copied inside the trace, measured
  on a side stream by a worker thread, numbers copied to pinned host memory);
* the effective-rank estimate, which ``auto`` chooses on CUDA above ``EXACT_UP_TO_GPU``;
* bfloat16 weights, from a folder and at random init (built on the device in bfloat16);
* a model spread by ``--device-map`` over the GPU and the CPU;
* ``probe attention`` (batched statistics of the attention maps);
* a torchrun job of one rank with nccl beside gloo, against the plain command.

``benchmarks/gpu.sh`` runs them on a GPU (``pytest -m cuda``).  ``PROBE_TEST_DEVICE=cpu``
runs the same checks with the CPU as the device under test, which checks the tests
themselves on a machine without a GPU; without a CUDA device they are skipped otherwise.

Tolerances, CUDA against the CPU: the kernels sum in other orders (cuBLAS's blocking, fused
attention, other reduction trees), so float64 results differ by a few units of 1e-16 per
operation, which the layers and the metrics' float64 eigensolvers carry to at most ~1e-12
relative: asserted at 1e-9 (1e-6 for rotary families, whose cos/sin tables are float32 in
every dtype, see ``_rtol``).  A float32 forward differs by ~1e-6 relative per layer on
these 2-3 layer models; the metrics, computed in float64 from those hidden states, are
well-conditioned away from collapse (random tiny models are far from it): 1e-4.  In
bfloat16 (8 significant bits, ~4e-3 per rounding) a forward's hidden states differ by a
few roundings: 5e-2.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import probe
from probe.analyses import attention, collapse
from probe.measures import bounds
from probe.measures.attention_stats import KRYLOV_FROM, top_two
from probe.measures.metrics import collapse_metrics, effective_rank_method
from tests.cli_process import launch

DEVICE = os.environ.get("PROBE_TEST_DEVICE", "cuda")
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        DEVICE.startswith("cuda") and not torch.cuda.is_available(),
        reason="needs a CUDA device (PROBE_TEST_DEVICE=cpu runs these checks on the CPU)",
    ),
]
ON_CUDA = DEVICE.startswith("cuda")
RTOL = {"float64": 1e-9, "float32": 1e-4, "bfloat16": 5e-2}
ROTARY = {"llama"}
METRICS = ("relative_residual", "mu", "effective_rank", "stable_rank", "cosine_similarity")
# 5 sequences in batches of 2: three batches, the last one short, so the CUDA loop measures
# one batch while the next one's forwards run, and drains the last at the end.
SMALL = {"sequences": 5, "tokens": 16, "batch_size": 2, "seed": 0}


def _rtol(family: str, dtype: str) -> float:
    # Rotary families compute their cos/sin tables in float32 whatever the model's dtype
    # (transformers' rotary embedding), and CUDA's float32 cos and sin differ from the
    # CPU's by up to an ulp (6e-8): a float64 run's attention logits then differ by ~1e-8
    # relative (seen on an H100: 7.8e-9 in a sink score), which the layers carry.
    if family in ROTARY and dtype == "float64":
        return 1e-6
    return RTOL[dtype]


def _close(a, b, rtol: float, what: str) -> None:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, what
    assert np.array_equal(np.isnan(a), np.isnan(b)), f"{what}: NaN in other places"
    ok = ~np.isnan(a)
    # relative to each value, with an absolute floor at rtol for values near 0
    error = np.abs(a[ok] - b[ok]) / np.maximum(np.abs(b[ok]), 1.0)
    worst = float(error.max()) if error.size else 0.0
    assert worst <= rtol, f"{what}: worst relative difference {worst:.3g} > {rtol:g}"


def _collapse(folder: str, device: str, dtype: str, **extra):
    probed = probe.load(folder, device=device, dtype=dtype)
    return collapse.run(probed, init=probed.init, variants="all", metrics="all", **SMALL, **extra)


@pytest.fixture(scope="module")
def folders(tiny_folders, tiny_family_folder):
    """family -> a folder of its tiny random model (float32 weights)."""
    return {**tiny_folders, "llama": tiny_family_folder("llama")}


@pytest.mark.parametrize("family", ["gpt2", "bert", "llama"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_collapse_on_the_device_equals_the_cpu(folders, family, dtype):
    # "exact" on both: the same method, so only the arithmetic differs.
    here = _collapse(folders[family], DEVICE, dtype, effective_rank="exact")
    cpu = _collapse(folders[family], "cpu", dtype, effective_rank="exact")
    assert here.attrs["device"].startswith(DEVICE.split(":")[0])
    rtol = _rtol(family, dtype)
    for name in METRICS:
        _close(here[name], cpu[name], rtol, f"{family} {dtype} {name}")
    # the theory panel: residual norms measured in the same forwards, bounds from weights
    for name in bounds.VARIABLES:
        if np.issubdtype(cpu[name].dtype, np.floating):
            _close(here[name], cpu[name], rtol, f"{family} {dtype} {name}")
        else:
            np.testing.assert_array_equal(here[name], cpu[name], err_msg=name)


def test_the_estimate_auto_picks_on_cuda_equals_the_cpus_estimate():
    # Its probe vectors are drawn on the CPU from a fixed seed and moved to the device, so
    # the device's estimate is the CPU's up to rounding, which can tip a borderline Ritz pair
    # in or out of the deflated top: 1e-4 relative at most (probe.linalg.quadrature).  Tiny
    # models have too few dimensions for the estimate (metrics.ESTIMATE_FROM), and up to
    # metrics.EXACT_UP_TO_GPU a GPU takes the exact value: these sequences have 160.
    assert effective_rank_method("auto", 160, 192, DEVICE) == ("estimate" if ON_CUDA else "exact")
    assert effective_rank_method("auto", 16, 32, DEVICE) == "exact"  # too small: exact anywhere
    generator = torch.Generator().manual_seed(9)
    X = torch.randn(4, 160, 192, generator=generator, dtype=torch.float64)
    X[1] = X[1, :1] + 0.2 * X[1]  # partly collapsed
    mask = torch.ones(4, 160, dtype=torch.bool)
    mask[3, 70:] = False
    names = ("effective_rank",)
    here = collapse_metrics(X.to(DEVICE), mask.to(DEVICE), names)["effective_rank"].cpu()
    cpu = collapse_metrics(X, mask, names, "estimate")["effective_rank"]
    exact = collapse_metrics(X, mask, names, "exact")["effective_rank"]
    if ON_CUDA:
        _close(here, cpu, 1e-4, "estimate on the device vs the CPU's")
    _close(here, exact, 0.02, "estimate vs exact")  # the estimate's stated accuracy


def test_metrics_of_one_tensor_on_the_device(tiny_folders):
    generator = torch.Generator().manual_seed(5)
    X = torch.randn(3, 300, 64, generator=generator, dtype=torch.float64)
    X[1] = X[1, :1] + 1e-9 * X[1]  # nearly collapsed: the accurate fallbacks run
    mask = torch.ones(3, 300, dtype=torch.bool)
    mask[2, 250:] = False
    for method in ("exact", "estimate"):
        here = collapse_metrics(X.to(DEVICE), mask.to(DEVICE), effective_rank=method)
        cpu = collapse_metrics(X, mask, effective_rank=method)
        for name, value in here.items():
            assert value.device.type == DEVICE.split(":")[0] and value.dtype == torch.float64
            _close(value.cpu(), cpu[name], RTOL["float64"], f"{method} {name}")


def test_bfloat16_weights_from_a_folder_are_the_cpus(folders):
    here = probe.load(folders["llama"], device=DEVICE, dtype="bfloat16")
    cpu = probe.load(folders["llama"], device="cpu", dtype="bfloat16")
    ours, theirs = here.model.state_dict(), cpu.model.state_dict()
    assert ours.keys() == theirs.keys()
    for name, tensor in ours.items():
        assert tensor.device.type == DEVICE.split(":")[0], name
        if tensor.is_floating_point():
            assert tensor.dtype == torch.bfloat16, name
        assert torch.equal(tensor.cpu(), theirs[name]), name  # a cast: bit for bit
    a = collapse.run(here, init=here.init, **SMALL, effective_rank="exact")
    b = collapse.run(cpu, init=cpu.init, **SMALL, effective_rank="exact")
    for name in ("relative_residual", "cosine_similarity"):
        _close(a[name], b[name], RTOL["bfloat16"], f"bfloat16 {name}")


def test_bfloat16_random_init_is_built_on_the_device_from_the_seed():
    config = {"n_layer": 2, "n_embd": 64, "n_head": 4}
    a = probe.load("gpt2", init="random", seed=3, device=DEVICE, dtype="bfloat16", config=config)
    b = probe.load("gpt2", init="random", seed=3, device=DEVICE, dtype="bfloat16", config=config)
    for (name, x), y in zip(
        a.model.state_dict().items(), b.model.state_dict().values(), strict=True
    ):
        assert x.device.type == DEVICE.split(":")[0], name
        if x.is_floating_point():
            assert x.dtype == torch.bfloat16 and bool(torch.isfinite(x).all()), name
        assert torch.equal(x, y), name  # the seed fixes the device's draw too
    result = collapse.run(a, init=a.init, **SMALL)
    assert np.isfinite(result["relative_residual"].values).all()


def test_a_model_spread_over_the_device_and_the_cpu_gives_the_whole_models_numbers(
    tiny_folders, tmp_path
):
    folder = tiny_folders["gpt2"]
    whole = probe.load(folder, device=DEVICE, dtype="float64")
    if ON_CUDA:  # the embeddings and the first half of the layers on the GPU, the rest on the CPU
        n = whole.model.config.n_layer
        layers = {f"h.{i}": 0 if i < n // 2 else "cpu" for i in range(n)}
        options = {"device_map": {"wte": 0, "wpe": 0, "drop": 0, **layers, "ln_f": "cpu"}}
    else:  # on a CPU-only machine: memory and disk, as tests/test_device_map.py
        size = sum(p.numel() * p.element_size() for p in whole.model.parameters())
        options = {"device_map": "auto", "max_memory": {"cpu": int(0.6 * size)}}
    spread = probe.load(folder, dtype="float64", offload_folder=tmp_path / "offload", **options)
    placed = {str(where) for where in spread.device_map.values()}
    assert len(placed) == 2, spread.device_map  # really split
    a = collapse.run(whole, init=whole.init, **SMALL, effective_rank="exact")
    b = collapse.run(spread, init=spread.init, **SMALL, effective_rank="exact")
    for name in METRICS:
        _close(b[name], a[name], RTOL["float64"], f"device map {name}")


def test_attention_statistics_on_the_device_equal_the_cpus(folders):
    here = probe.load(folders["llama"], device=DEVICE, dtype="float64")
    cpu = probe.load(folders["llama"], device="cpu", dtype="float64")
    here, cpu = (attention.run(m, init=m.init, **SMALL) for m in (here, cpu))
    assert here.data_vars.keys() == cpu.data_vars.keys()
    for name in cpu.data_vars:
        if np.issubdtype(cpu[name].dtype, np.floating):
            _close(here[name], cpu[name], _rtol("llama", "float64"), f"attention {name}")
        else:
            np.testing.assert_array_equal(here[name], cpu[name], err_msg=name)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("T", [96, KRYLOV_FROM + 64])
def test_the_attention_spectrum_on_the_device_against_numpy(T, dtype):
    # Below KRYLOV_FROM the device's matrices go to the host's LAPACK (the CPU's values, bit
    # for bit); from it on the batched Krylov run stays on the device.  Causal rows (certified
    # by the run) and flat ones (the dense fallback), padded; within the dense path's 4 T eps
    # sigma_1 of numpy's float64 SVD of the same entries, eps the working precision's
    # (tests/test_attention_krylov.py).
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(6, T, T, generator=generator, dtype=torch.float64)
    logits[:3] = logits[:3].masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), -torch.inf)
    logits[3:] *= 0.3
    A = torch.softmax(logits, -1).to(dtype)
    A[1, T - 40 :], A[1, :, T - 40 :] = 0.0, 0.0  # padding: zero rows and columns
    sigma_1, sigma_2, frobenius = (v.cpu() for v in top_two(A.to(DEVICE)))
    exact = A.to(torch.float64)
    want = np.linalg.svd(exact.numpy(), compute_uv=False)
    eps = float(torch.finfo(dtype).eps)
    tol = 4 * T * eps * want[:, 0]
    assert (np.abs(sigma_1.numpy() - want[:, 0]) <= tol).all()
    assert (np.abs(sigma_2.numpy() - want[:, 1]) <= tol).all()
    # Each square rounded once to the working precision, summed in float64.
    rtol = eps / 2 + 8 * T * 2**-52
    np.testing.assert_allclose(frobenius, (exact**2).sum((-2, -1)), rtol=rtol)
    if T < KRYLOV_FROM:
        assert torch.equal(torch.stack([sigma_1, sigma_2]), torch.stack(top_two(A)[:2]))


def test_torchrun_of_one_rank_gives_the_plain_commands_result(tiny_folders, tmp_path):
    # One rank: the job still sets up its process group (nccl for the GPU beside gloo, or
    # gloo alone on the CPU), checks it, streams a shard and merges it.
    args = ["collapse", tiny_folders["gpt2"], "--tokens", "16", "--sequences", "5",
            "--batch-size", "2", "--device", DEVICE, "-q"]  # fmt: skip
    env = {"NCCL_DEBUG": "INFO"}
    plain = launch(args, tmp_path / "plain", env=env)
    job = launch(args, tmp_path / "job", ranks=1, env=env)
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert job.returncode == 0, job.stderr[-2000:]
    (a,) = (tmp_path / "plain").glob("*.nc")
    (b,) = (tmp_path / "job").glob("*.nc")
    a, b = probe.open_result(a), probe.open_result(b)
    assert b.attrs["world_size"] == 1
    if ON_CUDA:  # nccl set up its communicator (NCCL_DEBUG=INFO prints it)
        assert "NCCL INFO" in job.stdout + job.stderr, job.stderr[-2000:]
    for name in METRICS:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)  # the same forwards
