"""benchmarks/plot_training_ledger.py on the real ledger (docs/TRAINING.md): the facts checked
here are the ledger's own, so a table edit that breaks the parser shows up here."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import plot_training_ledger as ledger  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def rows():
    return ledger.parse_ledger((ROOT / "docs" / "TRAINING.md").read_text())


def dspine_row(rows, run):
    (row,) = [r for r in rows if r["run"] == run and r["drafter"] == "dspine"]
    return row


def test_shipped_run_10(rows):
    row = dspine_row(rows, "10")
    assert row["committed"]
    assert row["humaneval_t0"] == pytest.approx(3.455)  # the cell is bold and has a note
    assert row["mtbench_t0"] == pytest.approx(2.730)


def test_run_16_not_committed(rows):
    row = dspine_row(rows, "16")
    assert not row["committed"] and row["continued_from_shipped"]
    assert row["humaneval_t0"] == pytest.approx(3.508)


def test_dflash_twins_and_order(rows):
    assert any(r["drafter"] == "dflash" for r in rows)
    assert [r["order"] for r in rows] == list(range(len(rows)))
    assert ledger.run_ids(rows)[:3] == ["1-2", "3", "4a"]


def test_lost_run_has_no_taus(rows):
    (row,) = [r for r in rows if r["run"] == "9"]
    assert row["drafter"] is None and not row["committed"]
    assert all(row[k] is None for k in ("humaneval_t0", "humaneval_t1",
                                        "mtbench_t0", "mtbench_t1"))


def test_missing_header_raises():
    with pytest.raises(ValueError, match="no training ledger"):
        ledger.parse_ledger("# Training\n\n| a | b |\n|---|---|\n| 1 | 2 |\n")


def test_plot_writes_png(rows, tmp_path):
    out = tmp_path / "ledger.png"
    ledger.plot(rows, out)
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000


def test_main_writes_json_and_prints_changes(tmp_path, capsys):
    assert ledger.main(["--out", str(tmp_path / "ledger.png")]) == 0
    saved = json.loads((tmp_path / "ledger.json").read_text())
    assert saved["rows"][0]["run"] == "1-2"
    # Run 12 against the shipped run 10: the ledger's own "+5.1% / +3.4%".
    assert "| 12 | 3.631 | 2.824 | +5.1% / +3.4% vs 10 | no |" in capsys.readouterr().out
