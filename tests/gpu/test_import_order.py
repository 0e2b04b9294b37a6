"""Import order must not matter: torch (and JAX) load their own CUDA/cuDNN libraries and
stridedfa must coexist with them whichever comes first (guards against symbol clashes)."""

import os
import subprocess
import sys
import textwrap

import pytest

from helpers.cuda import require_cuda

torch = require_cuda()

import stridedfa  # noqa: E402

pytestmark = pytest.mark.gpu

SKIP_EXIT = 77  # the child could not import an optional framework

PRELUDES = {
    "torch-first": "import torch\nimport stridedfa\n",
    # stridedfa first, and its environment report (which may load cuDNN) before torch exists
    "stridedfa-first": "import stridedfa\nstridedfa.info()\nimport torch\n",
    "jax-first": textwrap.dedent(f"""\
        try:
            import jax
            jax.numpy.ones(8, device=jax.devices("gpu")[0]).block_until_ready()
        except Exception:
            raise SystemExit({SKIP_EXIT})
        import stridedfa
        import torch
        """),
}

BODY = textwrap.dedent("""\
    import stridedfa.torch
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 4, 128, 64, device="cuda", dtype=torch.float16, generator=g)
               for _ in range(3))
    out = torch.full_like(q, float("nan"))
    lse = torch.full((2, 4, 128), float("nan"), device="cuda")
    stridedfa.sdpa_forward(q, k, v, out, lse=lse, causal=True)
    out2 = stridedfa.torch.attention(q, k, v, causal=True)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                           is_causal=True)
    torch.cuda.synchronize()
    err = max((out.float() - ref).abs().max().item(), (out2.float() - ref).abs().max().item())
    assert err < 1e-2, f"max abs err {err}"
    print("OK", err)
    """)


@pytest.mark.parametrize("order", list(PRELUDES))
def test_import_order_does_not_matter(order):
    env = dict(os.environ)
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    # the child must import the same stridedfa as this process
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(stridedfa.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([package_root] + [p for p in sys.path if p])
    proc = subprocess.run([sys.executable, "-c", PRELUDES[order] + BODY], env=env,
                          capture_output=True, text=True, timeout=300)
    if proc.returncode == SKIP_EXIT:
        pytest.skip(f"{order}: JAX with a GPU backend is not available in a subprocess")
    assert proc.returncode == 0 and "OK" in proc.stdout, (
        f"{order}: exit {proc.returncode}\nstdout:\n{proc.stdout[-2000:]}\n"
        f"stderr:\n{proc.stderr[-4000:]}")
