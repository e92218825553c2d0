"""Runs a probe script of tests/ in a fresh interpreter (empty kernel and plan caches, its
own environment) and returns the JSON report it prints last."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

from cunorm.gpucheck import environment_with_repo

ROOT = pathlib.Path(__file__).resolve().parent.parent


def run_probe(script: str, *args: str, env_drop: tuple = (), **env_set: str) -> dict:
    env = environment_with_repo(**env_set)
    for name in env_drop:
        env.pop(name, None)
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / script), *args], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
