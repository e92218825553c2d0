"""The replayed crashing order (benchmarks/results/crash-bn-43-h100-order.txt) in one process,
every kernel handle cunorm ever compiled checked after each test: its attributes read again
(cuFuncGetAttribute) against what they were when first seen. The first test after which one
differs, or after which the check itself crashes, is the one that broke it.

    python benchmarks/probe_bn_handles.py ORDER_FILE"""
from __future__ import annotations

import os
import sys

import pytest
from cupy_backends.cuda.api import driver

from cunorm import _compile

ATTRS = (driver.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, driver.CU_FUNC_ATTRIBUTE_NUM_REGS,
         driver.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)


def say(text: str) -> None:
    os.write(2, (text + "\n").encode())


class HandleCheck:
    def __init__(self):
        self.seen: dict = {}  # pointer -> (name, attributes when first seen)

    def read(self, ptr: int) -> tuple:
        return tuple(driver.funcGetAttribute(a, ptr) for a in ATTRS)

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logfinish(self, nodeid, location):
        for key, (_kernel, ptr) in list(_compile._modules.items()):
            if ptr not in self.seen:
                self.seen[ptr] = (key[1], self.read(ptr))
        say(f"CHECK after {nodeid}: {len(self.seen)} handles")
        bad = []
        for ptr, (name, first) in self.seen.items():
            now = self.read(ptr)
            if now != first:
                bad.append(f"{ptr:#x} {name}: {first} -> {now}")
        if bad:
            say(f"CHECK BROKEN after {nodeid}: " + "; ".join(bad[:5]))
        else:
            say("CHECK ok")


if __name__ == "__main__":
    tests = open(sys.argv[1]).read().split()
    sys.exit(pytest.main(["-q", "-p", "no:xdist", "-p", "no:cacheprovider", *tests], plugins=[HandleCheck()]))
