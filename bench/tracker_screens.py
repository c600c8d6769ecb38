"""Screenshots for docs/guide.md's trackers section, of the real things in Chromium: one
starving script (tests/scripts/steady_loop.py) under `monitor run --tensorboard DIR --mlflow
URI`, then TensorBoard's scalars page (`tensorboard --logdir DIR`, its own server) and the
MLflow run's metrics (`mlflow server` of .venv-mlflow); and a notebook cell's live view, the
frame the feed renders for that run (monitor/manage/notebook.py), in a page as a notebook's
output shows it. Everything on 127.0.0.1.

    python bench/tracker_screens.py [--out docs/img]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import launch, wait_for  # noqa: E402
from tests.helpers import free_port  # noqa: E402

MLFLOW = ROOT / ".venv-mlflow" / "bin" / "mlflow"


def up(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except OSError:
        return False


def mlflow_run(url: str) -> tuple[str, str]:
    """The experiment and run the --mlflow output logged to (its own, "starvation-monitor")."""
    def call(path: str, body: dict) -> dict:
        req = urllib.request.Request(f"{url}/api/2.0/mlflow/{path}", data=json.dumps(body)
                                     .encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())
    with urllib.request.urlopen(f"{url}/api/2.0/mlflow/experiments/get-by-name?"
                                "experiment_name=starvation-monitor", timeout=10) as r:
        eid = json.loads(r.read())["experiment"]["experiment_id"]
    run = call("runs/search", {"experiment_ids": [eid], "max_results": 1})["runs"][0]
    return eid, run["info"]["run_id"]


def server(cmd: list[str], url: str, tmp: Path) -> subprocess.Popen:
    p = subprocess.Popen(cmd, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    if not wait_for(lambda: up(url), timeout=120, every=0.5):
        os.killpg(p.pid, signal.SIGKILL)
        raise SystemExit(f"{cmd[0]} did not answer at {url}")
    return p


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "docs" / "img"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        mport, tport = free_port(), free_port()
        murl = f"http://127.0.0.1:{mport}"
        procs = [server([str(MLFLOW), "server", "--host", "127.0.0.1", "--port", str(mport),
                         "--workers", "1", "--backend-store-uri",
                         f"sqlite:///{tmp / 'mlflow.db'}", "--default-artifact-root",
                         str(tmp / "artifacts")], murl, tmp)]
        try:
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            r = subprocess.run([sys.executable, "-m", "monitor", "run", "--no-live", "--db",
                                str(tmp / "m.db"), "--tensorboard", str(tmp / "tb"),
                                "--mlflow", murl, "--", sys.executable,
                                str(ROOT / "tests" / "scripts" / "steady_loop.py"), "20"],
                               cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
            if r.returncode != 0:
                raise SystemExit(r.stderr[-2000:])
            turl = f"http://127.0.0.1:{tport}"
            procs.append(server([str(Path(sys.executable).parent / "tensorboard"), "--logdir",
                                 str(tmp / "tb"), "--host", "127.0.0.1", "--port", str(tport)],
                                turl, tmp))
            frame = subprocess.run([sys.executable, "-m", "monitor.manage.notebook", "--db",
                                    str(tmp / "m.db"), "--run", "1", "--once"], env=env,
                                   capture_output=True, text=True, timeout=120).stdout
            cell = tmp / "cell.html"
            cell.write_text(
                "<html><body style='margin:16px;background:#fff'>"
                "<pre style='background:#f5f5f5;padding:8px;font-size:13px'>for batch in "
                "watch(loader):\n    train_step(batch)</pre>"
                f"<div style='padding:8px 8px 8px 60px'>{json.loads(frame)}</div>"
                "</body></html>")
            with sync_playwright() as p:
                browser = launch(p)
                page = browser.new_page(viewport={"width": 1400, "height": 900})
                page.goto(f"{turl}/#timeseries&tagFilter=starvation")
                page.wait_for_timeout(8000)  # its charts draw after their data arrives
                page.screenshot(path=str(out / "tensorboard-scalars.png"))
                eid, rid = mlflow_run(murl)
                page.goto(f"{murl}/#/experiments/{eid}/runs/{rid}/model-metrics")
                page.wait_for_timeout(6000)
                tab = page.get_by_text("Model metrics")
                if tab.count():
                    tab.first.click()
                    page.wait_for_timeout(4000)
                page.screenshot(path=str(out / "mlflow-run.png"))
                page.set_viewport_size({"width": 900, "height": 420})
                page.goto(cell.as_uri())
                page.wait_for_timeout(500)
                page.screenshot(path=str(out / "notebook-cell.png"))
                browser.close()
        finally:
            for p in procs:  # each server's own session: its workers (uvicorn's) with it
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    for name in ("tensorboard-scalars.png", "mlflow-run.png", "notebook-cell.png"):
        print(f"{out / name}: {(out / name).stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
