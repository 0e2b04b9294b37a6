"""Persisted plans on the GPU: a new process loads the plans an earlier one saved instead of
building, computes the same bits, and a damaged plan file is rebuilt, never trusted. Each step is a
fresh Python process (the graph cache lives in a process), pointed at its own STRIDEDFA_CACHE_DIR."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.cuda import require_cuda

torch = require_cuda()

from helpers.cases import check_forward, check_grads  # noqa: E402

pytestmark = pytest.mark.gpu

# One training step (forward + deterministic backward, causal, GQA, bshd views) on fresh data from
# a fixed seed; writes the tensors and what the caches did to argv[1].
_STEP = r"""
import json, sys, torch, stridedfa, stridedfa.torch
torch.manual_seed(1234)
x = lambda h: torch.randn(2, 192, h, 64, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
q, k, v = x(8), x(2), x(2)
out, lse = stridedfa.torch.attention(q, k, v, causal=True, deterministic=True, return_lse=True)
dout = torch.randn_like(out)
out.backward(dout)
torch.cuda.synchronize()
torch.save({n: t.detach().cpu() for n, t in dict(q=q, k=k, v=v, out=out, lse=lse, dout=dout, dq=q.grad,
            dk=k.grad, dv=v.grad).items()}, sys.argv[1])
info = stridedfa.cache_info()
print(json.dumps({"builds": info["builds"], **info["persistent"]}))
"""


def _step(directory: Path, name: str) -> tuple[dict, dict]:
    env = dict(os.environ, STRIDEDFA_CACHE_DIR=str(directory))
    env.pop("STRIDEDFA_PERSISTENT_CACHE", None)
    path = directory.parent / f"{name}.pt"
    done = subprocess.run([sys.executable, "-c", _STEP, str(path)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), torch.load(path)


def _check(t: dict) -> None:
    q, k, v, dout = (t[n].cuda() for n in ("q", "k", "v", "dout"))
    check_forward(t["out"].cuda(), t["lse"].cuda(), q, k, v, torch.bfloat16, {"causal": True})
    check_grads((t["dq"].cuda(), t["dk"].cuda(), t["dv"].cuda()), q, k, v, dout, torch.bfloat16, {"causal": True})


def _assert_same_bits(a: dict, b: dict) -> None:
    for name in ("out", "lse", "dq", "dk", "dv"):
        assert torch.equal(a[name], b[name]), f"{name} differs between a built and a loaded plan"


def test_a_new_process_loads_the_plans_and_computes_the_same_bits(tmp_path):
    plans = tmp_path / "plans"
    first, built = _step(plans, "first")
    assert first["builds"] == 2 and first["saves"] == 2 and first["loads"] == 0, first
    assert first["files"] == 2
    _check(built)
    second, loaded = _step(plans, "second")
    assert second["loads"] == 2 and second["saves"] == 0 and second["load_rejections"] == 0, second
    _check(loaded)
    _assert_same_bits(built, loaded)


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage"])
def test_a_damaged_plan_is_rebuilt_not_trusted(tmp_path, damage):
    plans = tmp_path / "plans"
    _, built = _step(plans, "first")
    for path in plans.glob("*.plan"):
        data = bytearray(path.read_bytes())
        if damage == "truncate":
            data = data[: len(data) // 2]
        elif damage == "flip":
            data[len(data) // 2] ^= 0xFF
        else:
            data = bytearray(os.urandom(len(data)))
        path.write_bytes(bytes(data))
    again, rebuilt = _step(plans, "again")
    assert again["load_rejections"] == 2 and again["loads"] == 0 and again["saves"] == 2, again
    _check(rebuilt)
    _assert_same_bits(built, rebuilt)
    third, _ = _step(plans, "third")
    assert third["loads"] == 2, "the rebuilt plans were not saved again"
