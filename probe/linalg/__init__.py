"""Batched numerical linear algebra for the collapse metrics (probe.measures.metrics builds on it).

Everything here works on a batch of sequences at once -- (sequence, token, hidden) float64
tensors X and their k x k Gram matrices, k = min(token, hidden) -- and gives each sequence the
numbers it would get alone (rounding of the batched matmuls aside).  Only the effective rank's
exact method needs a whole spectrum; everything else is matmul-shaped.  Data flows one way:
probe.measures.metrics imports from here, nothing here imports probe.measures.metrics.

* ``gram``: Gram products, and the Gram operators of X, of the mean residual R and of the
  rank-one residual R_1, all applied through R's Gram matrix;
* ``krylov``: Lanczos with full reorthogonalisation and Rayleigh-Ritz, many problems sharing
  each product, with Kato-Temple stopping;
* ``top``: the top of the spectrum the relative residual and stable rank need (u_1, s_1, R_1,
  ||R||_2, s_2), by Krylov runs or, on a CPU for small k, dense eigensolves;
* ``dense``: inverse iteration, and every singular value from a dense eigensolve (the exact
  effective rank);
* ``quadrature``: the effective rank estimate by stochastic Lanczos quadrature;
* ``lapack``: small eigenproblems on the host's LAPACK, split over the CPU's threads;
* ``workspace``: float64 buffers reused from call to call, fixed pseudo-random tensors;
* ``batch``: a batch's rows, per-row dot products, unit vectors and norms.

Everything runs on X's device with the same code: the products (the Gram matrices, the Krylov
steps, the passes over X) stay there, and only the small dense eigenproblems go to the host
(``lapack``).  Each module states its method's accuracy; tests/test_linalg.py pins it against
the float64 SVD reference (tests/reference/metrics_numpy.py).
"""
