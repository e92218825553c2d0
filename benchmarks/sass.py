"""Static SASS of one kernel instantiation, compiled here with NVRTC as CuPy compiles it (no
GPU needed): instruction count, opcode histogram, and optionally the listing.

    python benchmarks/sass.py layer_norm.cu 'norm_fwd_smem<__nv_bfloat16, __nv_bfloat16, 8, 4, 128, false>' \
        [--arch sm_90] [-D CUNORM_FWD_PACK_SUM=1] [--list]

nvdisasm comes from the nvidia-cuda-nvdisasm wheel (pip install nvidia-cuda-nvdisasm) or
the PATH; set NVDISASM to point elsewhere.
"""
from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile


def _nvdisasm() -> str:
    found = os.environ.get("NVDISASM") or shutil.which("nvdisasm")
    if not found:
        import site

        hits = [p for d in site.getsitepackages() for p in glob.glob(os.path.join(d, "nvidia", "*", "bin", "nvdisasm"))]
        found = hits[0] if hits else None
    if not found:
        sys.exit("nvdisasm not found: pip install nvidia-cuda-nvdisasm, or set NVDISASM")
    return found


def cubin(filename: str, name: str, arch: str, defines: list[str]) -> bytes:
    from cupy_backends.cuda.libs import nvrtc

    from cunorm import _compile

    options = [*_compile.nvrtc_options(arch), *_compile.COMPILE_OPTIONS, *(f"-D{d}" for d in defines)]
    prog = nvrtc.createProgram(_compile.kernel_source(filename), filename, [], [])
    try:
        nvrtc.addNameExpression(prog, name)
        try:
            nvrtc.compileProgram(prog, options)
        except nvrtc.NVRTCError as err:
            sys.exit(f"{err}\n{nvrtc.getProgramLog(prog)}")
        return nvrtc.getCUBIN(prog) + b"\0"  # CuPy's getCUBIN drops the image's last byte (nvdisasm refuses it)
    finally:
        nvrtc.destroyProgram(prog)


def sass(filename: str, name: str, arch: str = "sm_90", defines=()) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin(filename, name, arch, list(defines)))
        return subprocess.run([_nvdisasm(), "-c", path], capture_output=True, text=True, check=True).stdout


def opcodes(listing: str) -> collections.Counter:
    """Opcode (without modifiers) of every instruction line."""
    ops = collections.Counter()
    for line in listing.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
        if m:
            ops[m.group(1)] += 1
    return ops


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file")
    ap.add_argument("name")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("-D", dest="defines", action="append", default=[])
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    listing = sass(args.file, args.name, args.arch, args.defines)
    if args.list:
        print(listing)
    ops = opcodes(listing)
    print(f"{sum(ops.values())} instructions: " + ", ".join(f"{k} {v}" for k, v in ops.most_common()))


if __name__ == "__main__":
    main()
