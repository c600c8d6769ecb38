"""The run live in a notebook cell, on a real Jupyter kernel driven by nbclient: the cell with
`for batch in watch(loader)` shows a view that changes while its loop runs (display updates
by id, as JupyterLab and VS Code apply them), the run is named after the notebook
(JPY_SESSION_NAME; VS Code's `__vsc_ipynb_file__`), `monitor.show(run)` draws a run in a
later cell, and no feed process outlives its cell."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from monitor.store import Store

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SETUP = """\
import time, torch
from torch.utils.data import DataLoader, Dataset
from monitor import watch

class Slow(Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        time.sleep(0.004)  # sleep-ok: the sample's loading
        return torch.zeros(4)

loader = DataLoader(Slow(), batch_size=8)
"""
TRAIN = """\
for epoch in range(14):
    for batch in watch(loader):
        time.sleep(0.02)  # sleep-ok: the step
"""


def run_notebook(tmp_path: Path, cells: list[str], monkeypatch) -> tuple[object, list]:
    import nbformat
    from nbclient import NotebookClient

    updates: list[tuple[float, int, str]] = []

    class Recording(NotebookClient):
        def _update_display_id(self, display_id, msg):
            html = msg["content"]["data"].get("text/html", "")
            updates.append((time.monotonic(), self._cell_now, html))
            return super()._update_display_id(display_id, msg)

        async def async_execute_cell(self, cell, cell_index, *a, **k):
            self._cell_now = cell_index
            return await super().async_execute_cell(cell, cell_index, *a, **k)

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("STARVATION_MONITOR_DB", str(tmp_path / "nb.db"))
    monkeypatch.setenv("JPY_SESSION_NAME", str(tmp_path / "loader study.ipynb"))
    client = Recording(nb, timeout=240, kernel_name="python3",
                       resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    return nb, updates


def test_a_cell_that_trains_shows_the_run_live_and_show_draws_it_again(
        tmp_path, monkeypatch, no_leaks):
    nb, updates = run_notebook(tmp_path, [SETUP, TRAIN, "import monitor\nmonitor.show(1)"],
                               monkeypatch)
    during = [html for _, cell, html in updates if cell == 1]
    # the view changed while the loop ran: several distinct frames with the run's figures
    figures = [h for h in during if "samples/s" in h]
    assert len(set(figures)) >= 3, (len(during), during[-1:] or None)
    last = figures[-1]
    assert "starvation-monitor · run 1 · loader study.ipynb" in last, last[:300]
    assert "<polyline" in last and "data wait" in last
    out = nb.cells[1].outputs
    shown = [o for o in out if o.get("output_type") == "display_data"]
    assert len(shown) == 1 and "samples/s" in shown[0]["data"]["text/html"], out
    # the run is the notebook's, not ipykernel_launcher.py's
    store = Store(tmp_path / "nb.db")
    assert store.run(1)["name"] == "loader study.ipynb"
    assert len(store.steps(1)) == 14 * 8
    # monitor.show(1): the run as it stands, its whole line, in its own cell
    drawn = [o["data"]["text/html"] for o in nb.cells[2].outputs
             if o.get("output_type") == "display_data"]
    assert drawn and "<polyline" in drawn[-1] and "samples/s" in drawn[-1], drawn


def test_the_notebook_name_is_vs_codes_where_it_gives_one():
    """VS Code's Jupyter extension names the notebook in the kernel's globals
    (`__vsc_ipynb_file__`), not in JPY_SESSION_NAME."""
    from monitor.probe.patch import script_name

    class Main:
        __vsc_ipynb_file__ = "/home/u/work/explore.ipynb"

    assert script_name("/x/ipykernel_launcher.py", env={}, main=Main) == "explore.ipynb"
    assert script_name("/x/ipykernel_launcher.py", env={"JPY_SESSION_NAME": "/n/a.ipynb"},
                       main=object()) == "a.ipynb"
    assert script_name("/x/train.py", env={}, main=Main) == "train.py"
    assert os.path.basename(script_name("/x/ipykernel_launcher.py", env={}, main=object())) \
        == "ipykernel_launcher.py"
