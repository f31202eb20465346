"""Generates the parts of the NCCL stand-in (nccl_comm.c, nccl_coll.c;
csrc/phantom/README.md, "NCCL") that follow the NCCL version it is built
for:

  library  a stub for every function the real libnccl.so.N exports, that
           its headers declare as returning ncclResult_t, and that the
           stand-in does not implement; and the version script. The real
           library defines no symbol versions, so neither does the
           stand-in: its script has an anonymous node. The device API's
           host helpers that return something else (ncclTeamWorld, ...:
           structures, computed in the caller's kernels) and the profiling
           aliases (pnccl*) are left out: nothing a stub could return
           would be right for them, and PyTorch imports none of them.

Like gen_fakecuda.py, what the stand-in implements is read from its compiled
objects. It is written for the newest NCCL: a function of it that an older
real library lacks (ncclAlltoAll before 2.28, ...) is left out of the
version script, a local function, as the real library has none.
"""
import argparse
import re
import sys
from pathlib import Path

from gen_fakecuda import HEADER, implemented, nm, version_script, write


def stubs_c(source, names):
    """One stub per function: ncclInvalidUsage, its name on stderr the
    first time (vgnc_unsupported, nccl_comm.c)."""
    lines = [HEADER % source,
             "/* Each stub lands in vgnc_unsupported (nccl_comm.c). */",
             "int vgnc_unsupported(const char *name, int *said);",
             "#define STUB(name) int name(void); "
             "int name(void) { static int said; return vgnc_unsupported(#name, &said); }"]
    lines += ["STUB(%s)" % n for n in sorted(names)]
    return "\n".join(lines) + "\n"


def declared(include):
    """Functions the headers under `include` declare as returning
    ncclResult_t."""
    names = set()
    for header in sorted(Path(include).rglob("*.h")):
        names.update(re.findall(r"\bncclResult_t\s+(nccl\w+)\s*\(", header.read_text(errors="replace")))
    return names


def library(args):
    lib = Path(args.real)
    if not re.fullmatch(r"libnccl\.so\.\d+", lib.name):
        sys.exit("nccl_gen.py: %s is not a libnccl.so.N" % lib)
    exported = {name.split("@")[0] for kind, name in nm(["-D", "--defined-only", str(lib)])
                if kind in "TWi" and name.startswith("nccl")}
    written = implemented(args.objects, r"nccl")
    done = written & exported
    stubbed = (exported & declared(args.include)) - done
    left_out = exported - done - stubbed
    write(args.stubs, stubs_c(lib.name, stubbed))
    write(args.map, version_script(None, done | stubbed, ["vg_phantom_nccl_*"]))
    print("%s: %d functions, %d written, %d stubs, %d left out (%s)" % (
        lib.name, len(exported), len(done), len(stubbed), len(left_out), " ".join(sorted(left_out))))
    if written - exported:
        print("%s: not exported, as %s has none: %s" % (lib.name, lib.name, " ".join(sorted(written - exported))))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("library")
    p.add_argument("--real", required=True, help="the real libnccl.so.N")
    p.add_argument("--include", required=True, help="its include directory")
    p.add_argument("--stubs", required=True)
    p.add_argument("--map", required=True)
    p.add_argument("objects", nargs="+")
    args = parser.parse_args()
    {"library": library}[args.what](args)


if __name__ == "__main__":
    main()
