#!/bin/bash
# Files too large for one call of the lent GPU machine (a call carries at most 64 MiB, the repository
# included), split into parts of one call each: how the real GGUFs reached an H200 (docs/gpu.md, "The
# real models in bf16").
#
#   bash scripts/gpu_carry.sh FILE...          here: .carry1 .. .carryN (git-ignored), one per call
#   call k < N:  mkdir -p /tmp/carry && cp .carryK/part* /tmp/carry/          (carry: [".carryK"])
#   call N:      bash .carryN/unpack.sh /tmp/carry && export PYTHONPATH=/tmp/carry/site:$PWD/src; ...
#
# unpack.sh checks every part's sha256, joins and untars them into its folder and installs the wheels
# among the files into its site/ folder (without their dependencies: name each one needed).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: bash scripts/gpu_carry.sh FILE..." >&2; exit 2; }
root=$(git rev-parse --show-toplevel)
limit=$((64 * 1024 * 1024))
tree=$(cd "$root" && git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
part=$(( (limit - tree) * 97 / 100 - 65536 ))           # what is left beside the tree, with a margin
[ "$part" -gt 1000000 ] || { echo "the repository ($tree bytes) leaves no room under 64 MiB" >&2; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
args=()
for f in "$@"; do
  [ -f "$f" ] || { echo "no such file: $f" >&2; exit 2; }
  args+=(-C "$(cd "$(dirname "$f")" && pwd)" "$(basename "$f")")    # each file under its own name
done
tar -chf - "${args[@]}" | split -b "$part" -d -a 2 - "$tmp/part"
(cd "$tmp" && sha256sum part* > sums.txt)
n=$(ls "$tmp"/part* | wc -l)
rm -rf "$root"/.carry[0-9]*
k=0
for p in "$tmp"/part*; do
  k=$((k + 1)); mkdir -p "$root/.carry$k"; mv "$p" "$root/.carry$k/"
  grep -qx "/.carry$k/" "$root/.git/info/exclude" 2>/dev/null || echo "/.carry$k/" >> "$root/.git/info/exclude"
done
cp "$tmp/sums.txt" "$root/.carry$n/"
cat > "$root/.carry$n/unpack.sh" <<'UNPACK'
#!/bin/bash
# Join and check the parts copied into DEST by the earlier calls and this call's own, untar, install wheels.
set -euo pipefail
dest=${1:?usage: unpack.sh DEST}; here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$dest" && cp "$here"/part* "$dest"/
cd "$dest" && sha256sum -c --quiet "$here/sums.txt"
cat part* | tar -xf - && rm -f part*
if ls ./*.whl >/dev/null 2>&1; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$dest/site" ./*.whl; fi
ls -la "$dest"
UNPACK
echo "$n calls of up to $part bytes each beside a $tree-byte tree: .carry1 .. .carry$n"
