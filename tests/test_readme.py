"""The README's two set-up commands stay what CI and newcomers actually run."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _commands():
    blocks = re.findall(r"```bash\n(.*?)\n```", (ROOT / "README.md").read_text(), re.S)
    return [b.strip() for b in blocks if b.startswith("python3 -m venv")]


def test_readme_has_exactly_two_setup_commands():
    cmds = _commands()
    assert len(cmds) == 2
    assert "dspine-generate" in cmds[0] and "pytest" in cmds[1]


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert _commands()[1] in ci.splitlines()


def test_an_isolated_build_stops_at_once_with_the_command_to_type(tmp_path):
    """`pip install -e .` as people type it builds in an isolated environment without our torch:
    setup.py must stop there with the instruction, not fetch and build against another torch."""
    import subprocess
    import sys

    hide_torch = "import sys; sys.modules['torch'] = None; sys.argv = ['setup.py', '--version']; "
    run = subprocess.run([sys.executable, "-c", hide_torch + "exec(open('setup.py').read())"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    assert "pip install --no-build-isolation -e ." in run.stderr
    build_requires = (ROOT / "pyproject.toml").read_text().split("[project]")[0]
    assert '"torch' not in build_requires


def test_build_tools_are_declared_and_no_unused_include_is_set_up():
    """ninja (parallel compiles) is a declared build requirement, and a `build` extra names the
    tools for --no-build-isolation installs; setup.py sets up the CUTLASS include path exactly
    when a kernel includes CUTLASS (the sm90 attention kernel does, through CuTe), and CUTLASS is
    no build requirement (a CPU-only build must not need it)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "ninja" in project["build-system"]["requires"]
    assert set(project["build-system"]["requires"]) == set(
        project["project"]["optional-dependencies"]["build"])
    kernels = [f.read_text() for f in (ROOT / "csrc").rglob("*") if f.is_file()]
    kernels_use_cutlass = any("cutlass/" in text or "cute/" in text for text in kernels)
    assert kernels_use_cutlass == ("cutlass" in (ROOT / "setup.py").read_text().lower())
    assert not any("cutlass" in r.lower() for r in project["build-system"]["requires"])
