"""The toy tasks' data: valid labels, checked against independent computations."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy.spatial import ConvexHull

from probe.errors import ProbeError
from probe.toy import tasks


def test_sort_targets_are_the_sorted_inputs() -> None:
    x, y = tasks.sort_data(500, 8, 10, np.random.default_rng(0))
    assert x.shape == y.shape == (500, 8)
    assert x.min() >= 0 and x.max() <= 9
    assert (np.diff(y, axis=1) >= 0).all()  # non-decreasing
    for row_x, row_y in zip(x, y, strict=True):  # same multiset of symbols
        assert np.array_equal(np.bincount(row_x, minlength=10), np.bincount(row_y, minlength=10))
    assert any(len(set(row)) < 8 for row in x)  # repeats are allowed, and occur


def test_hull_labels_match_scipy() -> None:
    xy, labels = tasks.hull_data(300, 10, 10.0, 3.3, np.random.default_rng(1))
    assert xy.shape == (300, 10, 2) and labels.shape == (300, 10)
    for points, label in zip(xy, labels, strict=True):
        expected = np.zeros(10, dtype=np.int64)
        expected[ConvexHull(points.astype(np.float64)).vertices] = 1
        np.testing.assert_array_equal(label, expected)


def test_hull_points_are_the_papers_distribution() -> None:
    """run_convex_hull.py: 10 points uniform in [0, 10]^2, the set shifted by N(0, 3.3^2)."""
    n = 4000
    xy, _ = tasks.hull_data(n, 10, 10.0, 3.3, np.random.default_rng(2))
    spans = xy.max(axis=1) - xy.min(axis=1)
    assert (spans <= 10 + 1e-5).all() and spans.max() > 9  # a 10 x 10 square per set
    # Each set's offset is where its square starts; with 10 uniform points, each set's mean
    # is 5 + shift + noise of std 10 / sqrt(12 * 10) = 0.91 per coordinate.
    centre = xy.mean(axis=1) - 5.0  # (n, 2) = shift + noise
    spread = np.sqrt(3.3**2 + 10**2 / 120)
    # 8000 draws: the sample std is within 3 standard errors (1.6%) of the true one.
    assert abs(centre.std() / spread - 1) < 0.05
    assert abs(centre.mean()) < 0.2  # centred: 3 standard errors of the mean are 0.12
    unit, _ = tasks.hull_data(50, 10, 1.0, 0.0, np.random.default_rng(3))
    assert unit.min() >= 0 and unit.max() <= 1  # box 1, no shift: the unit square


@settings(max_examples=60, deadline=None)
@given(arrays(np.int64, (9, 2), elements=st.integers(-30, 30)))
def test_hull_vertices_property(grid: np.ndarray) -> None:
    """Against scipy on integer point sets (exact orientation tests; collinear and
    repeated points included), wherever scipy has a hull."""
    points = grid.astype(np.float64)
    try:
        hull = ConvexHull(points)
    except Exception:  # collinear or coincident sets: scipy (qhull) refuses; skip those
        return
    ours = set(np.flatnonzero(tasks.hull_vertices(points)))
    theirs = set(hull.vertices)
    # Duplicate points: scipy names one copy of a vertex, the chain keeps another.
    assert {tuple(points[i]) for i in ours} == {tuple(points[i]) for i in theirs}


def test_memorization_windows_come_from_the_text() -> None:
    ids = tasks.text_tokens(tasks.read_text(None))
    assert len(ids) > 1000 and ids.min() >= 0
    windows, labels = tasks.memorization_data(ids, 20, 16, np.random.default_rng(3))
    assert windows.shape == labels.shape == (20, 16)
    assert set(np.unique(labels)) == {0, 1}
    text = ids.tolist()
    for w in windows:
        starts = [i for i in range(len(text) - 15) if text[i : i + 16] == w.tolist()]
        assert starts, "every window is a piece of the token stream"
    compact, used = tasks.compact_vocab(windows)
    np.testing.assert_array_equal(used[compact], windows)
    assert compact.max() == len(used) - 1


def test_memorization_refuses_a_short_text() -> None:
    with pytest.raises(ProbeError, match="at least 128"):
        tasks.memorization_data(np.arange(50), 4, 128, np.random.default_rng(0))


def test_read_text_errors(tmp_path) -> None:
    with pytest.raises(ProbeError, match="no such file"):
        tasks.read_text(tmp_path / "missing.txt")
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe\xfa")
    with pytest.raises(ProbeError, match="UTF-8"):
        tasks.read_text(bad)


def test_circle_targets_are_one_step_on() -> None:
    x, y = tasks.circle_data(1000)
    assert x.shape == y.shape == (499, 2, 2)
    np.testing.assert_allclose(np.linalg.norm(x, axis=-1), 0.3, rtol=1e-6)
    angle = lambda p: np.arctan2(p[..., 1], p[..., 0])  # noqa: E731
    step = np.angle(np.exp(1j * (angle(y) - angle(x))))
    # float32 points: angles good to ~1e-6 rad.
    np.testing.assert_allclose(step, 2 * np.pi / 1000, atol=1e-5)
    # As run_circle.py pairs them: point i with point i + 499 (len(dataset) = n/2 - 1), one
    # on each arc, just short of half a turn apart.
    gap = np.angle(np.exp(1j * (angle(x[:, 1]) - angle(x[:, 0]))))
    np.testing.assert_allclose(gap, 2 * np.pi * 499 / 1000, atol=1e-5)
    np.testing.assert_allclose(x[0, 0], [0.3, 0.0], atol=1e-7)
    with pytest.raises(ProbeError):
        tasks.circle_data(7)


def test_same_seed_same_data() -> None:
    a = tasks.hull_data(5, 10, 10.0, 3.3, np.random.default_rng(9))
    b = tasks.hull_data(5, 10, 10.0, 3.3, np.random.default_rng(9))
    assert all(np.array_equal(p, q) for p, q in zip(a, b, strict=True))
