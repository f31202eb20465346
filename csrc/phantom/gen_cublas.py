"""Generates the parts of the cuBLAS and cuBLASLt stand-ins (cublas.c,
cublaslt.c; csrc/phantom/README.md) that follow the cuBLAS version they are
built for:

  library  stubs for every function the real libcublas.so.N or
           libcublasLt.so.N exports and the stand-in does not implement, and
           the version script (node and soname the real library's name, as
           its own version definition is)
  attrs    the size of every cuBLASLt descriptor attribute (matmul
           descriptor, matrix layout, preference, algorithm configuration,
           ...), read from the type each enumerator's comment in cublasLt.h
           names: cuBLASLt refuses a value of any other size, and so does
           the stand-in

Like gen_fakecuda.py, what the stand-in implements is read from its compiled
objects, and an implemented function the real library lacks is an error.
"""
import argparse
import re
import sys
from pathlib import Path

from gen_fakecuda import HEADER, check_known, implemented, nm, version_script, write


def stubs_c(source, names):
    """One stub per function: it fails with CUBLAS_STATUS_NOT_SUPPORTED and
    says its name on stderr the first time (vgcb_unsupported, in
    cublas_common.c). Its own flag remembers whether it has spoken."""
    lines = [HEADER % source,
             "/* Each stub lands in vgcb_unsupported (cublas_common.c). */",
             "int vgcb_unsupported(const char *name, int *said);",
             "#define STUB(name) int name(void); "
             "int name(void) { static int said; return vgcb_unsupported(#name, &said); }"]
    lines += ["STUB(%s)" % n for n in sorted(names)]
    return "\n".join(lines) + "\n"


def library(args):
    lib = Path(args.real)
    match = re.fullmatch(r"lib(cublas|cublasLt)\.so\.\d+", lib.name)
    if not match:
        sys.exit("gen_cublas.py: %s is not a libcublas.so.N or libcublasLt.so.N" % lib)
    prefix = match.group(1)
    exported = {name.split("@")[0] for kind, name in nm(["-D", "--defined-only", str(lib)])
                if kind in "TWi" and name.startswith(prefix)}
    done = implemented(args.objects, prefix)
    check_known(done, exported, lib.name)
    write(args.stubs, stubs_c(lib.name, exported - done))
    write(args.map, version_script(lib.name, exported))
    print("%s: %d functions, %d written, %d stubs" % (lib.name, len(exported), len(done),
                                                     len(exported - done)))


# The attribute enums of cublasLt.h, and the C array each becomes.
ATTR_ENUMS = [
    ("cublasLtMatmulDescAttributes_t", "vgcb_desc_attrs"),
    ("cublasLtMatrixLayoutAttribute_t", "vgcb_layout_attrs"),
    ("cublasLtMatmulPreferenceAttributes_t", "vgcb_pref_attrs"),
    ("cublasLtMatmulAlgoConfigAttributes_t", "vgcb_algo_config_attrs"),
]

SIZES = {"int8_t": 1, "uint8_t": 1, "int16_t": 2, "uint16_t": 2, "int32_t": 4, "uint32_t": 4,
         "int64_t": 8, "uint64_t": 8, "float": 4, "double": 8, "size_t": 8, "cudaDataType": 4}
# A line of a comment that names the attribute's type: "int32_t, default: 0",
# "const void *, default: NULL", "Bias case: const void *, ...", "int64_t*",
# "uint64_t".
TYPE_LINE = re.compile(r"^\s*\*?\s*(?:[A-Z][\w ]*:\s*)?(?:const\s+)?(\w+)\s*(\*)?\s*(?:[,;]|$|based\b)")


def attr_size(comment):
    """The size of the type the comment names; 0 when it names none."""
    for line in comment.splitlines():
        m = TYPE_LINE.match(line)
        if not m:
            continue
        name, pointer = m.groups()
        if pointer or name == "void" or re.fullmatch(r"cublasLt\w*(Desc|Handle)_t", name):
            return 8          # a pointer, or a descriptor (a pointer type)
        if name in SIZES:
            return SIZES[name]
        if re.fullmatch(r"(cublas|cuda)\w*_t", name):
            return 4          # an enum
    return 0


def enum_sizes(text, enum):
    """[(enumerator, value, size)] of one typedef'd enum of the header."""
    end = re.search(r"\}\s*%s\s*;" % re.escape(enum), text)
    if not end:
        sys.exit("gen_cublas.py: cublasLt.h has no enum %s" % enum)
    start = text.rfind("typedef enum", 0, end.start())
    body = text[text.index("{", start) + 1:end.start()]
    out, comment, value = [], "", -1
    for m in re.finditer(r"/\*(.*?)\*/|(\w+)\s*(?:=\s*(\w+)\s*)?(?:,|$)", body, re.S):
        if m.group(1) is not None:
            comment = m.group(1)
            continue
        value = int(m.group(3), 0) if m.group(3) else value + 1  # C's implicit values
        out.append((m.group(2), value, attr_size(comment)))
        comment = ""
    return out


def attrs(args):
    text = (Path(args.include) / "cublasLt.h").read_text()
    lines = [HEADER % "cublasLt.h", '#include "cublas_fake.h"', ""]
    unknown = []
    for enum, var in ATTR_ENUMS:
        rows = enum_sizes(text, enum)
        lines.append("const struct vgcb_attr %s[] = {" % var)
        for name, value, size in rows:
            lines.append('    {%d, %d, "%s"},' % (value, size, name))
            if not size:
                unknown.append(name)
        lines += ["};", "const int %s_count = %d;" % (var, len(rows)), ""]
    write(args.out, "\n".join(lines))
    # An attribute whose type the comment does not name takes any size up to
    # 8 bytes (cublaslt.c): say so, so that the parse can be taught.
    if unknown:
        print("gen_cublas.py: no type found for %s; any size up to 8 bytes is taken"
              % ", ".join(unknown))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("library")
    p.add_argument("--real", required=True, help="the real libcublas.so.N or libcublasLt.so.N")
    p.add_argument("--stubs", required=True)
    p.add_argument("--map", required=True)
    p.add_argument("objects", nargs="+")
    p = sub.add_parser("attrs")
    p.add_argument("--include", required=True)
    p.add_argument("--out", required=True)
    args = parser.parse_args()
    {"library": library, "attrs": attrs}[args.what](args)


if __name__ == "__main__":
    main()
