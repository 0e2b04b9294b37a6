#!/usr/bin/env bash
# GPU run 69, second call (~2.5 min): what run69.sh's limit cut -- the torch.compile / CUDA-graph,
# JAX (XLA's scratch now holds the launch's) and paged-adapter tests -- and the quirk test of
# sinks_with_one_query with decoding by heads off (its reproduction must reach cuDNN).
set -u
PART=files LIMIT=170 FILES="test_torch_compile.py test_jax.py test_paged_adapters.py test_cupy.py \
  test_cudnn_quirks.py::test_sinks_with_one_query" bash ci/gpu_suite.sh
(cd "$OUT" && tar czf /tmp/b.tgz . && mv /tmp/b.tgz b.tgz && find . -type f ! -name b.tgz -delete)
