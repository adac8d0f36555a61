"""bench/bench_sim.py: its published figures say where they come from and what the model made of them, and the
model's per-sequence step cost is the one the bench's fit gives."""

import importlib.util
import math
import sys
from pathlib import Path

import pytest
from tokenyard.sim.model import PER_SEQUENCE_STEP_S

_BENCH = Path(__file__).resolve().parents[3] / "bench"
sys.path.insert(0, str(_BENCH))  # bench_sim imports its sibling results_io as a top-level module
_spec = importlib.util.spec_from_file_location("bench_sim", _BENCH / "bench_sim.py")
bench_sim = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench_sim
_spec.loader.exec_module(bench_sim)


def _published():
    for row in bench_sim.ROWS:
        for metric, published in bench_sim.published_figures(row):
            if published:
                yield row, metric, published


def test_every_published_figure_has_a_source_a_role_and_excluded_ones_say_why():
    figures = list(_published())
    assert len(figures) >= 10
    for row, metric, published in figures:
        assert published.source and published.value > 0, (row, metric)
        assert published.role in ("fit", "held out", "excluded"), (row, metric, published.role)
        if published.role == "excluded":
            assert "excluded:" in published.note, (row, metric)
    roles = {published.role for _, _, published in figures}
    assert roles == {"fit", "held out", "excluded"}  # the fit is checked on figures it did not see


def test_the_ratio_band_is_the_issues_fifteen_percent():
    assert bench_sim.within(0.87) and bench_sim.within(1.15) and bench_sim.within(1.0)
    assert not bench_sim.within(0.869) and not bench_sim.within(1.151)


def test_the_models_per_sequence_cost_is_the_fits_minimum(monkeypatch):
    # the short closed loops of BENCH_QUICK keep this a unit test; the full fit (`bench_sim.py --fit`) agrees
    monkeypatch.setattr(bench_sim, "QUICK", True)
    step = 10e-6
    at, below, above = (bench_sim.fit_error(PER_SEQUENCE_STEP_S + d) for d in (0.0, -step, step))
    assert at < below and at < above, (below, at, above)


def test_fitting_to_a_figure_moves_the_cost_towards_it(monkeypatch):
    """A figure marked fit pulls the error: a slower published decode rate favours a larger per-sequence cost."""
    monkeypatch.setattr(bench_sim, "QUICK", True)
    row = bench_sim.ROWS[0]
    sim = bench_sim.loop_figures(bench_sim.deployment(row, 0.0), row)["decode_tok_s_c4"]
    slower = bench_sim.Published(sim / 1.2, "test", role="fit")
    monkeypatch.setattr(
        bench_sim, "ROWS", [bench_sim.Row(row.model, row.gpu, row.tp, 48, 128, ((4, slower),))]
    )
    errors = [bench_sim.fit_error(x) for x in (0.0, 100e-6)]
    assert errors[0] > errors[1]
    assert errors[0] == pytest.approx(math.log(1.2) ** 2, rel=1e-6)


def test_a_published_figure_with_an_unknown_role_is_refused_by_name():
    with pytest.raises(ValueError, match="role 'fitted' is none of fit, held out, excluded"):
        bench_sim.Published(1.0, "test", "a note", role="fitted")
