"""scripts/bench_all.py --quick writes the machine line and a table (a smoke test; no timing asserted)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_writes_machine_line_and_table(tmp_path):
    out = tmp_path / "bench.md"
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_all.py"), "--quick", "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-500:]
    text = out.read_text()
    assert "Machine: " in text and "load average" in text and "commit" in text
    assert "| cascade_matmul | new |" in text


def test_bad_only_exits_nonzero_with_one_line(tmp_path):
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_all.py"), "--quick", "--only", "nope",
                        "--out", str(tmp_path / "b.md")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "'nope'" in p.stderr
