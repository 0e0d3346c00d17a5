#!/usr/bin/env python3
"""Compare two builds of libfm3_cuda.so kernel by kernel (a refactor that should not change the code).

Each build folder is what scripts/gpu_build.sh writes: libfm3_cuda.so and ptxas.log. For every kernel
whose mangled name matches --filter, prints the ptxas resources (registers, spill bytes, stack frame)
and the SASS instruction count of both builds, the opcode-histogram differences, and whether the
instruction streams (addresses and encodings left out) are identical; then the ptxas warnings
(e.g. "C7510 ... Potential Performance Loss") found in only one build. Needs cuobjdump on PATH (or
--cuobjdump). Exit status 1 when a matched kernel differs in resources or instruction count, or exists
in one build only.

    tools/compare_sass.py BEFORE_DIR AFTER_DIR [--filter REGEX]
"""

import argparse
import collections
import re
import shutil
import subprocess
import sys
from pathlib import Path

_FUNC = re.compile(r"^\s*Function : (\S+)")
# "        /*0040*/                   @!P0 BRA `(.L_x_3) ;     /* 0x... */"
_INSN = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")
_ENTRY = re.compile(r"Compiling entry function '(\S+)'")
_PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")


def sass_by_kernel(lib: Path, cuobjdump: str) -> dict:
    """{mangled kernel name: [instruction text without address/encoding]}."""
    out = subprocess.run([cuobjdump, "-sass", str(lib)], check=True, capture_output=True, text=True).stdout
    kernels, cur = {}, None
    for line in out.splitlines():
        m = _FUNC.match(line)
        if m:
            cur = kernels.setdefault(m.group(1), [])
            continue
        m = _INSN.match(line)
        if m and cur is not None:
            cur.append(" ".join(m.group(1).split()))
    return kernels


def opcode(insn: str) -> str:
    """The opcode with its modifiers (HGMMA.64x128x16.F32.BF16), predicate guard left out."""
    tok = insn.split()
    if tok and tok[0].startswith("@"):
        tok = tok[1:]
    return tok[0] if tok else ""


def ptxas_resources(log: Path) -> tuple:
    """({kernel: (registers, spill stores, spill loads, stack frame)}, [warning lines])."""
    res, cur, warnings = {}, None, []
    for line in log.read_text().splitlines():
        if "warning" in line.lower():
            warnings.append(line.strip())
        m = _ENTRY.search(line)
        if m:
            cur = m.group(1)
            res[cur] = [None, None, None, None]
            continue
        if cur is None:
            continue
        m = _PROPS.search(line)
        if m:
            res[cur][3], res[cur][1], res[cur][2] = (int(x) for x in m.groups())
        m = _REGS.search(line)
        if m:
            res[cur][0] = int(m.group(1))
    return {k: tuple(v) for k, v in res.items()}, warnings


def demangle(names):
    tool = shutil.which("cu++filt") or shutil.which("c++filt")
    if not tool or not names:
        return {n: n for n in names}
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    return dict(zip(names, out)) if len(out) == len(names) else {n: n for n in names}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path, help="build folder (libfm3_cuda.so, ptxas.log)")
    ap.add_argument("after", type=Path, help="build folder (libfm3_cuda.so, ptxas.log)")
    ap.add_argument("--filter", default=r"flash_(fwd|bwd)_wgmma", help="regex on the mangled kernel name")
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "cuobjdump")
    args = ap.parse_args()

    pat = re.compile(args.filter)
    sass = [sass_by_kernel(d / "libfm3_cuda.so", args.cuobjdump) for d in (args.before, args.after)]
    res, warns = zip(*(ptxas_resources(d / "ptxas.log") for d in (args.before, args.after)))
    names = sorted(n for n in set(sass[0]) | set(sass[1]) if pat.search(n))
    pretty = demangle(names)
    failed = identical = 0
    for name in names:
        short = re.sub(r"\(.*", "", pretty[name]).replace("fm3::hopper::", "")
        print(f"== {short}")
        if name not in sass[0] or name not in sass[1]:
            print(f"   only in {'after' if name not in sass[0] else 'before'}")
            failed += 1
            continue
        rb, ra = res[0].get(name), res[1].get(name)
        fmt = lambda r: "n/a" if r is None else f"regs {r[0]}, spill st/ld {r[1]}/{r[2]} B, stack {r[3]} B"
        same_res = rb == ra
        print(f"   ptxas  before: {fmt(rb)}\n          after:  {fmt(ra)}{'' if same_res else '   <-- differs'}")
        b, a = sass[0][name], sass[1][name]
        print(f"   SASS instructions: before {len(b)}, after {len(a)}, diff {len(a) - len(b):+d}")
        hb, ha = collections.Counter(map(opcode, b)), collections.Counter(map(opcode, a))
        diff = {op: ha[op] - hb[op] for op in set(hb) | set(ha) if ha[op] != hb[op]}
        if diff:
            print("   opcode histogram differences (after - before): "
                  + ", ".join(f"{op} {d:+d}" for op, d in sorted(diff.items())))
        else:
            print("   opcode histogram: equal")
        same_stream = b == a
        print(f"   instruction stream: {'identical' if same_stream else 'differs'}")
        identical += same_stream
        failed += (not same_res) or len(a) != len(b)
    for label, only in (("before", set(warns[0]) - set(warns[1])), ("after", set(warns[1]) - set(warns[0]))):
        for w in sorted(only):
            print(f"ptxas warning only {label}: {w}")
    print(f"{len(names)} kernels compared: {identical} with identical instruction streams, "
          f"{failed} differing in resources or instruction count (or in one build only)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
