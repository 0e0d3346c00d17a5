"""Host checks of the per-column helpers in ops/include/fm3/mask.h that only the Hopper kernels call
(so CI, which has no GPU, still guards them): ``column_bounds`` must give exactly ``visible()``'s
answer for every mask input (startend_row_indices of each C/causal form, or none with and without
causal, columns past seqlen_k), and ``visible_bits`` must be ``row_masked`` packed 32 rows a word.
A small C++ program includes the header, checks random cases and prints the number it checked."""
import pathlib
import shutil
import subprocess

import pytest

INCLUDE = pathlib.Path(__file__).resolve().parent.parent / "ops" / "include"

PROGRAM = r"""
#include <cstdio>
#include <random>
#include <vector>
#include "fm3/mask.h"

int main() {
  std::mt19937 rng(1234);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  long checked = 0, bad = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    const int sq = uni(1, 300), sk = uni(1, 300), off = sk - sq;
    const int form = uni(0, 4);  // 0..3: (causal, C) forms; 4: no startend_row_indices
    const bool causal = form == 0 || form == 1 || (form == 4 && uni(0, 1));
    const int c = form == 0 ? 1 : form == 1 ? 2 : form == 2 ? 2 : 4;
    std::vector<int32_t> sri(static_cast<size_t>(sk) * c);
    for (int j = 0; j < sk; ++j) {  // ordered bounds in [0, sq] as the API's validation requires
      int a = uni(0, sq), b = uni(0, sq), u = uni(0, sq), v = uni(0, sq);
      if (a > b) std::swap(a, b);
      if (u > v) std::swap(u, v);
      const int vals[4] = {a, b, u, v};
      for (int k = 0; k < c; ++k) sri[static_cast<size_t>(j) * c + k] = vals[k];
    }
    const int32_t* src = form == 4 ? nullptr : sri.data();
    for (int j = 0; j < sk + 2; ++j) {
      const fm3::ColumnBounds cb = fm3::column_bounds(src, j, sq, sk, c, causal, off);
      const fm3::ColumnBounds raw = src ? fm3::load_column(src + static_cast<size_t>(j < sk ? j : 0) * c, j, c,
                                                           causal, sq, off)
                                        : fm3::ColumnBounds{sq, sq, 0, 0};
      for (int r0 = 0; r0 < sq; r0 += 32) {
        const uint32_t bits = fm3::visible_bits(cb, r0);
        for (int i = 0; i < 32 && r0 + i < sq; ++i) {
          const int row = r0 + i;
          const bool want = j < sk && fm3::visible(raw, row, j, causal, off, nullptr, 0);
          const bool masked = fm3::row_masked(cb, row);
          const bool bit = (bits >> i) & 1u;
          bad += (masked == want) + (bit != want);
          ++checked;
        }
      }
    }
  }
  std::printf("%ld %ld\n", checked, bad);
  return bad != 0;
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_column_bounds_and_visible_bits(tmp_path):
    src = tmp_path / "mask_header_check.cc"
    exe = tmp_path / "mask_header_check"
    src.write_text(PROGRAM)
    subprocess.run(["g++", "-std=c++17", "-O1", f"-I{INCLUDE}", str(src), "-o", str(exe)], check=True)
    res = subprocess.run([str(exe)], capture_output=True, text=True)
    checked, bad = map(int, res.stdout.split())
    assert checked > 1_000_000, f"too few cases checked: {checked}"
    assert bad == 0 and res.returncode == 0, f"{bad} of {checked} (row, column) cases disagree with visible()"
