#!/usr/bin/env bash
# Machine C (2-core Intel Xeon, AMX-BF16), one session, run back to back with nothing else running.
# before-blocked: the blocked path, which this CPU got by default before the AMX choice
# (REFORM_CPU_ATTENTION=blocked); the rest: the default (flash on AMX, eviction scores from the blocked
# pass over the last 128 queries), plus --profile fast and llama.cpp's prompt processing at 4k and 8k.
set -euo pipefail
cd "$(dirname "$0")"
R=../../../.venv/bin/reform
lscpu > lscpu.txt
step() { [ -f "$1/bench.json" ] || "${@:2}" --out "$1"; }     # resumable: a finished step is kept
step before-blocked env REFORM_CPU_ATTENTION=blocked $R bench --methods reform --lengths 16k,128k
step profile-16k $R bench --methods reform --lengths 16k --profile
step scaling-1m $R bench --methods reform --lengths 128k,1M
step after $R bench --methods reform,reform:profile=fast --lengths 4k,8k,16k,128k --peer llama.cpp
# llama.cpp rebuilt without its AMX kernels (the hint its crash row gives), then the peer rows again:
# CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
#   -DGGML_AVX512=ON -DGGML_AVX512_BF16=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_VBMI=ON"
#   pip install --force-reinstall --no-deps --no-cache-dir llama-cpp-python==0.3.36
step peer-no-amx $R bench --methods reform --lengths 4k,8k --peer llama.cpp
[ -f attention_kernel_throughput.txt ] || ../../../.venv/bin/python ../../../scripts/attention_kernel_throughput.py > attention_kernel_throughput.txt
# the fp32 AVX2 code path (machine A's), as a proxy on this CPU: PyTorch's, oneDNN's and MKL's kernels capped to AVX2
step avx2-capped-fp32 env ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 $R bench --methods reform --lengths 16k,32k --dtype float32
