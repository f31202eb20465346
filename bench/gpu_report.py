"""The GPU results as a short markdown table, with the machine they came
from: python bench/gpu_report.py bench/results"""
import datetime
import json
import subprocess
import sys
from pathlib import Path


def machine():
    info = {"date": datetime.date.today().isoformat()}
    try:
        import torch

        info.update(gpu=torch.cuda.get_device_name(0), torch=torch.__version__, cuda=torch.version.cuda)
    except Exception as exc:  # the report still prints what it has
        info["gpu"] = f"unknown ({exc})"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
        info["driver"] = out.splitlines()[0] if out else "unknown"
    except (OSError, subprocess.SubprocessError):
        info["driver"] = "unknown"
    return info


def load(folder, name):
    path = Path(folder) / name
    return json.loads(path.read_text()) if path.exists() else None


def mib(n):
    return f"{n / 2**20:,.0f}" if isinstance(n, (int, float)) else "-"


def train_table(rows, title):
    out = [f"### {title}", "",
           "| model | batch | step ms native | step ms vramguard | step ratio | peak reserved MiB native | "
           "vramguard | reserved ratio | peak allocated MiB native | vramguard | max loss diff |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "step_time_ratio" not in r:
            out.append(f"| {r['model']} | {r.get('batch')} | failed: "
                       f"{r.get('native', {}).get('error', '')[:60]} {r.get('vramguard', {}).get('error', '')[:60]} |")
            continue
        out.append(
            f"| {r['model']} | {r['batch']} | {r['median_step_native_ms']:.1f} | {r['median_step_vramguard_ms']:.1f} "
            f"| {r['step_time_ratio']:.3f} | {mib(r['peak_reserved_native'])} | {mib(r['peak_reserved_vramguard'])} "
            f"| {r['peak_reserved_ratio']:.3f} | {mib(r['peak_allocated_native'])} | "
            f"{mib(r['peak_allocated_vramguard'])} | {r['max_loss_difference']:.2e} |")
    return out + [""]


def main(folder):
    m = machine()
    out = [f"## vramguard on {m['gpu']}", "",
           f"driver {m['driver']}, torch {m.get('torch')}, CUDA {m.get('cuda')}, {m['date']}", ""]
    for name, title in (("gpu_train.json", "Training side by side"),
                        ("gpu_train_full.json", "Training side by side, 100 steps after 10")):
        rows = load(folder, name)
        if rows:
            out += train_table(rows, title)
    rows = load(folder, "gpu_max_batch.json")
    if rows:
        out += ["### Largest batch under one budget", "", "| model | budget | native | vramguard |", "|---|---|---|---|"]
        out += [f"| {r['model']} | {r['budget']} | {r['largest_batch_native']} | {r['largest_batch_vramguard']} |"
                for r in rows] + [""]
    micro = load(folder, "gpu_alloc_micro.json")
    if micro and "ratio_vramguard_native" in micro:
        v = micro["vramguard"]
        out += ["### torch.empty + del, mixed sizes (ns per pair, median of 7)", "",
                "| native | vramguard | ratio | of which vramguard's heap |", "|---|---|---|---|",
                f"| {micro['native']['ns_per_pair']:.0f} | {v['ns_per_pair']:.0f} | "
                f"{micro['ratio_vramguard_native']:.2f} | {v['heap_ns_per_pair']:.0f} |", ""]
    (Path(folder) / "machine.json").write_text(json.dumps(m, indent=1))
    print("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/results")
