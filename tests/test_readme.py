"""The README's two set-up commands stay what CI and newcomers actually run."""
import re
from pathlib import Path

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
