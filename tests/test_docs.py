"""House rules written down, checked. Every file a module's docstring or docs/DESIGN.md
names exists where it says: a bare name in a module's docstring is a file of the module's
own folder, a path is one from the repository's root (or from monitor/, as DESIGN.md's
layout writes them); names of other projects' files and of examples are listed below with
why. Every sleep in the tests says why it is not a wait (`# sleep-ok`)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAMED = re.compile(r"(?<![\w/.-])(\w[\w/.-]*\.(?:py|md|json|yml|yaml|toml))\b")
# files of other projects, cited for their designs (DESIGN.md's models, the loops hooked)
OTHERS = {"api/collector.py", "nvitop/api/libnvml.py", "process_collector.py",
          "test_gpustat.py", "utils/data/_utils/worker.py", "fastai/learner.py",
          "loops/evaluation_loop.py", "loops/fit_loop.py", "loops/prediction_loop.py",
          "loops/training_epoch_loop.py"}
OURS = ("monitor", "workloads", "tests", "bench", "deploy", "docs", ".ci")
EXAMPLES = {"train.py", "path.py", "run.json"}  # a user's script, a spec's file, an export's


def docstrings() -> list[tuple[Path, str]]:
    out = []
    for p in sorted([*ROOT.glob("monitor/**/*.py"), *ROOT.glob("workloads/**/*.py")]):
        doc = ast.get_docstring(ast.parse(p.read_text()), clean=False)
        if doc:
            out.append((p, doc))
    return out


def missing(where: Path, text: str, bare_here: bool) -> list[str]:
    gone = []
    for name in set(NAMED.findall(text)):
        if name in OTHERS or name in EXAMPLES or name == "DESIGN.md":
            continue
        if "/" in name:
            ok = (ROOT / name).exists() or (ROOT / "monitor" / name).exists()
        elif bare_here:
            ok = (where.parent / name).exists()
        else:  # DESIGN.md's layout tree: a file of the folder it is listed under
            ok = (ROOT / name).exists() or any(next(ROOT.glob(f"{top}/**/{name}"), None)
                                               for top in OURS)
        if not ok:
            gone.append(name)
    return sorted(gone)


def test_every_file_a_docstring_names_exists_where_it_says():
    stale = {str(p.relative_to(ROOT)): gone for p, doc in docstrings()
             if (gone := missing(p, doc, bare_here=True))}
    assert not stale, stale


def test_every_file_design_names_exists():
    design = ROOT / "docs" / "DESIGN.md"
    assert not missing(design, design.read_text(), bare_here=False)


def test_a_stale_name_is_caught():
    here = ROOT / "monitor" / "assess" / "__init__.py"
    assert missing(here, "analysis.py holds the formulas", bare_here=True) == ["analysis.py"]
    assert missing(here, "monitor/frames/analysis.py", bare_here=True) == []


def sleeps_unmarked(path: Path) -> list[int]:
    """Lines of `path` that call a sleep without `# sleep-ok` on them."""
    src = path.read_text()
    lines = src.splitlines()
    calls = [n.lineno for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Call) and (
        getattr(n.func, "attr", None) == "sleep" or getattr(n.func, "id", None) == "sleep")]
    return [ln for ln in calls if "sleep-ok" not in lines[ln - 1]]


def test_every_sleep_in_the_tests_says_why():
    """The house rule: no fixed sleep used to wait. A test polls a condition with a deadline
    (its poll's interval is marked), a test workload's sleep is its modelled work (marked):
    any other sleep fails here."""
    found = {str(p.relative_to(ROOT)): lines for p in sorted(ROOT.glob("tests/**/*.py"))
             if (lines := sleeps_unmarked(p))}
    assert not found, found


def test_an_unmarked_sleep_is_caught(tmp_path):
    f = tmp_path / "t.py"
    f.write_text("import time\ntime.sleep(1)\ntime.sleep(0.1)  # sleep-ok: a poll\n")
    assert sleeps_unmarked(f) == [2]


def test_each_note_is_one_comment_block_and_every_citation_finds_it():
    """One NOTE format (torch's): `# NOTE [name]` alone on a comment line where the code
    lives, its text the comment lines under it; elsewhere it is cited by name."""
    files = [p for top in ("monitor", "workloads", "tests", "bench", "docs")
             for p in sorted(ROOT.glob(f"{top}/**/*")) if p.suffix in (".py", ".md")]
    defined: dict[str, list[str]] = {}
    cited: dict[str, set[str]] = {}
    for p in files:
        text = p.read_text()
        for m in re.finditer(r"^# NOTE \[([^\]]+)\]$", text, re.M):
            defined.setdefault(m.group(1), []).append(str(p.relative_to(ROOT)))
        if p.name == "test_docs.py":
            continue  # (this file names the format)
        for m in re.finditer(r"NOTE \[([^\]]+)\]", text):  # a name may wrap a line
            name = " ".join(re.sub(r'["#]', " ", m.group(1)).split())
            cited.setdefault(name, set()).add(str(p.relative_to(ROOT)))
    assert {k: v for k, v in defined.items() if len(v) > 1} == {}  # each defined once
    assert sorted(set(cited) - set(defined)) == []  # every citation finds its note
    for p, doc in docstrings():  # none defined in a docstring
        assert not re.search(r"^\s*#?\s*NOTE \[[^\]]+\]\s*(--|:)?\s*$", doc, re.M), p
