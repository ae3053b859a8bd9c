"""The Gradescope bundle (grading/autograder.py) and the GitHub Classroom config (grading/classroom.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from paged_course.grading import classroom, collect
from paged_course.grading.autograder import build_bundle, find_submission_files
from paged_course.publish.release import ROOT
from paged_course.publish.sync import exercise_ids
from tests.unit.test_release import write_hidden_tests


def _chapter_files() -> dict[str, list[str]]:
    """``{"ch01": ["ex01_contiguous.py", "ex01_fragmentation.py", ...], ...}``: the solution files of each
    chapter, read from their markers (a chapter may have several)."""
    table: dict[str, list[str]] = {}
    for path in sorted((ROOT / "solutions").glob("ex*.py")):
        for chapter in sorted({ex_id.split(".")[0] for ex_id in exercise_ids(path.read_text())}):
            table.setdefault(chapter, []).append(path.name)
    return table


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """The bundle unpacked the way Gradescope does it: ``<root>/source/{setup.sh,run_autograder,course/}``."""
    tmp = tmp_path_factory.mktemp("gradescope")
    write_hidden_tests(tmp / "private")
    zip_path = build_bundle(tmp / "autograder.zip", hidden_tests=tmp / "private", timeout=30)
    source = tmp / "autograder" / "source"
    with zipfile.ZipFile(zip_path) as zf:
        zf.extractall(source)
        modes = {i.filename: i.external_attr >> 16 for i in zf.infolist()}
    for (
        name,
        mode,
    ) in modes.items():  # extractall drops the mode bits; put them back like unzip does
        if mode:
            os.chmod(source / name, mode & 0o777)
    return tmp / "autograder", modes


def _run(root: Path, submission: Path, chapters: str = "") -> dict:
    env = dict(
        os.environ,
        AUTOGRADER_ROOT=str(root),
        PAGED_PYTHON=sys.executable,
        PAGED_SUBMISSION=str(submission),
        PAGED_RESULTS=str(submission.parent / (submission.name + "-results")),
        PAGED_CHAPTERS=chapters,
    )
    proc = subprocess.run(
        [str(root / "source" / "run_autograder")],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    results = submission.parent / (submission.name + "-results") / "results.json"
    assert results.exists(), (
        f"run_autograder wrote no results.json:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    )
    return json.loads(results.read_text())


def test_bundle_layout(bundle):
    root, modes = bundle
    source = root / "source"
    assert (
        stat.S_IMODE(modes["run_autograder"]) == 0o755 and stat.S_IMODE(modes["setup.sh"]) == 0o755
    )
    setup = (source / "setup.sh").read_text()
    assert "torch==2.13.0" in setup and setup.index("torch==2.13.0") < setup.index(
        "source/course[dev]"
    ), "setup.sh installs the pinned torch first, then the course"
    course = source / "course"
    assert not (course / "solutions").exists(), "the bundle must not carry the solutions"
    assert sorted(p.name for p in (course / "exercises").glob("ex*.py")) == sorted(
        p.name for p in (ROOT / "solutions").glob("ex*.py")
    ), "every exercise stub is in the bundle"


def test_find_submission_files_accepts_repo_and_bare_layouts(tmp_path):
    names = {"ex01_fragmentation.py", "ex02_allocator.py"}
    repo = tmp_path / "repo"
    for rel in (
        "exercises/ex01_fragmentation.py",
        "ex01_fragmentation.py",
        "solutions/ex02_allocator.py",
        "notes/ex02_allocator.py",
        "exercises/ex09_unknown.py",
        "__MACOSX/exercises/ex02_allocator.py",
    ):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(rel)
    assert {
        k: v.relative_to(repo).as_posix() for k, v in find_submission_files(repo, names).items()
    } == {
        "ex01_fragmentation.py": "exercises/ex01_fragmentation.py",
        "ex02_allocator.py": "notes/ex02_allocator.py",
    }
    bare = tmp_path / "bare"
    (bare / "upload").mkdir(parents=True)
    (bare / "upload" / "ex02_allocator.py").write_text("x")
    assert list(find_submission_files(bare, names)) == ["ex02_allocator.py"]
    assert find_submission_files(tmp_path / "nothing", names) == {}


@pytest.mark.slow
def test_run_autograder_full_and_zero_on_two_chapters(bundle, tmp_path):
    """One run: chapter A's solution files as bare files (full marks), chapter B not submitted (zero)."""
    root, _ = bundle
    files = _chapter_files()
    assert len(files) >= 1, "no solutions with exercise markers"
    (full_ch, full_files), *rest = files.items()
    submission = tmp_path / "submission"
    submission.mkdir()
    for name in full_files:
        shutil.copyfile(ROOT / "solutions" / name, submission / name)
    chapters = [full_ch] + [c for c, _ in rest[:1]]
    data = _run(root, submission, ",".join(chapters))
    per_chapter: dict[str, list[int]] = {}
    for test in data["tests"]:
        row = per_chapter.setdefault(test["name"].split(".")[0], [0, 0])
        row[0] += test["score"]
        row[1] += test["max_score"]
    assert sorted(per_chapter) == sorted(chapters), (
        f"graded chapters {sorted(per_chapter)}, asked {chapters}"
    )
    earned, possible = per_chapter[full_ch]
    assert earned == possible > 0, (
        f"{full_ch} solution submitted as a bare file must score full: {data['output']}"
    )
    for ch in chapters[1:]:
        assert per_chapter[ch][0] == 0 < per_chapter[ch][1], f"{ch} not submitted must score 0"
    assert data["score"] == possible and f"graded: {', '.join(full_files)}" in data["output"]
    hidden = [t for t in data["tests"] if "no_region_left_unfilled" in t["name"]]
    assert [(t["score"], t.get("visibility")) for t in hidden] == [(1, "after_published")], (
        "the bundle's hidden test runs, counts, and stays hidden until grades are published"
    )


