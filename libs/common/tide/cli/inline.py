"""`tide submit [options] -- COMMAND...`: a job spec from flags (like `sbatch --wrap` / `kubectl run`).

``inline_spec`` builds the same dict a YAML file would hold; the same model validates it (locally
first, so a bad flag is exit 2 naming the field before anything is sent).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tide.schemas.job import JobSpec, memory_mib

# flag -> the spec field it fills (for messages that name both)
FLAG_OF_FIELD = {
    "spec.template.resources.gpu": "--gpus",
    "spec.replicas": "--replicas",
    "spec.minMember": "--min-member",
    "metadata.queue": "--queue",
    "metadata.priorityClass": "--priority",
    "metadata.name": "--name",
    "spec.template.resources.gpuShare.memoryMiB": "--share-mem",
    "spec.template.resources.gpuShare.smPercent": "--share-sm",
    "spec.template.resources.gpuShare": "--share-mem/--share-sm",
    "spec.template.resources.mig": "--mig",
    "spec.template.resources.gpuModel": "--gpu-model",
    "spec.template.resources": "--cpu/--memory/--gpus",
    "spec.template.image": "--image",
    "spec.template.env": "--env",
    "spec.template.nodeSelector": "--selector",
}


class InlineError(ValueError):
    """A flag that cannot become a spec; the message names the flag (and the field)."""


def default_name(command: list[str]) -> str:
    """A job name from the command: the script when the program is an interpreter, else the program."""
    words = [Path(w).name for w in command if not w.startswith("-")]
    interpreters = {"python", "python3", "bash", "sh", "torchrun", "accelerate", "deepspeed", "uv", "srun"}
    pick = next((w for w in words if re.sub(r"[0-9.]+$", "", w) not in interpreters), words[0] if words else "job")
    name = re.sub(r"[^a-z0-9-]+", "-", Path(pick).stem.lower()).strip("-")[:40].strip("-")
    return name or "job"


def _pairs(values: list[str], flag: str) -> dict[str, str]:
    out = {}
    for v in values:
        key, sep, value = v.partition("=")
        if not sep or not key:
            raise InlineError(f"{flag} {v!r}: expected KEY=VALUE")
        out[key] = value
    return out


def inline_spec(args: argparse.Namespace, command: list[str]) -> dict[str, Any]:
    """The job spec the flags describe (not yet validated)."""
    if not command:
        raise InlineError("nothing to run: put the command after `--`, e.g. tide submit --gpus 1 -- python train.py")
    resources: dict[str, Any] = {}
    if args.gpus is not None:
        resources["gpu"] = args.gpus
    if args.share_mem is not None or args.share_sm is not None:
        if args.share_mem is None:
            raise InlineError("--share-sm needs --share-mem (the share's GPU memory, e.g. 10Gi)")
        try:
            mem = memory_mib(args.share_mem if re.search(r"[A-Za-z]", args.share_mem) else f"{args.share_mem}Mi")
        except ValueError as exc:
            raise InlineError(f"--share-mem: {exc}") from None
        resources["gpuShare"] = {"memoryMiB": mem, "smPercent": args.share_sm if args.share_sm is not None else 100}
    if args.mig is not None:
        resources["mig"] = args.mig
    if args.gpu_model:
        resources["gpuModel"] = [m for v in args.gpu_model for m in v.split(",") if m]
    if args.cpu is not None:
        resources["cpu"] = args.cpu
    if args.memory is not None:
        resources["memory"] = args.memory
    template: dict[str, Any] = {"command": list(command), "resources": resources}
    if args.image:
        template["image"] = args.image
    if args.env:
        template["env"] = _pairs(args.env, "--env")
    if args.selector:
        template["nodeSelector"] = _pairs(args.selector, "--selector")
    body: dict[str, Any] = {"template": template}
    if args.replicas is not None:
        body["replicas"] = args.replicas
    if args.min_member is not None:
        body["minMember"] = args.min_member
    metadata: dict[str, Any] = {"name": args.name or default_name(command)}
    if args.queue:
        metadata["queue"] = args.queue
    if args.priority:
        metadata["priorityClass"] = args.priority
    return {"apiVersion": "tide/v1", "kind": "Job", "metadata": metadata, "spec": body}


def first_error(spec: dict[str, Any]) -> tuple[str, str] | None:
    """(field, reason) of the first validation error, the field as the queue names it; None when valid."""
    try:
        JobSpec.model_validate(spec)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-"))
        msg = str(err["msg"]).removeprefix("Value error, ")
        return field, msg
    return None


def describe_error(field: str, reason: str) -> str:
    """``spec.template.resources.gpu (--gpus): Input should be ...``"""
    flag = FLAG_OF_FIELD.get(field)
    return f"{field} ({flag}): {reason}" if flag else f"{field}: {reason}"
