from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.router.framework import NEUTRAL_SCORE, normalise


def test_normalise_min_max_all_equal_and_unknown():
    assert normalise([1, 3, 2], higher_is_better=True) == [0.0, 1.0, 0.5]
    assert normalise([1, 3, 2], higher_is_better=False) == [1.0, 0.0, 0.5]
    assert normalise([4, 4], True) == [1.0, 1.0]
    assert normalise([None, None], True) == [1.0, 1.0]
    assert normalise([None, 0.2, 0.8], False) == [NEUTRAL_SCORE, 1.0, 0.0]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.none(), st.floats(-1e6, 1e6)), min_size=1, max_size=12), st.booleans())
def test_normalised_scores_are_in_unit_interval_and_the_best_known_gets_one(values, higher):
    scores = normalise(values, higher)
    assert all(0.0 <= s <= 1.0 for s in scores)
    known = [(v, s) for v, s in zip(values, scores, strict=True) if v is not None]
    if known:
        best = max(known, key=lambda vs: vs[0] if higher else -vs[0])
        assert best[1] == 1.0
