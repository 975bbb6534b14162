# The four sets of gap-marks-smollm2 and heads-second-draw-smollm2, for suite_heads_lab.py (run from
# scripts/labs): the preset (pool 113) and the synthetic heads (pool 129, the preset when issue 69 was filed),
# each as the paper joins the gathered runs and with " ...\n" between runs that are not contiguous.
U=../../docs/results/gather-heads-smollm2/union.json
P=2:q:2+6:k:2+15:v:1+18:v:1+5:v:2
S=5:v:2+3:k:2+12:v:1+18:v:2
SETS="preset=$P;preset-gaps=$P|gaps=1;synthetic=$S|pool_window=129;synthetic-gaps=$S|pool_window=129+gaps=1"