@pytest.mark.slow
def test_run_autograder_scores_complete_and_empty_submissions(bundle, tmp_path):
    root, _ = bundle
    complete = tmp_path / "complete"
    (complete / "exercises").mkdir(parents=True)
    for path in (ROOT / "solutions").glob("ex*.py"):
        shutil.copyfile(path, complete / "exercises" / path.name)
    full = _run(root, complete)
    assert full["tests"] and full["score"] == full["max_score"] > 0, full["output"]
    empty = tmp_path / "empty"
    empty.mkdir()
    zero = _run(root, empty)
    assert zero["score"] == 0 and zero["max_score"] == full["max_score"], zero["output"]
    assert all(t["status"] == "failed" for t in zero["tests"]), (
        "every graded test fails on the stubs"
    )


# ----------------------------------------------------------------------------- GitHub Classroom


def test_committed_classroom_config_is_current():
    stale = classroom.write(ROOT, check=True)
    assert stale == [], (
        "run `python -m paged_course.grading.classroom`: .github/classroom/autograding.json is stale"
    )


def test_classroom_config_sums_points_per_chapter():
    tests = [
        {"nodeid": "a::t[1]", "id": "ch02.ex1", "points": 2},
        {"nodeid": "a::t[2]", "id": "ch02.ex1", "points": 2},
        {"nodeid": "b::u", "id": "ch01.ex2", "points": 3},
        {"nodeid": "a::v", "id": "ch02.ex3", "points": 5},
    ]
    chapters = classroom.chapter_points(tests)
    assert chapters == {
        "ch01": {"points": 3, "tests": 1, "exercises": ["ch01.ex2"]},
        "ch02": {"points": 9, "tests": 3, "exercises": ["ch02.ex1", "ch02.ex3"]},
    }
    config = classroom.autograding_config(chapters)
    assert [(t["run"], t["points"]) for t in config["tests"]] == [
        ("python -m paged grade ch01 --strict", 3),
        ("python -m paged grade ch02 --strict", 9),
    ]
    assert (
        config["tests"][0]["setup"].startswith("python -m pip install")
        and config["tests"][1]["setup"] == ""
    )
    hidden = classroom.autograding_config(chapters, hidden=True)
    assert hidden["tests"][0]["run"] == "env PAGED_HIDDEN=1 python -m paged grade ch01 --strict"
    yaml = classroom.workflow_yaml(config)
    assert re.findall(r"max-score: (\d+)", yaml) == ["3", "9"] and "runners: ch01,ch02" in yaml
    assert 'CH02_RESULTS: "${{steps.ch02.outputs.result}}"' in yaml


@pytest.mark.slow
def test_static_points_agree_with_pytest_collection():
    static = collect.static_tests(ROOT)
    if static is None:
        pytest.skip(
            "a graded test file needs pytest to be counted; collect() already uses collection"
        )
    assert classroom.chapter_points(static) == classroom.chapter_points(
        collect.collected_tests(ROOT)
    ), "the static marker reader and pytest's collection disagree on a chapter's points"


def test_static_reader_counts_parametrize_cases(tmp_path):
    folder = tmp_path / "tests" / "exercises"
    folder.mkdir(parents=True)
    (folder / "test_ex05_demo.py").write_text(
        "import pytest\nSIZES = (4, 16, 32)\n\n"
        "@pytest.mark.exercise('ch05.ex1', points=2)\n@pytest.mark.parametrize('b', SIZES)\n"
        "@pytest.mark.parametrize('g', [1, pytest.param(2, id='two')])\ndef test_a(impl, b, g):\n    pass\n\n"
        "@pytest.mark.exercise(id='ch05.ex2', points=5)\ndef test_b(impl):\n    pass\n\n"
        "def test_helper():\n    pass\n"
    )
    assert classroom.chapter_points(collect.static_tests(tmp_path)) == {
        "ch05": {"points": 3 * 2 * 2 + 5, "tests": 7, "exercises": ["ch05.ex1", "ch05.ex2"]}
    }
    (folder / "test_ex06_dyn.py").write_text(
        "import pytest\n\n@pytest.mark.exercise('ch06.ex1', points=1)\n"
        "@pytest.mark.parametrize('n', list(range(3)))\ndef test_c(impl, n):\n    pass\n"
    )
    assert collect.static_tests(tmp_path) is None, (
        "computed argvalues: the static reader must defer to pytest"
    )
