"""The phantom against the card: the zoo's figures from a real GPU
(tests/gpu/zoo_on_gpu.sh) beside the same runs on a phantom of that GPU.

    python bench/zoo_fidelity.py --table bench/results/gpu_zoo
        the GPU's figures as a markdown table
    python bench/zoo_fidelity.py --compare bench/results/gpu_zoo --gpu H200 --out DIR
        each (model, allocator) of the GPU's results run again on a phantom
        H200 (same steps, same batch), one process each, and the two side
        by side: peak allocated (goal: within 1%), the allocation sizes in
        order under PyTorch's allocator (aligned: how many only one side
        made), peak reserved per allocator.

The phantom's runs must use the torch the GPU's did (the results name it):
allocation sequences change between releases.
"""
import argparse
import glob
import gzip
import json
import os
import subprocess
import sys

MiB = 1 << 20
#: The longest stretch of differing allocations aligned one by one (above it, counted).
ALIGN_AT = 20_000
#: --reuse: the phantom's results already in --out stand (a restarted comparison).
REUSE = False
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def load(directory):
    """{(model, allocator): result} of the JSON files in `directory`
    (gzipped or not)."""
    results = {}
    paths = glob.glob(os.path.join(directory, "*.json")) + glob.glob(os.path.join(directory, "*.json.gz"))
    for path in sorted(paths):
        with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
            r = json.load(f)
        if not isinstance(r, dict) or "model" not in r:  # another result kept beside them
            continue
        results[(r["model"], r["allocator"])] = r
    return results


def _mib(n):
    return "-" if n is None else f"{n / MiB:,.0f}"


def table(results):
    allocators = sorted({a for _, a in results}, key=["native", "expandable", "vramguard",
                                                      "vramguard-segments"].index)
    lines = ["| model | " + " | ".join(f"{a} alloc / reserved MiB" for a in allocators) + " |",
             "|---" * (len(allocators) + 1) + "|"]
    for model in sorted({m for m, _ in results}):
        cells = []
        for a in allocators:
            r = results.get((model, a))
            if r is None:
                cells.append("-")
            elif not r.get("fits", False):
                cells.append("OOM")
            else:
                cells.append(f"{_mib(r['peak_allocated_bytes'])} / {_mib(r['peak_reserved_bytes'])}")
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def sequence_differences(gpu, phantom):
    """How two allocation sequences differ, aligned (difflib): None when
    equal, else (allocations only the GPU made, only the phantom made, the
    GPU's first such size). Insertions here and there would show as every
    later index differing without the alignment."""
    if gpu == phantom:
        return None
    import collections
    import difflib

    # What both share at the ends needs no alignment; difflib's is quadratic
    # in the rest, so past ALIGN_AT allocations (a generation loop makes
    # 369,641) only the counts are compared, as multisets.
    start = 0
    while start < min(len(gpu), len(phantom)) and gpu[start] == phantom[start]:
        start += 1
    end = 0
    while end < min(len(gpu), len(phantom)) - start and gpu[-1 - end] == phantom[-1 - end]:
        end += 1
    gpu, phantom = gpu[start:len(gpu) - end], phantom[start:len(phantom) - end]
    first = (gpu[0] if gpu else None, phantom[0] if phantom else None)
    if max(len(gpu), len(phantom)) > ALIGN_AT:
        g, p = collections.Counter(gpu), collections.Counter(phantom)
        return sum((g - p).values()), sum((p - g).values()), first
    only_gpu = only_phantom = 0
    first = None
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, gpu, phantom, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        only_gpu += i2 - i1
        only_phantom += j2 - j1
        if first is None:
            first = (gpu[i1] if i2 > i1 else None, phantom[j1] if j2 > j1 else None)
    return only_gpu, only_phantom, first


