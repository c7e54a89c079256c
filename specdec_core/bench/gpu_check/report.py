"""The GPU check's report: the environment it ran in, and gpu_check.json / gpu_check.md, rewritten
after every part."""

from __future__ import annotations

import json
import platform
from pathlib import Path

import torch

from ..architectures import ARCHITECTURES, build_model
from ..machine import load_average, package_versions
from ..outputs import write_json, write_text
from .part import Part


ENVIRONMENT_PACKAGES = ("torch", "transformers", "accelerate", "bitsandbytes", "gradio", "gradio_client", "triton",
                        "safetensors", "tokenizers", "huggingface_hub")


def environment(device: str) -> dict:
    """Python, the packages the GPU path depends on, CUDA and the GPU, and the cache keyword this
    transformers' models take."""
    env = {"python": platform.python_version(), "platform": platform.platform(), "load_average": load_average()}
    env.update(package_versions(ENVIRONMENT_PACKAGES))
    env["cuda"] = torch.version.cuda
    if device.startswith("cuda") and torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(torch.device(device))
        env["gpu"] = properties.name
        env["gpu_memory_gb"] = round(properties.total_memory / 1e9, 1)
        env["capability"] = f"{properties.major}.{properties.minor}"
    else:
        env["gpu"] = None
    from ...decoding.eager import cache_kwargs

    env["cache_keyword"] = next(iter(cache_kwargs(_tiny_probe_model(), None)))
    return env


def _tiny_probe_model():
    return build_model(ARCHITECTURES["tiny"], torch.float32, torch.device("cpu"))


def part_dict(part: Part) -> dict:
    return {"name": part.name, "status": part.status, "reason": part.reason, "seconds": part.seconds,
            "checks": [c.__dict__ for c in part.checks], "data": _jsonable(part.data)}


def _jsonable(value):
    return json.loads(json.dumps(value, default=str))


def write(out: Path, report: dict) -> None:
    write_json(out / "gpu_check.json", report)
    write_text(out / "gpu_check.md", markdown(report))


def markdown(report: dict) -> str:
    env = report["environment"]
    lines = [
        f"# GPU check on {env.get('gpu') or 'CPU'}",
        "",
        f"torch {env['torch']} (CUDA {env['cuda']}), transformers {env['transformers']}, bitsandbytes "
        f"{env['bitsandbytes']}, gradio {env['gradio']}; cache keyword `{env['cache_keyword']}`; "
        f"load average {env['load_average']}; {report['total_s']:.0f} s in all.",
        "",
        "| part | status | seconds | reason |",
        "|---|---|---|---|",
    ]
    lines += [f"| {p['name']} | {p['status']} | {p['seconds']:.0f} | {p['reason']} |" for p in report["parts"]]
    for p in report["parts"]:
        if not p["checks"]:
            continue
        lines += ["", f"## {p['name']}", "", "| check | status | detail |", "|---|---|---|"]
        lines += [f"| {c['name']} | {c['status']} | {c['detail']} |" for c in p["checks"]]
        if p["name"] == "fast_path" and "cost_model_table" in p["data"]:
            lines += ["", p["data"]["cost_model_table"]]
    return "\n".join(lines)
