"""tools/sass_tile_costs.py: stall samples split into per-block and per-tile code from two source views."""
import subprocess
import sys
from pathlib import Path

from test_sass_mix import write_csv

SCRIPT = Path(__file__).resolve().parents[1] / "sass_tile_costs.py"


def run(*args, check=True):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, check=check)


def test_lines_split_by_how_their_count_scales(tmp_path):
    full, causal = tmp_path / "full.csv.gz", tmp_path / "causal.csv.gz"
    # (SASS, executed, samples): role 0 = consumers up to the EXIT, role 1 = producer. Loop lines run 64 times per
    # tile in "full" and 32 in "causal"; the set-up and epilogue lines once per tile in both.
    write_csv(full, "k", [("MOV R1, RZ", 10, 7), ("HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24", 640, 300),
                          ("@!P0 BRA 0x7f00deadbeef", 640, 50), ("STG.E [R2], R4", 10, 20), ("EXIT", 10, 1),
                          ("SYNCS.ARRIVE R1", 640, 30), ("LDS R1, [R2]", 10, 9)])
    write_csv(causal, "k", [("MOV R1, RZ", 10, 8), ("HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24", 320, 150),
                            ("@!P0 BRA 0x7f11deadbeef", 320, 90), ("STG.E [R2], R4", 10, 22), ("EXIT", 10, 1),
                            ("SYNCS.ARRIVE R1", 320, 15), ("LDS R1, [R2]", 10, 12)])
    out = run(full, causal).stdout
    assert "full.csv.gz 417, " in out and "causal.csv.gz 298" in out
    assert "| 0 | per-block | 350 | 83.9% | 240 | 80.5% |" in out
    assert "| 0 | per-tile | 28 | 6.7% | 31 | 10.4% |" in out  # MOV, STG and the EXIT that ends the role
    assert "| 1 | per-block | 30 | 7.2% | 15 | 5.0% |" in out
    assert "| 1 | per-tile | 9 | 2.2% | 12 | 4.0% |" in out


def test_views_of_different_binaries_are_refused(tmp_path):
    a, b = tmp_path / "a.csv.gz", tmp_path / "b.csv.gz"
    write_csv(a, "k", [("MOV R1, RZ", 1, 1)])
    write_csv(b, "k", [("MOV R2, RZ", 1, 1)])
    r = run(a, b, check=False)
    assert r.returncode != 0 and "not of the same binary" in r.stderr
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    r = run(empty, a, check=False)
    assert r.returncode != 0 and "no ncu source-page table" in r.stderr
