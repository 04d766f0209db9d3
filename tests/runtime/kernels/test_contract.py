"""The kernel contract (KernelBackend): exactly the ops the runtime calls, offered by every backend with one
signature."""

import importlib
import inspect
import re
from pathlib import Path

import pytest

import sensprof.runtime
from sensprof.runtime.kernels import triton_available
from sensprof.runtime.kernels.contract import KernelBackend

BACKENDS = ["reference", "cpu_kernels",
            pytest.param("triton_kernels", marks=pytest.mark.skipif(not triton_available(),
                                                                    reason="triton is not installed"))]
OPS = {name for name, member in vars(KernelBackend).items() if inspect.isfunction(member) and name[0] != "_"}
MEMBERS = OPS | set(KernelBackend.__annotations__)


def _contract_signature(name):
    sig = inspect.signature(getattr(KernelBackend, name), eval_str=True)
    return sig.replace(parameters=list(sig.parameters.values())[1:])  # without self


def test_the_contract_is_what_the_runtime_calls():
    """Every backend member the runtime reads is in the contract, and every op in it is called."""
    used = set()
    for path in Path(sensprof.runtime.__file__).parent.glob("*.py"):
        used |= set(re.findall(r"(?:\bops|\.kernels|_kernels\([^)]*\))\.(\w+)", path.read_text()))
    assert used <= MEMBERS, used - MEMBERS
    assert OPS <= used, OPS - used


@pytest.mark.parametrize("module", BACKENDS)
def test_each_backend_satisfies_the_contract_with_identical_signatures(module):
    backend = importlib.import_module(f"sensprof.runtime.kernels.{module}")
    assert isinstance(backend, KernelBackend)  # every member is there
    for name in OPS:
        assert inspect.signature(getattr(backend, name), eval_str=True) == _contract_signature(name), name
    assert isinstance(backend.NAME, str) and isinstance(backend.NEEDS_POWER_OF_TWO_HEAD_DIM, bool)
