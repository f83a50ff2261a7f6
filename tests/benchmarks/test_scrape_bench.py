"""benchmarks/scrape_bench.py keeps working: a short run against a real Prometheus prints consistent JSON
(the figures themselves are measured by running it, never asserted here)."""

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "scrape_bench.py"


def test_quick_run_scrapes_every_target_with_both_and_reports_cpu_per_scrape():
    done = subprocess.run([sys.executable, str(BENCH), "--quick", "--targets", "2", "--seconds", "2"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["scrape_targets"] == 2 and result["body_lines"] == 626
    for scraper in ("prometheus", "collector"):
        run = result[scraper]
        assert run["targets_up"] == 2, scraper
        assert run["scrapes"] >= 2 and run["scrapes_own_count"] > 0, scraper  # both scraped every second
        assert run["ms_cpu_per_scrape"] == round(1000 * run["cpu_s"] / run["scrapes"], 3)
    if result["prometheus"]["cpu_s"] > 0:  # (under one clock tick in so short a run, it has no ratio)
        assert result["ratio"] == round(result["collector"]["ms_cpu_per_scrape"] /
                                        result["prometheus"]["ms_cpu_per_scrape"], 2)
    else:
        assert result["ratio"] is None and result["targets"]["cpu_per_scrape_at_most_2x_prometheus"] is False
    phases = result["in_process"]
    assert all(phases[k] > 0 for k in ("convert_us", "ingest_us", "first_convert_us", "scrape_once_us"))
    assert set(result["targets"]) == {"every_target_up", "cpu_per_scrape_at_most_2x_prometheus"}
    assert result["targets"]["every_target_up"] is True
    assert all(isinstance(v, bool) for v in result["targets"].values())