def run_phantom(gpu_result, gpu, out):
    """The same run on a phantom `gpu`; its result."""
    sys.path.insert(0, os.path.join(ROOT, "python"))
    from vramguard.phantom import gpu as _phantom

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("VRAMGUARD_", "VG_FAKECUDA_")) and k != "PYTORCH_CUDA_ALLOC_CONF"}
    env.update(_phantom.environ(gpu))
    if os.environ.get("ZOO_PRELOAD"):  # a phantom built for another torch than this tree's
        env["LD_PRELOAD"] = os.environ["ZOO_PRELOAD"]
    env["PYTHONPATH"] = os.path.join(ROOT, "python")
    model, alloc = gpu_result["model"], gpu_result["allocator"]
    path = os.path.join(out, f"{model}.{alloc}.json")
    if REUSE and os.path.exists(path):  # a run an interrupted comparison already made
        with open(path) as f:
            return json.load(f)
    history = "2000000" if "allocation_sizes" in gpu_result else "0"
    cmd = [sys.executable, os.path.join(HERE, "zoo_run.py"), model, "--allocator", alloc,
           "--steps", str(gpu_result["steps"]), "--size", gpu_result.get("size", "full"),
           "--history", history, "--json", path]
    if gpu_result.get("batch"):
        cmd += ["--batch", str(gpu_result["batch"])]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["exit %d" % proc.returncode])[-1]}
    with open(path) as f:
        return json.load(f)


def compare(gpu_results, gpu, out):
    rows = ["| model | allocator | peak allocated GPU / phantom MiB (diff) | allocations GPU / phantom, "
            "aligned | peak reserved GPU / phantom MiB |", "|---|---|---|---|---|"]
    summary = []
    for (model, alloc), g in sorted(gpu_results.items()):
        p = run_phantom(g, gpu, out)
        print(f"{model} {alloc}: {'error: ' + p['error'] if 'error' in p else 'done'}", file=sys.stderr)
        if "error" in p:
            rows.append(f"| {model} | {alloc} | phantom failed: {p['error'][:120]} | | |")
            continue
        ga, pa = g["peak_allocated_bytes"], p["peak_allocated_bytes"]
        diff = (pa - ga) / ga * 100 if ga else 0.0
        seq = ""
        if "allocation_sizes" in g and "allocation_sizes" in p:
            apart = sequence_differences(g["allocation_sizes"], p["allocation_sizes"])
            where = "same sizes in order" if apart is None else (
                f"{apart[0]:,} only on the GPU, {apart[1]:,} only on the phantom (first: {apart[2][0]} vs "
                f"{apart[2][1]} bytes)")
            seq = f"{len(g['allocation_sizes']):,} / {len(p['allocation_sizes']):,}: {where}"
        rows.append(f"| {model} | {alloc} | {_mib(ga)} / {_mib(pa)} ({diff:+.2f}%) | {seq} | "
                    f"{_mib(g['peak_reserved_bytes'])} / {_mib(p['peak_reserved_bytes'])} |")
        summary.append({"model": model, "allocator": alloc, "gpu": g, "phantom": p, "allocated_diff_pct": diff})
    return "\n".join(rows), summary


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table", metavar="DIR", help="the GPU's results as a table")
    ap.add_argument("--compare", metavar="DIR", help="run the GPU's results again on a phantom")
    ap.add_argument("--gpu", default="H200", help="the phantom's preset (the card the results came from)")
    ap.add_argument("--models", help="only these models (comma-separated)")
    ap.add_argument("--out", default="bench/results/phantom_zoo", help="where the phantom's results go")
    ap.add_argument("--reuse", action="store_true", help="keep the phantom's results already in --out")
    args = ap.parse_args(argv)
    global REUSE
    REUSE = args.reuse
    if args.table:
        print(table(load(args.table)))
    if args.compare:
        results = load(args.compare)
        if args.models:
            keep = set(args.models.split(","))
            results = {k: v for k, v in results.items() if k[0] in keep}
        os.makedirs(args.out, exist_ok=True)
        text, summary = compare(results, args.gpu, args.out)
        print(text)
        with open(os.path.join(args.out, "fidelity.json"), "w") as f:
            json.dump([{k: v for k, v in s.items() if k in ("model", "allocator", "allocated_diff_pct")}
                       for s in summary], f, indent=1)


if __name__ == "__main__":
    main()
