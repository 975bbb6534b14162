#!/bin/bash
# The NIAH rows that the preset or the synthetic heads missed in bf16 (heads-chains-smollm2), answered
# again here in fp32. ESSAYS: a folder holding RULER's essays as essays.txt (heads-smollm2-suites shows how).
# The 64k essay row at 75 % (the synthetic heads' second miss) was not run: time.
set -e
ESSAYS=${ESSAYS:-/tmp/essays}
SYN=docs/results/gather-heads-smollm2/smollm2-synthetic.json
M="reform:heads=$SYN,reform"
O=${O:-/tmp/fp32}
reform eval niah --methods "$M" --lengths 16k,32k --depths 0.25 --samples 1 --seed 0 --out $O/s0
reform eval niah --methods "$M" --lengths 64k --depths 0.25 --samples 1 --seed 1 --out $O/s1
reform eval niah --methods "$M" --lengths 32k --depths 0.25 --samples 1 --seed 2 --haystack $ESSAYS --out $O/s2a
