"""The FTRL section's pure helpers (bench/ftrl.py): the arms' overrides, the ratios and the buffer check."""

from __future__ import annotations

import pytest

from bench.ftrl import buffer_resolution, ftrl_overrides, ftrl_rows, ratios_to


def test_an_arm_runs_the_cpu_scale_at_epsilon_4_with_evaluation_only_after_the_last_round() -> None:
    ov = ftrl_overrides("dp_ftrl_fedsam", 6, ["dataset.data_dir=/d", "eval_every=1"])
    assert ov[:3] == ["+scale=cpu", "privacy.target_epsilon=4", "strategy=dp_ftrl_fedsam"]
    assert "num_rounds=6" in ov and "dataset.data_dir=/d" in ov
    # A passthrough key replaces the section's own (Hydra rejects a key given twice); the later one wins.
    assert [o for o in ov if o.startswith("eval_every=")] == ["eval_every=1"]
    assert "eval_every=6" in ftrl_overrides("dp_fedavg", 6)


def test_ratios_are_to_dp_fedavg_and_missing_when_either_side_failed() -> None:
    r = ratios_to({"dp_fedavg": 2.0, "dp_ftrl_fedavg": 3.0, "dp_ftrl_fedsam": None})
    assert r == {"dp_fedavg": 1.0, "dp_ftrl_fedavg": 1.5, "dp_ftrl_fedsam": None}
    assert ratios_to({"dp_fedavg": None, "dp_ftrl_fedavg": 3.0})["dp_ftrl_fedavg"] is None


@pytest.mark.parametrize(
    ("ftrl", "ident", "plain", "resolved"),
    [(840.0, 800.0, 805.0, True), (805.0, 800.0, 802.0, False), (840.0, 800.0, 850.0, False), (None, 800.0, 1, None)],
)
def test_the_buffers_are_resolved_only_when_the_delta_matches_and_runs_without_them_agree(
    ftrl: float | None, ident: float, plain: float, resolved: bool | None
) -> None:
    b = buffer_resolution({"dp_ftrl_fedavg": ftrl, "dp_fedavg_unamplified": ident, "dp_fedavg": plain}, 38.0)
    assert b["resolved"] is resolved
    if ftrl is not None:
        assert b["delta_mib"] == pytest.approx(ftrl - ident)
        assert b["spread_without_buffers_mib"] == pytest.approx(abs(plain - ident))


def test_the_rows_show_every_arm_and_a_failed_one() -> None:
    run = {"round_s": 2.0, "ratio_to_dp_fedavg": 1.0, "peak_rss_mib": 3000.0,
           "peak_rss_by_kind_mib": {"driver": 900.0, "workers": 1500.0}, "driver_peak_rss_mib": 950.0}  # fmt: skip
    ftrl = {"overrides": ftrl_overrides("<arm>", 6), "rounds_measured": "3..5",
            "arms": {"dp_fedavg": run, "dp_ftrl_fedavg": None},
            "buffers": {**buffer_resolution({}, 38.0), "params": 1_663_370}}  # fmt: skip
    text = "\n".join(ftrl_rows(ftrl))
    assert "| FTRL dp_fedavg:" in text and "**1.000**" in text and "workers 1500, driver 900" in text
    assert "| FTRL dp_ftrl_fedavg | failed |" in text
    assert "1,663,370 float64 = 38.0 MiB" in text and "| resolved | n/a |" in text
