#!/usr/bin/env bash
# GPU run 62 (short): the tests decoding by heads touches with bucketed decode graphs on, transformers generation, the decode-length benchmark.
set -u
STRIDEDFA_DECODE_GRAPHS=bucketed PART=files LIMIT=240 FILES="test_decode_graphs.py test_sinks_decode.py test_paged.py test_flash_attn_interface.py test_varlen.py" bash ci/gpu_suite.sh
export PYTHONPATH=/tmp/sfa-files PYTHONUNBUFFERED=1
(cd tests/gpu && STRIDEDFA_DECODE_GRAPHS=bucketed timeout 80 python3 -m pytest -p no:cacheprovider -q -rfEs --tb=short test_transformers.py -k "generat or decod" -o cache_dir=/tmp/.c) > $OUT/transformers_gen.log 2>&1; echo "transformers gen rc $?"; tail -2 $OUT/transformers_gen.log; grep -E "^(FAILED|ERROR)" $OUT/transformers_gen.log | head
timeout 90 python3 benchmarks/bench_decode_lengths.py --out $OUT/decode --quick > $OUT/decode.log 2>&1; echo "decode bench rc $?"; grep -E "^\||graphs built" $OUT/decode.log | tail -14; tail -3 $OUT/decode.log
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/env.txt
cd $OUT && tar czf r.tgz --exclude=r.tgz . && ls
