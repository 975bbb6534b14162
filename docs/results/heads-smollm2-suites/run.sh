# SmolLM2's synthetic-task heads against the HotpotQA heads (the preset) on the synthetic suites, same code, one machine
SYN=docs/results/gather-heads-smollm2/smollm2-synthetic.json
REAL=docs/results/heads-real-smollm2/smollm2-real.json
R=.venv/bin/reform
$R eval niah --methods "reform:heads=$SYN" --lengths 8k,16k,32k,64k,128k --depths 0,0.25,0.5,0.75,1 --samples 1 --seed 0 --out docs/results/heads-smollm2-suites/niah-grid-seed0-synthetic > docs/results/heads-smollm2-suites/niah-grid-seed0-synthetic.log 2>&1
$R eval niah --methods "reform:heads=$SYN,reform:heads=$REAL" --lengths 8k,16k,32k,64k,128k --depths 0,0.25,0.5,0.75,1 --samples 1 --seed 1 --out docs/results/heads-smollm2-suites/niah-grid-seed1 > docs/results/heads-smollm2-suites/niah-grid-seed1.log 2>&1
$R eval ruler --generator official --tasks vt --lengths 32k --samples 10 --seed 2 --methods "reform:heads=$SYN,reform:heads=$REAL" --out docs/results/heads-smollm2-suites/vt-seed2 > docs/results/heads-smollm2-suites/vt-seed2.log 2>&1
$R eval ruler --generator official --lengths 32k --samples 1 --seed 1 --methods "reform:heads=$SYN,reform:heads=$REAL" --out docs/results/heads-smollm2-suites/ruler13-seed1 > docs/results/heads-smollm2-suites/ruler13-seed1.log 2>&1
