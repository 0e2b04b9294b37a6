"""Graph cache: same shapes and strides hit; any stride difference builds a new graph
(and the new graph reads the tensors with their own strides)."""

import threading

import pytest

from helpers.cuda import require_cuda

torch = require_cuda()

import stridedfa  # noqa: E402
from helpers.cases import (  # noqa: E402
    DEVICE,
    Case,
    cache_counters,
    cache_delta,
    check_against_reference,
    check_fully_written,
    run_case,
)
from helpers.checks import assert_bitexact  # noqa: E402
from helpers.layouts import copy_to_layout, make_qkv, poisoned_like_strided, poisoned_lse  # noqa: E402

pytestmark = pytest.mark.gpu

def _forward(q, k, v):
    b, h, s, _ = q.shape
    out, _ = poisoned_like_strided((b, h, s, v.shape[-1]), dtype=q.dtype, device=DEVICE)
    lse = poisoned_lse(b, h, s, DEVICE)
    stridedfa.sdpa_forward(q, k, v, out, lse=lse)
    return out, lse


def test_cache_info_reportscache_counters():
    info = stridedfa.cache_info()
    missing = {"hits", "misses", "builds", "size", "maxsize"} - set(info)
    assert not missing, f"cache_info() lacks {missing}: {info}"
    assert 0 <= info["size"] <= info["maxsize"], info


def test_same_shapes_and_strides_hit_the_cache(seed):
    dims = (2, 4, 4, 192, 192, 64, 64)
    q, k, v, _ = make_qkv("bshd", *dims, torch.float16, DEVICE, seed)
    _forward(q, k, v)  # built now or earlier
    before = cache_counters()
    _forward(q, k, v)
    # other tensors (other pointers, other values) with the same shapes and strides
    q2, k2, v2, _ = make_qkv("bshd", *dims, torch.float16, DEVICE, seed + 1)
    _forward(q2, k2, v2)
    torch.cuda.synchronize()
    assert cache_delta(before, cache_counters()) == {"hits": 2, "misses": 0, "builds": 0}


def test_one_batch_stride_difference_builds_a_new_graph(seed):
    q, k, v, _ = make_qkv("bhsd", 2, 4, 4, 320, 320, 64, 64, torch.bfloat16, DEVICE, seed)
    want = _forward(q, k, v)
    # same values, same shape, only q's batch stride differs (padded by 1048 elements)
    strides = (q.stride(0) + 1048,) + q.stride()[1:]
    q_padded = torch.full((q.numel() + 1048,), float("nan"), dtype=q.dtype,
                          device=DEVICE).as_strided(q.shape, strides)
    q_padded.copy_(q)
    before = cache_counters()
    got = _forward(q_padded, k, v)
    torch.cuda.synchronize()
    assert cache_delta(before, cache_counters()) == {"hits": 0, "misses": 1, "builds": 1}
    assert_bitexact(got[0], want[0], "out with a padded batch stride")
    assert_bitexact(got[1], want[1], "lse with a padded batch stride")
    before = cache_counters()
    _forward(q_padded, k, v)
    assert cache_delta(before, cache_counters()) == {"hits": 1, "misses": 0, "builds": 0}


# changed layout -> (forward builds, backward builds)
CHANGES = {"dout_layout": (0, 1), "grad_layout": (0, 1), "out_layout": (1, 1)}


@pytest.mark.parametrize("field", list(CHANGES))
def test_output_and_grad_out_layouts_are_part_of_the_key(field, seed):
    """Rerun forward + backward with one tensor moved to bshd: the graphs that see it must
    be rebuilt, and the results must still be right."""
    case = Case("bhsd", "bf16", b=2, h_q=4, h_kv=4, s_q=320, s_kv=320, d_qk=64, d_v=64)
    first = run_case(case, seed)
    changed = case.replace(**{field: "bshd"})
    dout = copy_to_layout(first.dout, changed.dout_layout)
    before = cache_counters()
    run = run_case(changed, seed, inputs=(first.q, first.k, first.v, dout))
    builds = sum(CHANGES[field])
    expected = {"hits": 2 - builds, "misses": builds, "builds": builds}
    assert cache_delta(before, cache_counters()) == expected
    check_fully_written(run)
    check_against_reference(run, case.torch_dtype, case.ref_options)


# Each thread remembers its last lookup and redeems a ticket for a repeat (no key hashing). The
# tickets must never outlive the entries they name, and must count as ordinary hits.

def _two_configs(seed):
    a = make_qkv("bshd", 1, 2, 2, 128, 128, 64, 64, torch.bfloat16, DEVICE, seed)[:3]
    b = make_qkv("bhsd", 1, 2, 2, 96, 96, 64, 64, torch.bfloat16, DEVICE, seed + 1)[:3]
    return a, b


def test_repeats_and_alternation_count_as_hits(seed):
    a, b = _two_configs(seed)
    _forward(*a)  # built now or earlier
    _forward(*b)
    before = cache_counters()
    for qkv in (a, a, b, a, b, b):  # ticket redeemed for repeats, a full lookup otherwise
        _forward(*qkv)
    assert cache_delta(before, cache_counters()) == {"hits": 6, "misses": 0, "builds": 0}


def test_a_cleared_cache_is_not_bypassed_by_the_last_lookup(seed):
    a, _ = _two_configs(seed)
    want = _forward(*a)
    stridedfa.cache_clear()
    before = cache_counters()
    got = _forward(*a)
    torch.cuda.synchronize()
    assert cache_delta(before, cache_counters()) == {"hits": 0, "misses": 1, "builds": 1}
    assert_bitexact(got[0], want[0], "out after cache_clear")


def test_an_evicted_entry_is_rebuilt_not_redeemed(seed):
    a, b = _two_configs(seed)
    want = _forward(*a)
    capacity = stridedfa.cache_info()["maxsize"]
    try:
        stridedfa._core._set_cache_capacity(1)
        _forward(*a)  # a is the one entry left, and this thread's last lookup
        other = threading.Thread(target=_forward, args=b)  # another thread's b evicts a
        other.start()
        other.join()
        before = cache_counters()
        got = _forward(*a)  # this thread's ticket for a is stale now
        torch.cuda.synchronize()
        assert cache_delta(before, cache_counters()) == {"hits": 0, "misses": 1, "builds": 1}
        assert stridedfa.cache_info()["size"] == 1
        assert_bitexact(got[0], want[0], "out after eviction")
    finally:
        stridedfa._core._set_cache_capacity(capacity)


def test_threads_keep_their_own_last_lookup(seed):
    """Threads alternate configurations concurrently (prepare runs without the GIL); each result
    equals the single-threaded one bit for bit, and every call is a hit."""
    from concurrent.futures import ThreadPoolExecutor

    a, b = _two_configs(seed)
    want = {"a": _forward(*a)[0], "b": _forward(*b)[0]}
    torch.cuda.synchronize()

    def worker(order):
        got = []
        for name in order:
            got.append((name, _forward(*(a if name == "a" else b))[0]))
        torch.cuda.synchronize()
        return got

    orders = [["a", "b"] * 10, ["b", "a"] * 10, ["a"] * 20, ["b"] * 10 + ["a"] * 10]
    before = cache_counters()
    with ThreadPoolExecutor(len(orders)) as pool:
        results = list(pool.map(worker, orders))
    assert cache_delta(before, cache_counters()) == {"hits": 80, "misses": 0, "builds": 0}
    for got in results:
        for name, out in got:
            assert_bitexact(out, want[name], f"out of config {name} on a worker thread")
