# How much of a paged decode step is host time: attention_with_kvcache called 200 times behind a GPU
# spin (host time alone), then back to back (CUDA events), next to attention() on the same q over a
# dense cache of the same length.
import time, torch, stridedfa.torch as st
H_Q, H_KV, D, BLOCK = 32, 8, 128, 16
for batch, length in ((1, 1024), (32, 1024), (32, 8192)):
    blocks = length // BLOCK
    cache = torch.randn(batch * blocks, 2, BLOCK, H_KV, D, device="cuda", dtype=torch.bfloat16)
    kc, vc = cache[:, 0].transpose(1, 2), cache[:, 1].transpose(1, 2)
    table = torch.randperm(batch * blocks, device="cuda").view(batch, blocks).to(torch.int32)
    lengths = torch.full((batch,), length, device="cuda", dtype=torch.int32)
    q = torch.randn(batch, H_Q, 1, D, device="cuda", dtype=torch.bfloat16)
    kd = torch.randn(batch, H_KV, length, D, device="cuda", dtype=torch.bfloat16)
    calls = {"paged": lambda: st.attention_with_kvcache(q, kc, vc, table, lengths),
             "paged_op": lambda: torch.ops.stridedfa.paged_forward(q, kc, vc, table, lengths, None, True, "bottom_right", -1, -1, None),
             "dense_attention": lambda: st.attention(q, kd, kd, causal=True, causal_alignment="bottom_right")}
    for name, fn in calls.items():
        for _ in range(5): fn()
        torch.cuda.synchronize()
        torch.cuda._sleep(200_000_000)
        t0 = time.perf_counter()
        for _ in range(100): fn()
        host = (time.perf_counter() - t0) * 1e4
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(100): fn()
        e1.record(); e1.synchronize()
        print(f"batch {batch} len {length} {name}: host {host:.1f} us/call, back to back {e0.elapsed_time(e1)*10:.1f} us/call")
