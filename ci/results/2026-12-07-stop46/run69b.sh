#!/usr/bin/env bash
# GPU run 69, second call (~2.5 min): what run69.sh's limit cut -- the paged adapters (JAX's XLA
# scratch and CuPy's pool now hold the launch's scratch), torch.compile / CUDA graphs, JAX -- and the
# quirk test of sinks_with_one_query with decoding by heads off (its reproduction must reach cuDNN).
set -u
PART=files LIMIT=100 FILES="test_paged_adapters.py test_cudnn_quirks.py::test_sinks_with_one_query \
  test_torch_compile.py test_jax.py" bash ci/gpu_suite.sh
(cd "$OUT" && tar czf /tmp/b.tgz . && mv /tmp/b.tgz b.tgz && find . -type f ! -name b.tgz -delete)
