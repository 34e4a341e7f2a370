"""The environment check: what this machine has (versions, device, memory, the model cache).

Notebook 00 shows it; `python -m llm_anatomy doctor` prints it.
"""

from __future__ import annotations

import importlib.metadata
import platform
import sys

import torch

from ..device import choose_cpu_threads, default_dtype, describe_device, pick_device
from ..weights.cache import DEFAULT_MODEL, GGUF_NAME, cache_dir, cache_problems, default_model_dir

PACKAGES = ("torch", "transformers", "tokenizers", "safetensors", "gguf", "accelerate",
            "ipywidgets", "matplotlib", "jupyterlab", "nbval", "llm-anatomy")


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def environment_report(check_hashes: bool = True) -> dict:
    """Everything the course needs to know about this machine, as a dict of plain values.

    Memory figures are in GB (10^9 bytes).
    """
    import psutil

    device = pick_device("auto")
    report = {
        "python": sys.version.split()[0],
        "platform": platform.platform(terse=True),
        "packages": {name: _version(name) for name in PACKAGES},
        "device": describe_device(device),
        "dtype": str(default_dtype(device)).removeprefix("torch."),
        "cpu_cores": psutil.cpu_count(logical=True),
        "cpu_threads": str(choose_cpu_threads()),  # what load_model will give torch now, and why
        "torch_threads_now": torch.get_num_threads(),  # torch's threads before load_model applies the choice
        "ram_total_gb": round(psutil.virtual_memory().total / 1e9, 1),
        "ram_available_gb": round(psutil.virtual_memory().available / 1e9, 1),
        "cache_dir": str(cache_dir()),
    }
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info()
        report["gpu_memory_total_gb"] = round(total / 1e9, 1)
        report["gpu_memory_free_gb"] = round(free / 1e9, 1)
    problems = cache_problems(default_model_dir(), check_hashes=check_hashes)
    report["default_model"] = DEFAULT_MODEL
    report["model_cache"] = "ready" if not problems else "; ".join(problems)
    report["gguf_cached"] = (cache_dir() / "gguf" / GGUF_NAME).exists()
    return report


def problems_in(report: dict) -> list[str]:
    """What stops the course from running, each with what to do about it."""
    found = []
    major, minor = (int(x) for x in report["python"].split(".")[:2])
    if (major, minor) < (3, 11):
        found.append(f"Python {report['python']} is too old: the course needs 3.11 or newer.")
    for name in ("torch", "transformers", "tokenizers", "ipywidgets", "matplotlib"):
        if report["packages"][name] == "not installed":
            found.append(f"{name} is not installed: run `make setup` (or pip install -r requirements.txt).")
    tf = report["packages"]["transformers"]
    if tf != "not installed" and int(tf.split(".")[0]) < 5:
        found.append(f"transformers {tf} is too old: the course needs 5.x.")
    if report["model_cache"] != "ready":
        found.append("The default model is not in the cache yet: run `python -m llm_anatomy fetch` while online.")
    return found


def format_report(report: dict) -> str:
    """The report as aligned text lines, ending with a verdict."""
    lines = [f"{'Python':<22}{report['python']} on {report['platform']}"]
    for name, version in report["packages"].items():
        lines.append(f"{name:<22}{version}")
    lines.append(f"{'device':<22}{report['device']} -> {report['dtype']}")
    lines.append(f"{'CPU cores':<22}{report['cpu_cores']}")
    now = report.get("torch_threads_now")
    lines.append(f"{'CPU threads':<22}load_model sets {report['cpu_threads']}"
                 + (f" (torch's default until then: {now}, as on the device line)" if now is not None else ""))
    lines.append(f"{'RAM':<22}{report['ram_available_gb']} GB free of {report['ram_total_gb']} GB")
    if "gpu_memory_total_gb" in report:
        lines.append(f"{'GPU memory':<22}{report['gpu_memory_free_gb']} GB free of {report['gpu_memory_total_gb']} GB")
    lines.append(f"{'cache folder':<22}{report['cache_dir']}")
    lines.append(f"{'default model':<22}{report['default_model']}: {report['model_cache']}")
    problems = problems_in(report)
    lines.append("")
    lines.extend(f"PROBLEM: {p}" for p in problems)
    lines.append("All good: the course is ready to run." if not problems else f"{len(problems)} problem(s) to fix.")
    return "\n".join(lines)


def peak_memory_bytes() -> tuple[int, str]:
    """This process's peak resident memory in bytes, and how it was read (portable: no POSIX-only module).

    Linux: VmHWM from /proc/self/status; Windows: psutil's peak working set; elsewhere the current
    resident size (a lower bound of the peak).
    """
    import psutil

    status = "/proc/self/status"
    try:
        with open(status) as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024, "peak (VmHWM)"
    except OSError:
        pass
    info = psutil.Process().memory_info()
    if hasattr(info, "peak_wset"):
        return int(info.peak_wset), "peak (working set)"
    return int(info.rss), "current (a lower bound of the peak)"
