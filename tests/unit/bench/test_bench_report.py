"""bench/report.py and bench/results_io.py: results files in, RESULTS.md and PNG plots out.

Each test writes small hand-made results shaped like the benchmark's real final JSON object (the keys its
main() prints) into a temporary directory and reads back the markdown rows and the plots."""

import importlib.util
import json
import os
import sys
from pathlib import Path

import matplotlib.image
import pytest

_BENCH = Path(__file__).resolve().parents[3] / "bench"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, _BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


results_io = _load("results_io")
report = _load("report")

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
RUN = {
    "date": "2026-12-03T20:00:00Z",
    "commit": "0123456789abcdef0123456789abcdef01234567",
    "uncommitted_changes": False,
    "environment": {"BENCH_QUICK": "1"},
}


def write(folder: Path, name: str, payload: dict) -> None:
    (folder / f"{name}.json").write_text(json.dumps({**payload, "run": RUN}))


def table_rows(markdown: str, first_cell: str) -> list[list[str]]:
    """The cells of every markdown table row whose first cell is ``first_cell``."""
    rows = []
    for line in markdown.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_cell:
            rows.append(cells)
    return rows


def first_cells(markdown: str, heading: str) -> list[str]:
    """The first cell of each body row of the first table after ``heading``."""
    lines = markdown.split(heading, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    table = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        table.append(line.strip("|").split("|")[0].strip())
    return table[2:]  # below the header and its rule


def assert_png(path: Path) -> None:
    assert path.is_file(), f"{path.name} was not written"
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 2000, f"{path.name}: not a PNG with a drawing"
    height, width, _ = matplotlib.image.imread(path).shape  # decodes the whole image
    assert width > 300 and height > 200


def cdf(scale: float) -> dict:
    percents = [*range(1, 100), 99.9]
    return {"ttft_cdf_percent": percents, "ttft_cdf_s": [scale * (1 + p / 50) for p in percents]}


def router_payload() -> dict:
    def policy(p50, p99, tok_s, scale):
        return {"ttft_p50_s": p50, "ttft_p99_s": p99, "output_tok_s": tok_s, "prefix_hit_rate": 0.5,
                "errors": 0, **cdf(scale)}  # fmt: skip

    shared = {
        # tokenyard deliberately not first: the table must still put it first
        "sglang:defaults": policy(0.2, 0.8, 1500.0, 0.2),
        "tokenyard": policy(0.1, 0.4, 1800.0, 0.1),
        "sglang:threshold_0.6": policy(0.15, 0.5, 1600.0, 0.15),
        "round_robin": policy(0.4, 1.6, 900.0, 0.4),
    }
    older = {name: {k: v for k, v in f.items() if not k.startswith("ttft_cdf")} for name, f in shared.items()}
    return {
        "bench": "router",
        "tuned_peers": ["sglang:threshold_0.6"],
        "tokenyard_variants": [],
        "results": {
            "shared_prefix_70": shared,
            "no_cdf_workload": older,
            "overhead": {
                "sglang:defaults": {"added_p50_ms": 1.0, "added_p99_ms": 2.0, "max_rps": 480.0},
                "tokenyard": {"added_p50_ms": 2.0, "added_p99_ms": 1.0, "max_rps": 470.0},
            },
        },
    }


def test_router_rows_put_tokenyard_first_label_the_tuned_peer_and_draw_a_cdf_per_workload(tmp_path):
    write(tmp_path, "router", router_payload())
    report_path, problems = report.write_report(tmp_path)
    markdown = report_path.read_text()

    assert problems == []
    assert first_cells(markdown, "### shared_prefix_70") == [
        "tokenyard",
        "sglang:defaults",
        "sglang:threshold_0.6",
        "round_robin",
    ]
    tuned = table_rows(markdown, "sglang:threshold_0.6")[0]
    assert tuned[1] == "peer, tuned"
    defaults = table_rows(markdown, "sglang:defaults")[0]
    assert defaults[1] == "peer, defaults"
    # tokenyard's p99 0.4 over 0.8, its 1800 tok/s over 1500
    assert defaults[4] == "0.50" and defaults[6] == "1.20"
    assert table_rows(markdown, "tokenyard")[0][1] == "shipped"
    overhead = markdown.split("### router overhead")[1]
    assert "| sglang:defaults | 1.000 | 2.000 | 0.50 | 480.0 |" in overhead
    assert "Commit `0123456789abcdef0123456789abcdef01234567`".lower() in markdown.lower()
    assert "`BENCH_QUICK=1`" in markdown

    assert_png(tmp_path / "router_ttft_cdf_shared_prefix_70.png")
    assert "![router_ttft_cdf_shared_prefix_70](router_ttft_cdf_shared_prefix_70.png)" in markdown
    # a result without quantiles gets no plot, and the page says why
    assert not (tmp_path / "router_ttft_cdf_no_cdf_workload.png").exists()
    assert "No TTFT CDF for no_cdf_workload" in markdown


def test_autoscaler_rows_carry_their_kind_the_paired_ratios_and_a_plot_with_the_floor(tmp_path):
    def row(kind, slo, hours, ratio=None):
        entry = {"row": kind, "setting": f"{kind} knob", "slo_attainment": slo, "slo_attainment_se": 0.001,
                 "gpu_hours": hours, "gpu_hours_se": 0.5, "scale_actions": 40.0}  # fmt: skip
        if ratio is not None:
            entry.update(
                tokenyard_gpu_hours_ratio=ratio, tokenyard_gpu_hours_ratio_se=0.003, tokenyard_slo_gap=0.002
            )
        return entry

    write(
        tmp_path,
        "autoscaler",
        {
            "bench": "autoscaler",
            "evaluation_seeds": [29, 35],
            "ttft_slo_s": 1.5,
            "slo_floor": 0.99,
            "results": {
                "tokenyard": row("tuned", 0.995, 110.0),
                "tokenyard_oracle": row("oracle", 0.992, 100.0, 1.1),
                "knative_concurrency": row("tuned", 0.993, 120.0, 0.917),
                "knative_defaults": row("documented", 0.80, 60.0, 1.833),
            },
        },
    )
    markdown = report.write_report(tmp_path)[0].read_text()

    assert first_cells(markdown, "## autoscaler") == [
        "tokenyard",
        "tokenyard_oracle",
        "knative_concurrency",
        "knative_defaults",
    ]
    oracle = table_rows(markdown, "tokenyard_oracle")[0]
    assert oracle[1] == "oracle"
    knative = table_rows(markdown, "knative_concurrency")[0]
    assert knative[3] == "99.30% ± 0.10%" and knative[4] == "120.0 ± 0.5"
    assert knative[5] == "0.917 ± 0.003" and knative[6] == "0.20%"
    assert table_rows(markdown, "knative_defaults")[0][1] == "documented"
    assert "floor 99% of requests" in markdown
    assert_png(tmp_path / "autoscaler_slo_vs_gpu_hours.png")


def rollout_figures(false_rollbacks: float, at_2x: int | None, caught_2x: float) -> dict:
    return {
        "false_rollback_rate": false_rollbacks,
        "false_rollback_rate_se": 0.002,
        "false_rollback_rate_baseline_shifted": false_rollbacks,
        "false_rollback_rate_baseline_shifted_se": 0.002,
        "detect_requests_1_25x": None,
        "detect_rate_1_25x": 0.3,
        "detect_requests_2x": at_2x,
        "detect_rate_2x": caught_2x,
    }


def test_rollout_rules_are_flattened_with_never_for_an_uncaught_regression_and_plotted(tmp_path):
    tokenyard = rollout_figures(0.045, 960, 1.0)
    tokenyard["by_alpha"] = {
        "0.01": rollout_figures(0.011, 1440, 1.0),
        "0.05": rollout_figures(0.045, 960, 1.0),
    }
    write(
        tmp_path,
        "rollout",
        {
            "bench": "rollout",
            "results": {
                "alpha": 0.05,
                "argo_failure_limit": {
                    "documented_example": rollout_figures(0.0, None, 0.0),
                    "tuned_at_same_false_rollback_rate": rollout_figures(0.04, 1920, 1.0),
                    "oracle_for_2x_known_baseline": rollout_figures(0.05, 480, 1.0),
                },
                "tokenyard": tokenyard,
                "sprt_known_baseline": rollout_figures(0.03, 600, 1.0),
            },
        },
    )
    markdown = report.write_report(tmp_path)[0].read_text()

    header = next(line for line in markdown.splitlines() if line.startswith("| rule |"))
    assert "false rollbacks baseline shifted" in header and "requests at 1.25x" in header
    assert first_cells(markdown, "## rollout")[0] == "tokenyard"
    documented = table_rows(markdown, "argo_failure_limit documented_example")[0]
    assert documented[1] == "peer, documented"
    assert documented[-2] == "never (0%)" and documented[-1] == "-"
    tuned = table_rows(markdown, "argo_failure_limit tuned_at_same_false_rollback_rate")[0]
    assert tuned[1] == "peer, tuned" and tuned[-2] == "1,920 (100%)" and tuned[-1] == "0.50"
    assert table_rows(markdown, "argo_failure_limit oracle_for_2x_known_baseline")[0][1] == "oracle"
    assert table_rows(markdown, "sprt_known_baseline")[0][1] == "reference"
    assert_png(tmp_path / "rollout_false_rollback_vs_detection.png")


def test_placement_ratios_other_loads_and_a_line_per_strategy(tmp_path):
    def figures(accepted, stranded):
        return {"accepted": accepted, "accepted_gpus": accepted * 4, "stranded_gpus_mean": stranded,
                "stranded_floor_gpus_mean": 1.8, "place_ms_p99": 2.0}  # fmt: skip

    payload = {
        "bench": "placement",
        "load": 0.95,
        "results": {
            "first_fit": figures(11950, 50.0),
            "tokenyard": figures(11965, 30.0),
            "lower_bound": figures(11973, 1.8),
        },
        "by_load": {
            "1": {
                "tokenyard": {"accepted": 11899, "stranded_gpus_mean": 31.0},
                "first_fit": {"accepted": 11891},
            },
        },
    }
    write(tmp_path, "placement", payload)
    markdown = report.write_report(tmp_path)[0].read_text()

    first_fit = table_rows(markdown, "first_fit")[0]
    assert first_fit[1] == "peer" and first_fit[6] == "0.60"  # 30 stranded over 50
    assert table_rows(markdown, "lower_bound")[0][1].startswith("oracle")
    assert "| 1 | 11,899 / 31.00 | 11,891 / - |" in markdown
    assert report.stranded_by_load(payload)["tokenyard"] == [(0.95, 30.0), (1.0, 31.0)]
    assert report.stranded_by_load(payload)["first_fit"] == [(0.95, 50.0)]
    assert_png(tmp_path / "placement_stranded_vs_load.png")


def test_sim_and_operator_cluster_tables(tmp_path):
    write(
        tmp_path,
        "sim",
        {
            "bench": "sim",
            "results": {
                "llama/h100/tp1": {
                    "workload": "48 in / 128 out",
                    "num_gpu_blocks": 1000,
                    "decode_tok_s_c1": 150.0,
                    "decode_tok_s_c1_published": 120.0,
                    "decode_tok_s_c1_role": "excluded",
                    "prefill_tok_s": 9000.0,
                    "prefill_tok_s_published": None,
                },
                "within_15_percent": {"all": {"within": 3, "of": 4}},
                "capacity": {"streamed_tok_s_per_core": 9000.0, "load_average": 1.5},
            },
        },
    )
    write(
        tmp_path,
        "operator_cluster",
        {
            "bench": "operator_cluster",
            "results": {"tokenyard": {}, "deployment_baseline": {}},
            "comparison": [
                {"measure": "apply -> ready", "tokenyard_s": 6.0, "deployment_s": 4.0},
                {"measure": "gang recreated", "tokenyard_s": 9.0, "deployment_s": None},
            ],
        },
    )
    markdown = report.write_report(tmp_path)[0].read_text()

    assert table_rows(markdown, "llama/h100/tp1") == [
        ["llama/h100/tp1", "decode_tok_s_c1", "150.0", "120.0", "1.25", "excluded"],
        ["llama/h100/tp1", "prefill_tok_s", "9,000.0", "-", "-", "-"],
    ]
    assert "| all | 3 of 4 |" in markdown
    assert table_rows(markdown, "apply -> ready")[0] == ["apply -> ready", "6.00", "4.00", "1.50"]
    assert table_rows(markdown, "gang recreated")[0] == ["gang recreated", "9.00", "-", "-"]
    assert "9,000 streamed tokens/s" in markdown


def test_missing_benches_are_listed_as_not_run_and_no_plot_is_drawn(tmp_path):
    (tmp_path / "placement_stranded_vs_load.png").write_bytes(PNG_SIGNATURE)  # from an earlier report
    (tmp_path / "keep.png").write_bytes(PNG_SIGNATURE)  # not the report's
    assert report.main(["--results-dir", str(tmp_path)]) == 0
    markdown = (tmp_path / report.REPORT_NAME).read_text()
    for bench, target in report.BENCHES.items():
        assert table_rows(markdown, bench)[0][1] == "not run"
        assert f"`make {target}` writes it" in markdown
    assert [path.name for path in tmp_path.glob("*.png")] == ["keep.png"]


def test_an_unreadable_result_is_named_and_the_others_are_still_reported(tmp_path, capsys):
    (tmp_path / "rollout.json").write_text('{"bench": "rollout", "results": ')
    (tmp_path / "autoscaler.json").write_text(json.dumps({"bench": "router", "results": {}}))
    write(
        tmp_path, "placement", {"bench": "placement", "load": 0.95, "results": {"tokenyard": {"accepted": 1}}}
    )

    assert report.main(["--results-dir", str(tmp_path)]) == 1
    markdown = (tmp_path / report.REPORT_NAME).read_text()
    assert table_rows(markdown, "rollout")[0][1] == "unreadable"
    assert "rollout.json: not readable as JSON" in markdown
    assert "holds the results of bench 'router', not 'autoscaler'" in markdown
    assert table_rows(markdown, "placement")[0][1] == "ok"
    assert "rollout.json: not readable as JSON" in capsys.readouterr().err


def test_a_results_dir_that_is_not_a_directory_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        report.main(["--results-dir", str(tmp_path / "absent")])
    assert exit_info.value.code == 2
    assert "absent: not a directory" in capsys.readouterr().err


def test_write_results_goes_to_bench_results_dir_with_the_run_record(tmp_path, monkeypatch):
    for key in [key for key in os.environ if key.startswith("BENCH_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("BENCH_RESULTS_DIR", str(tmp_path / "quick"))
    monkeypatch.setenv("BENCH_SEEDS", "2")
    path = results_io.write_results("placement", {"bench": "placement", "results": {"tokenyard": {}}})

    assert path == tmp_path / "quick" / "placement.json"
    written = json.loads(path.read_text())
    assert written["bench"] == "placement" and written["results"] == {"tokenyard": {}}
    assert written["run"]["environment"] == {"BENCH_SEEDS": "2"}  # where the results went is not a setting
    # this checkout's HEAD (None outside git)
    assert written["run"]["commit"] == results_io._git("rev-parse", "HEAD")
    assert written["run"]["date"].endswith("Z")
    with pytest.raises(ValueError, match="already has a 'run' key"):
        results_io.write_results("placement", {"bench": "placement", "results": {}, "run": {}})


def test_results_dir_defaults_to_bench_results():
    assert results_io.results_dir({}) == _BENCH / "results"
    assert results_io.results_dir({"BENCH_RESULTS_DIR": "/tmp/x"}) == Path("/tmp/x")


def test_router_kinds_tell_the_hop_free_balancers_from_round_robin_through_a_proxy():
    payload = {"tuned_peers": ["sglang:threshold_0.6"], "tokenyard_variants": ["ty_asyncio"]}
    assert report.router_kind("round_robin", payload) == "peer, ideal (no proxy hop)"
    assert report.router_kind("sglang:round_robin", payload) == "peer, round robin through its proxy"
    assert report.router_kind("sglang:threshold_0.6", payload) == "peer, tuned"
    assert report.router_kind("ty_asyncio", payload) == "tokenyard variant (extra)"


def test_parts_measured_by_other_runs_are_kept_with_their_own_run_record():
    """bench-router writes each workload as it finishes: a file brought up to date part by part names, for each
    workload, the run that measured it, and figures of two runs are never mixed within one workload."""
    older_run = {**RUN, "date": "2026-12-03T23:00:00Z", "commit": "aaaa"}
    previous = {
        "bench": "router",
        "results": {"no_sharing": {"tokenyard": {"ttft_p99_s": 0.3}}, "overhead": {"tokenyard": {}}},
        "run": older_run,
    }
    now = {**RUN, "commit": "bbbb"}
    payload = {"bench": "router", "results": {"no_sharing": {"tokenyard": {"ttft_p99_s": 0.2}}}}
    merged = results_io.merge_parts(previous, payload, {"no_sharing": now})
    assert merged["results"]["no_sharing"] == {"tokenyard": {"ttft_p99_s": 0.2}}  # measured now: replaced
    assert merged["results"]["overhead"] == {"tokenyard": {}}  # not measured now: kept
    assert merged["part_runs"] == {"no_sharing": now, "overhead": older_run}
    # written part by part again later, the kept part keeps the record of the run that measured it
    again = results_io.merge_parts(merged, {"bench": "router", "results": {}}, {})
    assert again["part_runs"]["overhead"] == older_run and again["part_runs"]["no_sharing"] == now
    # no earlier file: only what was measured
    assert results_io.merge_parts(None, payload, {"no_sharing": now})["part_runs"] == {"no_sharing": now}


def test_a_router_file_written_part_by_part_names_the_run_of_each_workload(tmp_path):
    payload = router_payload()
    payload["part_runs"] = {
        "shared_prefix_70": {**RUN, "commit": "cafe0123456789", "date": "2026-12-07T21:00:00Z"}
    }
    write(tmp_path, "router", payload)
    markdown = report.write_report(tmp_path)[0].read_text()
    section = markdown.split("### shared_prefix_70")[1].split("###")[0]
    assert "Measured 2026-12-07T21:00:00Z at cafe01234567." in section
    assert "Measured" not in markdown.split("### router overhead")[1]  # no record for it: the run line holds
