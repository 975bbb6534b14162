"""The wheel users install holds what a clone has: the licence text, every module and every data file the
code reads (heads presets, the web page, the haystack prose, the docs suite's questions)."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_has_the_licence_every_module_and_every_data_file(tmp_path):
    tree = tmp_path / "tree"               # built from a copy: the checkout gets no build/ folder
    tree.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, tree / name)
    shutil.copytree(ROOT / "src" / "reform", tree / "src" / "reform", ignore=shutil.ignore_patterns("__pycache__"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                        str(tmp_path), str(tree)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    wheel, = tmp_path.glob("reform_longcontext-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    source = ROOT / "src"
    shipped = {str(p.relative_to(source)) for p in (source / "reform").rglob("*")
               if p.is_file() and "__pycache__" not in p.parts}
    assert sorted(shipped - names) == []
