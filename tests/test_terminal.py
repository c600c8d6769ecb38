"""`monitor run --live`: on a terminal (a real pty), a rich table refreshed every 2 s with the
script's own output relayed above it and its exit status passed through; with stderr not a
terminal, plain status lines and no escape codes; and nothing of it unless asked or on a
terminal."""
from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow

SCRIPT = ("import runpy, sys; print('hello from the script', flush=True); "
          "[sys.stderr.write(f'progress {i}/3\\r') or sys.stderr.flush() for i in range(4)]; "
          "sys.argv = ['steady', '{seconds}']; "
          "runpy.run_path('tests/scripts/steady_loop.py', run_name='__main__'); "
          "print('bye from the script'); sys.exit(3)")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def command(db: Path, *flags: str, seconds: str = "5") -> list[str]:
    return [sys.executable, "-m", "monitor", "run", "--db", str(db), *flags, "--",
            sys.executable, "-c", SCRIPT.replace("{seconds}", seconds)]


def test_live_table_on_a_terminal_relays_the_scripts_output(tmp_path):
    main, child = pty.openpty()
    p = subprocess.Popen(command(tmp_path / "t.db"), cwd=ROOT, stdout=child, stderr=child,
                         stdin=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "110"})
    os.close(child)
    out = b""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([main], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the pty closed: every writer exited
                break
            if not chunk:
                break
            out += chunk
        elif p.poll() is not None:
            break
    rc = p.wait(timeout=30)
    os.close(main)
    text = out.decode(errors="replace")
    plain = ANSI.sub("", text)
    assert rc == 3, plain[-2000:]  # the script's exit status
    assert "hello from the script" in plain and "bye from the script" in plain
    assert plain.count("starvation-monitor · run 1") >= 2, plain[-2000:]  # refreshed
    table = plain[plain.rindex("starvation-monitor · run 1"):]
    for row in ("throughput", "data-wait share", "verdict", "top advice", "workers"):
        assert row in table, table
    assert re.search(r"throughput\s*│\s*[\d,]+ samples/s", table), table
    assert "\x1b[" in text  # a live display redraws on a terminal
    # the script's lines are whole lines, never cut by a redraw
    lines = [x.strip() for x in re.split(r"[\r\n]", plain)]  # \r: back to column 0
    assert "hello from the script" in lines, plain[:2000]
    # a progress bar's redraws (a lone \r) are the table's last row, not lines of output
    assert re.search(r"script\s*│\s*progress 3/3", plain), plain[-3000:]
    assert not [x for x in lines if x.startswith("progress ")]


def test_live_off_a_terminal_prints_plain_lines(tmp_path):
    r = subprocess.run(command(tmp_path / "t.db", "--live"), cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 3, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.startswith("starvation-monitor: run 1: ")]
    assert lines and "\x1b[" not in r.stderr, r.stderr
    # a step every ~12 ms: the refreshes after the first 2 s have a window to judge
    assert any(re.search(r"throughput [\d,]+ samples/s · data-wait share \d+%", x)
               for x in lines), lines
    assert r.stdout.splitlines()[0] == "hello from the script"  # untouched, not relayed

    # neither asked nor on a terminal: none (a 3 s loop still sees a refresh's time pass)
    quiet = subprocess.run(command(tmp_path / "q.db", seconds="3"), cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
    assert quiet.returncode == 3
    assert not [x for x in quiet.stderr.splitlines()
                if x.startswith("starvation-monitor: run 1: ")], quiet.stderr


def test_the_live_table_shows_advice_outside_the_loader_as_its_sentence():
    """Advice that is no loader setting ("host": free the cores) reads as its sentence,
    shortened, not as `host = free cores`; a loader setting keeps `name = value → gain`."""
    from monitor.diagnosis.finding import Advice
    from monitor.manage.terminal import ADVICE_CHARS, advice_text

    host = Advice("host", "free cores", None, "Other processes take 1.4 of the 2 cores the "
                  "loaders need: stop them, or move the job to a host with free cores, "
                  "before more workers can help")
    text = advice_text(host)
    assert text.startswith("Other processes take 1.4 of the 2 cores") and "=" not in text
    assert len(text) <= ADVICE_CHARS and text.endswith("…")
    assert advice_text(Advice("num_workers", 4, 1234.4, "more workers")) == \
        "num_workers = 4 → 1,234 samples/s"
    assert advice_text(None) == "none"
