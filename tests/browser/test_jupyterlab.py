"""The chapters as a learner meets them: JupyterLab in headless Chromium (marker ``browser``, not in the default run).

``pytest -m browser tests/browser`` starts one JupyterLab and one browser for the chapters and checks each
``chapters/NN_*.ipynb`` with ``scripts/browser_check.py`` (run all cells with JupyterLab's own command; no
traceback, a rendered plot, live widgets, the first widget answers a real input event). A second session
checks the checker: a small good notebook must pass and deliberately broken ones must fail with the
right message. Needs Debian's ``chromium`` and ``chromium-driver`` (see docs/browser_check.md); without
them the tests skip, or fail when ``CI`` is set. Screenshots go to ``$BROWSER_CHECK_OUT``
(default ``out/browser``).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import browser_check as bc  # noqa: E402 - scripts/ is not a package
import lab_browser  # noqa: E402

pytestmark = pytest.mark.browser

OUT = Path(os.environ.get("BROWSER_CHECK_OUT", REPO / "out" / "browser"))
CHAPTER_TIMEOUT = float(os.environ.get("BROWSER_CHECK_CHAPTER_TIMEOUT", "60"))
CHAPTERS = bc.find_notebooks([])


def _need_browser() -> None:
    missing = [
        exe for exe in (lab_browser.CHROMIUM, lab_browser.CHROMEDRIVER) if not Path(exe).exists()
    ]
    if missing:
        message = f"{', '.join(missing)} missing: apt-get install chromium chromium-driver"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


def _failures(result) -> str:
    return f"{result.notebook} in JupyterLab ({result.seconds:.1f} s):\n  " + "\n  ".join(
        result.failures
    )


# --------------------------------------------------------------------------------------------------
# The chapters


@pytest.fixture(scope="module")
def chapter_session():
    _need_browser()
    with lab_browser.browser_session(REPO) as session:
        yield session


@pytest.mark.parametrize(
    "notebook",
    CHAPTERS or [pytest.param(None, marks=pytest.mark.skip(reason="no chapters/NN_*.ipynb yet"))],
    ids=[p.stem for p in CHAPTERS] or ["no-chapters"],
)
def test_chapter_renders_runs_and_answers_in_jupyterlab(chapter_session, notebook):
    lab, driver = chapter_session
    result = bc.check_notebook(driver, lab, notebook, REPO, OUT, CHAPTER_TIMEOUT)
    assert result.ok, _failures(result)
    assert result.screenshot is not None and result.screenshot.stat().st_size > 10_000, (
        f"no screenshot of {notebook.name} in {OUT}"
    )


# --------------------------------------------------------------------------------------------------
# The checker itself: a good notebook passes, broken ones fail for the right reason

PLOT = "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()"
SLIDER = """\
import ipywidgets as widgets
out = widgets.Output()
slider = widgets.IntSlider(value=2, min=1, max=10, description="n")
def draw(change=None):
    with out:
        out.clear_output(wait=True)
        print("n squared =", slider.value ** 2)
slider.observe(draw, names="value")
draw()
widgets.VBox([slider, out])"""

SCRATCH = {
    "good": [PLOT, SLIDER],
    # a widget view whose model the page never received (what a stale saved output looks like)
    "model_not_found": [
        PLOT,
        "from IPython.display import display\n"
        "view = {'model_id': 'deadbeef', 'version_major': 2, 'version_minor': 0}\n"
        "display({'application/vnd.jupyter.widget-view+json': view, "
        "'text/plain': 'IntSlider(value=3)'}, raw=True)",
    ],
    # a widget whose JavaScript module does not exist in the page
    "js_missing": [
        PLOT,
        "import ipywidgets as w\nfrom traitlets import Unicode\n"
        "class Ghost(w.DOMWidget):\n"
        "    _view_name = Unicode('GhostView').tag(sync=True)\n"
        "    _view_module = Unicode('no-such-widget-module').tag(sync=True)\n"
        "    _view_module_version = Unicode('1.0.0').tag(sync=True)\n"
        "Ghost()",
    ],
    # a figure that reaches the page only as its text repr
    "figure_text": [
        "import matplotlib.pyplot as plt\nfrom IPython.display import display\n"
        "get_ipython().display_formatter.formatters['image/png'].enabled = False\n"
        "fig = plt.figure()\nplt.plot([1, 2])\ndisplay(fig)\nplt.close(fig)"
    ],
    # the kernel cannot import something: a traceback, and the cells after it never run
    "error": [PLOT, "import paged_module_that_does_not_exist", "print('never runs')"],
    # a slider nobody listens to: moving it changes no output
    "deaf_slider": [PLOT, "import ipywidgets as w\nw.IntSlider(value=3)"],
    # a kernel that goes silent and idle (the watchdog's stall), checked with a short --kernel-silence
    "silent": [PLOT, "import time\ntime.sleep(120)"],
}
EXPECTED = {
    "model_not_found": "not a live widget",
    "js_missing": "not a live widget",
    "figure_text": "a figure shown as text instead of an image",
    "error": "ModuleNotFoundError: No module named 'paged_module_that_does_not_exist'",
    "deaf_slider": "first widget did not change any output",
}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    _need_browser()
    folder = tmp_path_factory.mktemp("scratch_notebooks")
    kernelspec = {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
    }
    for name, cells in SCRATCH.items():
        nb = nbformat.v4.new_notebook(metadata=kernelspec)
        nb.cells = [nbformat.v4.new_code_cell(source) for source in cells]
        nbformat.write(nb, folder / f"{name}.ipynb")
    with lab_browser.browser_session(folder) as (lab, driver):
        yield folder, lab, driver


def test_checker_passes_a_good_notebook(scratch, tmp_path):
    folder, lab, driver = scratch
    result = bc.check_notebook(
        driver, lab, folder / "good.ipynb", folder, tmp_path, CHAPTER_TIMEOUT
    )
    assert result.ok, _failures(result)
    assert any(note.startswith("first widget answered") for note in result.notes), result.notes


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_checker_fails_a_broken_notebook(scratch, tmp_path, name):
    folder, lab, driver = scratch
    result = bc.check_notebook(
        driver, lab, folder / f"{name}.ipynb", folder, tmp_path, CHAPTER_TIMEOUT
    )
    assert not result.ok, f"the browser check passed the broken notebook {name!r}: {result.notes}"
    assert any(EXPECTED[name] in failure for failure in result.failures), (
        f"{name}: expected a failure containing {EXPECTED[name]!r}, got {result.failures}"
    )
    assert result.screenshot is not None, f"no screenshot for {name}"


def test_checker_reports_a_silent_idle_kernel_as_a_stall_in_its_cell(scratch, tmp_path):
    folder, lab, driver = scratch
    start = time.monotonic()
    result = bc.check_notebook(
        driver, lab, folder / "silent.ipynb", folder, tmp_path, CHAPTER_TIMEOUT, silence=5.0
    )
    assert result.stall == "cell 1", result.failures
    assert any(
        "silent: the kernel stalled in cell 1 (5 s with no kernel message" in f
        for f in result.failures
    )
    assert time.monotonic() - start < 40
