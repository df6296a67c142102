"""The README's Python API example runs as written (in a temp folder, on the session's Ray)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_python_api_example_runs(tmp_path, ray_local, monkeypatch, capsys):
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Python API"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})
    assert (tmp_path / "ledger.sqlite").exists()
    out = capsys.readouterr().out
    assert out.strip(), "the example printed nothing"
