# Gemma 3 270M's synthetic-task heads against the HotpotQA heads (the preset) on the synthetic suites, same code, one machine
D=docs/results/heads-suites-gemma
SYN=docs/results/gather-heads-gemma/gemma-synthetic.json
REAL=docs/results/heads-real-gemma/gemma-real.json
R=.venv/bin/reform
$R eval ruler --model gemma-3-270m --generator official --lengths 64k --samples 1 --seed 0 --methods "reform:heads=$SYN,reform:heads=$REAL" --out $D/ruler13-64k > $D/ruler13-64k.log 2>&1
$R eval niah --model gemma-3-270m --methods "reform:heads=$SYN,reform:heads=$REAL" --lengths 64k --depths 0,0.25,0.5,0.75,1 --samples 1 --seed 1 --out $D/niah-64k > $D/niah-64k.log 2>&1
