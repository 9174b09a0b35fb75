"""The path vocabulary: counts by hand, by enumeration and as properties."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from probe.measures.path_vocabulary import (
    SKIP,
    all_paths,
    count_by_length,
    parse_path,
    path_length,
    path_str,
    random_path,
    random_paths,
    total_paths,
)


def test_counts_by_hand():
    # L=2, H=2: lengths 0, 1, 2 have 1, C(2,1)*2 = 4 and 2^2 = 4 paths; 3^2 = 9 in all.
    assert count_by_length(2, 2) == [1, 4, 4]
    assert total_paths(2, 2) == 9
    # BERT-base: 13^12, exact.
    assert total_paths(12, 12) == 23298085122481
    assert sum(count_by_length(12, 12)) == 23298085122481


@given(st.integers(0, 60), st.integers(1, 128))
def test_counts_sum_to_total(layers, heads):
    assert sum(count_by_length(layers, heads)) == (heads + 1) ** layers


@pytest.mark.parametrize(("layers", "heads"), [(0, 1), (1, 3), (3, 2), (4, 3)])
def test_enumeration_matches_counts(layers, heads):
    paths = list(all_paths(layers, heads))
    assert len(paths) == len(set(paths)) == total_paths(layers, heads)
    by_length = Counter(path_length(p) for p in paths)
    assert [by_length[k] for k in range(layers + 1)] == count_by_length(layers, heads)


def test_text_round_trip_and_errors():
    path = (SKIP, 3, SKIP, 0)
    assert path_str(path) == "s.3.s.0"
    assert parse_path("s.3.s.0") == path
    assert path_length(path) == 2
    with pytest.raises(ValueError, match="bad path"):
        parse_path("s.4", heads=4)
    with pytest.raises(ValueError, match="bad path"):
        parse_path("x.1")


@given(st.integers(1, 8), st.integers(1, 5), st.data())
def test_random_path_has_the_asked_length(layers, heads, data):
    length = data.draw(st.integers(0, layers))
    path = random_path(layers, heads, length, random.Random(data.draw(st.integers(0, 99))))
    assert len(path) == layers and path_length(path) == length
    assert all(step is SKIP or 0 <= step < heads for step in path)


def test_random_paths_are_seeded():
    assert random_paths(6, 4, 3, 20, seed=7) == random_paths(6, 4, 3, 20, seed=7)
    assert random_paths(6, 4, 3, 20, seed=7) != random_paths(6, 4, 3, 20, seed=8)
    with pytest.raises(ValueError):
        random_path(3, 2, 4, random.Random(0))
