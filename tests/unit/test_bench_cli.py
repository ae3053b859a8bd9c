"""``python -m paged bench`` with no name lists the benchmarks and runs nothing; a bad name is an argparse error."""

from __future__ import annotations

import pytest

from paged_course import bench


def test_no_name_lists_every_benchmark_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert bench.main([]) == 0
    out = capsys.readouterr().out
    listed = [line.split()[0] for line in out.splitlines()[1:]]
    assert listed == bench.BENCHMARKS + ["all"], out
    assert set(bench.ABOUT) == set(bench.BENCHMARKS), "every benchmark has its line"
    assert list(tmp_path.iterdir()) == [], "listing writes no bench-results folder"


def test_unknown_name_is_an_error(capsys):
    with pytest.raises(SystemExit) as err:
        bench.main(["nope"])
    assert err.value.code == 2 and "invalid choice: 'nope'" in capsys.readouterr().err
