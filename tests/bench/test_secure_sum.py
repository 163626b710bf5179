"""bench/secure_sum.py at a small size: both placements' rounds run, and the table has what the doc reads."""

from __future__ import annotations

from bench.secure_sum import measure


def test_the_bench_measures_both_placements_for_each_cohort() -> None:
    result = measure([3, 6], neighbours=2, repeats=1, dimension=1000)
    assert [row["clients"] for row in result["rows"]] == [3, 6]
    assert [row["neighbours"] for row in result["rows"]] == [2, 2]  # the complete graph at 3, SecAgg+'s at 6
    for row in result["rows"]:
        assert row["central_client_s"] > 0 and row["distributed_server_s"] > 0
        assert row["distributed_upload_bytes"] == 4 * 1024
