#!/usr/bin/env bash
# Issue 35's GPU check in one call (a few minutes on one H100/H200), from the repository root:
#   1. where pip reaches PyPI, once:   bash benchmarks/kernel_gpu.sh fetch
#      puts the wheels of the packages the GPU image lacks (Captum) into .whl/ (git-ignored);
#   2. on the GPU machine, with .whl carried along:   bash benchmarks/kernel_gpu.sh [--quick]
#      installs whatever of them is missing there (no network needed), then prints
#      - benchmarks/kernel_gpu.py: the kernels' errors at two shapes and each variant's backward time against SDPA's
#        own float32 backward at the four attention shapes (exit 1 if an error bound is missed);
#      - python -m benchmarks.bench --device cuda --sizes gpu --methods gae_triton gae_triton2 gae_chunks saliency (ViT-B/16 batch 64,
#        BERT-base N=512 and 4096, the Llama-style decoder at 8k; the main job left out), with the performance targets.
# --quick: the errors, the two smaller shapes' times and the bench at ViT-B/16 and BERT N=512 only.
# 'profile': benchmarks/profile_gpu.py alone (where gae's time goes beside saliency's, host waits included).
# 'kernels' or 'bench' as the first argument runs that half alone (two calls, if one would outrun 10 minutes; the
# Triton compile cache does not outlive a machine, so the bench's half compiles again on a fresh one).
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS=("captum==0.9.0")
if [ "${1:-}" = fetch ]; then
  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 -d .whl "${WHEELS[@]}"
  exit
fi
missing=$(python3 -c '
import importlib.util
print(" ".join(m for m in ("captum", "triton", "transformers", "lightning", "torchmetrics", "scipy", "matplotlib",
                           "tensorboard") if importlib.util.find_spec(m) is None))')
if [ -n "$missing" ]; then
  echo "missing here: $missing; installing .whl/*.whl into /tmp/site"
  ls .whl/*.whl >/dev/null 2>&1 || { echo "no .whl/: run 'bash benchmarks/kernel_gpu.sh fetch' where pip works, carry .whl"; exit 2; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 2
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
part=all
case "${1:-}" in kernels|bench) part=$1; shift;; profile) exec python3 benchmarks/profile_gpu.py;; esac
status=0
if [ "$part" != bench ]; then
  TRITON_PRINT_AUTOTUNING=1 python3 benchmarks/kernel_gpu.py "$@" || status=1
fi
[ "$part" = kernels ] && exit $status
tokens=()
[ "${1:-}" = --quick ] && tokens=(--tokens 197 512)
python3 -m benchmarks.bench --device cuda \
  --sizes gpu --cases vit bert llama "${tokens[@]}" --methods gae_triton gae_triton2 gae_chunks saliency --repeats 3 --budget 20 \
  || status=1
exit $status
