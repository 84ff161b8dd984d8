"""The README's tour runs as written, and its two commands are the ones CI uses."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_tour_runs():
    code = re.search(r"## A short tour\n\n```python\n(.*?)```", README, re.S).group(1)
    exec(compile(code, "README.md", "exec"), {})


def test_ci_runs_the_readme_test_command():
    blocks = re.findall(r"```bash\n(.*?)\n```", README, re.S)
    assert len(blocks) >= 2, "the README starts with the main-job and the test commands"
    test_command = blocks[1].split("&&")[-1].strip()
    assert test_command in (ROOT / ".ci" / "run").read_text()
