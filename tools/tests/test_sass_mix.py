"""tools/sass_mix.py: per-opcode sums of ncu's SASS source page, normalized per HGMMA."""
import gzip
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "sass_mix.py"
HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)",'
          '"# Samples","Instructions Executed"')


def write_csv(path, kernel, lines):
    rows = [f'"Kernel Name","{kernel}",', HEADER]
    rows += [f'"0x{i:x}","{src}","{smp}","0","{smp}","{n}"' for i, (src, n, smp) in enumerate(lines)]
    with gzip.open(path, "wt") as f:
        f.write("\n".join(rows) + "\n")


def test_mix_per_hgmma_and_ratio(tmp_path):
    a, b = tmp_path / "a.csv.gz", tmp_path / "b.csv.gz"
    write_csv(a, "ours", [("HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24", 10, 5),
                          ("FFMA R1, R2, R3, R4", 40, 3), ("@P0 FFMA R1, R2, R3, R4", 20, 2),
                          ("MUFU.EX2 R1, R2", 30, 10)])
    write_csv(b, "peer", [("HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24", 20, 5),
                          ("FFMA R1, R2, R3, R4", 60, 5), ("MUFU.EX2 R1, R2", 60, 10)])
    out = subprocess.run([sys.executable, str(SCRIPT), str(a), str(b)], capture_output=True, text=True, check=True).stdout
    full = subprocess.run([sys.executable, str(SCRIPT), str(a), "--full-opcode"], capture_output=True, text=True,
                          check=True).stdout
    assert "10 HGMMA" in full and "| MUFU.EX2 | 3.0 | 50.0 |" in full  # per HGMMA with modifiers kept too
    assert "[0] ours: 100 instructions, 10 HGMMA, 20 stall samples" in out
    assert "[1] peer: 140 instructions, 20 HGMMA, 20 stall samples" in out
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in out.splitlines()
            if line.startswith("| ") and not line.startswith("| opcode")}
    # ours: FFMA 60 (the predicated line counts under its opcode) per 10 HGMMA = 6.0; the peer 3.0
    assert rows["FFMA"] == ["6.0", "25.0", "3.0", "25.0", "0.50"]
    assert rows["MUFU"] == ["3.0", "50.0", "3.0", "50.0", "1.00"]
    assert rows["(all)"] == ["10.0", "100.0", "7.0", "100.0", "0.70"]
