#!/usr/bin/env bash
# The GPU check of Horovod with sparsecomm, in one call on a lent GPU machine (no network there):
# builds Horovod with NCCL for the machine's torch from the bundle (scripts/device/bundle.sh),
# trains with hvd.DistributedOptimizer and sparsecomm's compressors on cuda tensors, times the
# DDP hook's step and runs the CUDA op tests under compute-sanitizer (docs/install.md,
# "On a lent GPU").
#
#   bash scripts/device/run.sh              on the device, from the repository root, $OUT set
#   bash scripts/device/run.sh --rehearse   on a CPU machine (below)
#
# Steps, each timed, each allowed to fail without stopping the later ones; summary.txt in $OUT
# says PASS, FAIL or SKIP for each, with a detail:
#   bundle      pip install the bundle's wheels (--no-index; only what is missing)
#   sparsecomm  pip install --no-index --no-build-isolation --no-deps -e . with CUDA kernels for sm_90
#               (TORCH_CUDA_ARCH_LIST=9.0), in the background while Horovod builds
#   horovod     python -m sparsecomm.install_horovod from the bundled sdist: Gloo, no MPI,
#               NCCL from torch's nvidia-nccl-cu13 wheel (--gpu-operations NCCL)
#   hvd1        horovodrun -np 1: scripts/device/hvd_cuda.py on cuda tensors (NCCL)
#   hvd2        horovodrun -np 2 --gloo, both ranks on GPU 0 with cuda tensors. A NCCL build sends
#               cuda tensors through NCCL whatever the controller, and NCCL refuses two ranks on
#               one GPU: a failure that says so is recorded as that
#   hook        python -m sparsecomm.check.hook_step --device cuda (DDP hook vs DDP's allreduce)
#   syncs       scripts/device/syncs.py: DDP steps with the hook on the allgather route under
#               torch.cuda.set_sync_debug_mode("error"): a host synchronisation fails its method
#   sanitizer   compute-sanitizer --tool memcheck over the CUDA op tests (test_torch_select_ops.py,
#               test_torch_block_ops.py, test_torch_wire_ops.py, test_torch_bucket_ops.py,
#               test_torch_sampled_packs.py;
#               -k 'cuda and not emulated', less opcheck and the large tensor)
#   host        only when 210 s of the budget remain: Horovod rebuilt without GPU operations
#               (cuda tensors staged through host memory), then hvd2's run again: 2 ranks on
#               Gloo with cuda tensors on one GPU
# The whole script keeps to RUN_BUDGET_S (default 450 s): each step's limit is cut to what is
# left, and a step with under 20 s left is skipped. STEPS="horovod hvd1 ..." runs a subset.
#
# Files in $OUT (8 at most come back): summary.txt, run.log (the machine, each step's command),
# sparsecomm_build.log, horovod_build.log, hvd_cuda.log, hook_step.log, hook_step.json,
# sanitizer.log (syncs.py's lines go to run.log).
#
# --rehearse: the same steps on this CPU machine, in /tmp/sparsecomm-rehearse (REHEARSE_DIR):
# a fresh venv with this machine's python3 and torch 2.13.0 (the local CPU wheel; no other torch
# is ever installed), numpy and cmake from the registry; a copy of the working tree as the device
# gets it (git's tracked and unignored files) with a bundle for this Python in its .device/;
# Horovod built from the bundled sdist without NCCL; hvd2 on cpu tensors; the hook step on cpu
# with one timed step; hvd1, sanitizer and host are GPU-only ("skipped: no GPU").
set -uo pipefail

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
MODE=device
[ "${1:-}" = --rehearse ] && MODE=rehearse
START=$(date +%s)

if [ "$MODE" = rehearse ]; then
  R=${REHEARSE_DIR:-/tmp/sparsecomm-rehearse}
  OUT=${OUT:-$R/out}
  BUDGET=${RUN_BUDGET_S:-3600}
  SCALE=8  # each step's limit: 2 cores, not 16
  SCRATCH=$R/scratch
  rm -rf "$R/venv" "$R/repo" "$OUT" "$SCRATCH"
  mkdir -p "$R/repo" "$OUT" "$SCRATCH"
  {
    echo "[rehearse] a fresh venv: $(python3 --version), torch==2.13.0 (the local CPU wheel), numpy, cmake"
    python3 -m venv "$R/venv" && "$R/venv/bin/python" -m pip install -q torch==2.13.0 numpy cmake
  } >"$OUT/run.log" 2>&1 || { echo "[rehearse] the venv failed: $OUT/run.log"; exit 1; }
  echo "[rehearse] the working tree as the device gets it -> $R/repo" >>"$OUT/run.log"
  (cd "$SRC" && git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$R/repo" 2>/dev/null) || true
  bash "$SRC/scripts/device/bundle.sh" --python-version "$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')" \
    --dest "$R/repo/.device" >>"$OUT/run.log" 2>&1 || { echo "[rehearse] bundle.sh failed: $OUT/run.log"; exit 1; }
  PY=$R/venv/bin/python
  cd "$R/repo" || exit 1
else
  : "${OUT:?set OUT to the folder for the logs}"
  BUDGET=${RUN_BUDGET_S:-450}
  SCALE=1
  SCRATCH=/tmp/sparsecomm-device
  rm -rf "$SCRATCH"
  mkdir -p "$OUT" "$SCRATCH"
  PY=${DEVICE_PYTHON:-$(command -v python3 || echo /opt/torch/.venv/bin/python3)}
  cd "$SRC" || exit 1
  : >"$OUT/run.log"
fi
BUNDLE=$PWD/.device
STEPS=${STEPS:-bundle sparsecomm horovod hvd1 hvd2 hook syncs sanitizer host}
SUMMARY=$OUT/summary.txt
PATH="$(dirname "$PY"):$PATH"
MAX_JOBS=$(nproc)
export PATH PYTHONUNBUFFERED=1 MAX_JOBS
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
GPU=0
"$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null && GPU=1
if [ "$MODE" = device ]; then
  export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} SPARSECOMM_WITH_CUDA=1
fi

log() { echo "$*" | tee -a "$OUT/run.log"; }
elapsed() { echo $(($(date +%s) - START)); }
left() { echo $((START + BUDGET - $(date +%s))); }
wanted() { [[ " $STEPS " == *" $1 "* ]]; }

# record STEP STATUS SECONDS DETAIL: one line of summary.txt (a FAIL whose step was not run for
# want of time, RC 125, is a SKIP)
record() {
  [ "$2" = FAIL ] && [ "${RC:-}" = 125 ] && set -- "$1" SKIP "$3" "$4"
  printf '%-11s %-4s %6ss  %s\n' "$1" "$2" "$3" "$4" | tee -a "$SUMMARY" >>"$OUT/run.log"
}

# run_step CAP LOG COMMAND...: runs COMMAND (output appended to LOG) under a limit of CAP seconds
# (times SCALE) cut to what is left of the budget. Sets RC (124: timed out; 125: not run, out of
# time) and SECS.
run_step() {
  local cap=$(($1 * SCALE)) log=$2 budget_left
  shift 2
  budget_left=$(left)
  [ "$budget_left" -lt "$cap" ] && cap=$budget_left
  if [ "$cap" -lt 20 ]; then RC=125 SECS=0; return; fi
  log "  \$ $* (limit ${cap}s, at $(elapsed)s)"
  echo "\$ $*" >>"$log"
  local t0
  t0=$(date +%s.%N)
  timeout --kill-after=10 "$cap" "$@" >>"$log" 2>&1
  RC=$?
  SECS=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  echo "[exit $RC after ${SECS}s]" >>"$log"
}

# why RC: the detail for a step that did not pass
why() {
  case $1 in
  124 | 137) echo "timed out" ;;
  125) echo "skipped: out of time (budget ${BUDGET}s)" ;;
  *) echo "exit $1" ;;
  esac
}

# The machine, for the record.
{
  echo "== machine ($MODE)"
  echo "cores $(nproc); $(free -g | awk '/Mem:/ {print $2 " GiB memory"}'); $(uname -m)"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  echo "python $PY: $("$PY" --version 2>&1)"
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.is_available())' 2>&1
  echo "nvcc: $(nvcc --version 2>/dev/null | tail -1)"
  echo "cmake: $(cmake --version 2>/dev/null | head -1)"
  echo "compute-sanitizer: $(compute-sanitizer --version 2>/dev/null | tail -1)"
  ls -d "$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"/nvidia/nccl/include/nccl.h 2>&1
  echo "bundle: $(cd "$BUNDLE" && printf '%s ' *)"
  echo "steps: $STEPS; budget ${BUDGET}s"
} >>"$OUT/run.log" 2>&1
printf '%-11s %-4s %7s  %s\n' step stat time detail >"$SUMMARY"

# (a) the bundle: pip installs what is missing, upgrades nothing.
if wanted bundle; then
  log "== bundle"
  run_step 60 "$OUT/run.log" "$PY" -m pip install --no-index --find-links "$BUNDLE" \
    cffi pycparser cloudpickle psutil pyyaml packaging pytest wheel setuptools
  installed=$(grep -h "^Successfully installed" "$OUT/run.log" | tail -1 | cut -d' ' -f3-)
  if [ "$RC" = 0 ]; then record bundle PASS "$SECS" "installed: ${installed:-nothing (all present)}"
  else record bundle FAIL "$SECS" "$(why $RC) (run.log)"; fi
fi

# (b) sparsecomm's extension, in the background (its own log), while Horovod builds.
SC_PID=
if wanted sparsecomm; then
  log "== sparsecomm (background)"
  (
    run_step 300 "$OUT/sparsecomm_build.log" "$PY" -m pip install --no-index --no-build-isolation --no-deps -e .
    echo "$RC $SECS" >"$SCRATCH/sparsecomm.status"
  ) &
  SC_PID=$!
fi

# (c) Horovod with NCCL (CPU in a rehearsal) from the bundled sdist.
if wanted horovod; then
  log "== horovod"
  gpu_ops=NCCL
  [ "$GPU" = 1 ] || gpu_ops=auto
  run_step 330 "$OUT/run.log" "$PY" -m sparsecomm.install_horovod --sdist "$BUNDLE/horovod-0.28.1.tar.gz" \
    --find-links "$BUNDLE" --cache "$SCRATCH/horovod" --without-mpi --gpu-operations "$gpu_ops"
  cat "$SCRATCH"/horovod/wheels/*/build.log >"$OUT/horovod_build.log" 2>/dev/null
  built=$(grep -E '^\s+\[X\] (NCCL|Gloo|MPI|PyTorch)' "$OUT/run.log" | awk '{print $2}' | sort -u | tr '\n' ' ')
  if [ "$RC" = 0 ]; then record horovod PASS "$SECS" "check-build lists: $built(ops: $gpu_ops)"
  else
    said=$(grep '^\[install_horovod\] FAILED' "$OUT/run.log" | tail -1 | cut -c1-200)
    record horovod FAIL "$SECS" "$(why $RC); ${said:-see run.log} (horovod_build.log)"
  fi
fi

# Waits for (b) and records it, once; before the first step that imports sparsecomm.
finish_sparsecomm() {
  [ -n "$SC_PID" ] || return 0
  wait "$SC_PID"
  SC_PID=
  read -r RC SECS <"$SCRATCH/sparsecomm.status"
  local info
  info=$("$PY" -c 'import json; i = json.load(open("sparsecomm/_build_info.json"))["torch"]
print("CUDA kernels for %s" % i.get("cuda_arch_list") if i["cuda_kernels"] else "CPU kernels only")' 2>&1 | tail -1)
  if [ "$RC" = 0 ] && { [ "$MODE" = rehearse ] || [[ "$info" == "CUDA kernels"* ]]; }; then
    record sparsecomm PASS "$SECS" "$info"
  else record sparsecomm FAIL "$SECS" "$(why "$RC"); $info (sparsecomm_build.log)"; fi
}
wanted horovod && finish_sparsecomm  # else the first step that needs it waits (host's build overlaps it)

HOROVOD_OK=0
"$PY" -c 'import horovod.torch' 2>/dev/null && HOROVOD_OK=1

# hvd_step NAME LIMIT RANKS DEVICE HOROVODRUN-ARGS...: hvd_cuda.py under horovodrun; $NOTE,
# when set, ends the detail.
NOTE=
hvd_step() {
  local name=$1 cap=$2 ranks=$3 device=$4
  shift 4
  finish_sparsecomm
  log "== $name ($ranks rank(s), $device tensors)"
  echo "== $name" >>"$OUT/hvd_cuda.log"
  if [ "$HOROVOD_OK" != 1 ]; then record "$name" SKIP 0 "horovod.torch does not import (step horovod)"; return; fi
  NCCL_DEBUG=WARN run_step "$cap" "$OUT/hvd_cuda.log" horovodrun -np "$ranks" "$@" \
    "$PY" scripts/device/hvd_cuda.py --device "$device"
  local last tail_
  tail_=$(sed -n '/^== '"$name"'$/,$p' "$OUT/hvd_cuda.log")
  last=$(grep -o '\[hvd_cuda\] [0-9]* of [0-9]* configurations passed' <<<"$tail_" | tail -1 | cut -d' ' -f2-)
  if [ "$RC" = 0 ]; then
    record "$name" PASS "$SECS" "$device, $ranks rank(s): $last; $(grep -o 'built with {.*}' <<<"$tail_" | head -1)$NOTE"
  elif [ "$RC" = 125 ]; then
    record "$name" SKIP 0 "$(why "$RC")"
  elif grep -q -E "Duplicate GPU detected|invalid usage" <<<"$tail_"; then
    record "$name" FAIL "$SECS" "NCCL refused the ranks (cuda tensors go through NCCL in a NCCL build, --gloo or not): $(grep -m1 -o -E '(Duplicate GPU detected|[^:]*invalid usage)[^]]*' <<<"$tail_" | cut -c1-160)$NOTE"
  else
    local first
    first=$(grep -m1 -E '\[hvd_cuda\] FAIL|Error|error:' <<<"$tail_" | cut -c1-200)
    record "$name" FAIL "$SECS" "$(why "$RC"); ${last:-no configuration finished}; first: ${first:-see hvd_cuda.log}$NOTE"
  fi
}

# (d) hvd.DistributedOptimizer on cuda tensors: 1 rank over NCCL, 2 ranks on Gloo.
if wanted hvd1; then
  if [ "$GPU" = 1 ]; then hvd_step hvd1 90 1 cuda --gloo
  else record hvd1 SKIP 0 "skipped: no GPU (1 rank on NCCL)"; fi
fi
if wanted hvd2; then
  if [ "$GPU" = 1 ]; then hvd_step hvd2 90 2 cuda --gloo
  else hvd_step hvd2 300 2 cpu --gloo; fi
fi

# (e) the DDP hook's step against DDP's allreduce (one rank; NCCL on cuda).
if wanted hook; then
  finish_sparsecomm
  log "== hook step"
  if [ "$GPU" = 1 ]; then hook_args=(--device cuda --steps 10)
  else hook_args=(--device cpu --steps 1); fi
  run_step 150 "$OUT/hook_step.log" "$PY" -m sparsecomm.check.hook_step "${hook_args[@]}" --json "$OUT/hook_step.json"
  if [ "$RC" = 0 ]; then
    detail=$("$PY" - "$OUT/hook_step.json" <<'EOF' 2>&1
import json, sys
d = json.load(open(sys.argv[1]))
rows = [r for r in d["records"] if r["tensors"] == 161]
print(f"{d['device']}, 161 tensors: " + ", ".join(f"{r['method']} {r['step_ms']:.1f} ms ({r['vs_allreduce']:.2f}x)" for r in rows))
EOF
    )
    [ "$GPU" = 1 ] || detail="$detail (1 timed step: no GPU)"
    record hook PASS "$SECS" "$detail"
  else record hook FAIL "$SECS" "$(why $RC) (hook_step.log)"; fi
fi

# (e') the hook's host synchronisations: none on the allgather route, DDP's allreduce the control.
if wanted syncs; then
  finish_sparsecomm
  log "== host synchronisations"
  if [ "$GPU" = 1 ]; then syncs_device=cuda; else syncs_device=cpu; fi
  run_step 90 "$OUT/run.log" "$PY" scripts/device/syncs.py --device "$syncs_device"
  detail=$(grep -o '\[syncs\] [0-9]* of [0-9]* methods .*' "$OUT/run.log" | tail -1 | cut -d' ' -f2-)
  failed=$(grep -o '\[syncs\] [^:]*: .*FAIL: .*' "$OUT/run.log" | head -1 | cut -c9-200)
  if [ "$RC" = 0 ]; then record syncs PASS "$SECS" "${detail:-no summary line (run.log)}"
  else record syncs FAIL "$SECS" "$(why $RC); ${detail:-no summary}; first: ${failed:-see run.log}"; fi
fi

# (f) compute-sanitizer's memcheck over the CUDA op tests (no caching allocator, so that each
# tensor's bounds are an allocation's).
if wanted sanitizer; then
  if [ "$GPU" != 1 ]; then record sanitizer SKIP 0 "skipped: no GPU"
  else
    finish_sparsecomm
    log "== compute-sanitizer memcheck"
    sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    if [ ! -x "$sanitizer" ]; then record sanitizer SKIP 0 "no compute-sanitizer (PATH, /usr/local/cuda/bin)"
    else
      PYTORCH_NO_CUDA_MEMORY_CACHING=1 run_step 150 "$OUT/sanitizer.log" "$sanitizer" --tool memcheck \
        --error-exitcode 99 --print-limit 20 "$PY" -m pytest tests/ops/test_torch_select_ops.py \
        tests/ops/test_torch_block_ops.py tests/ops/test_torch_wire_ops.py tests/ops/test_torch_bucket_ops.py \
        tests/ops/test_torch_sampled_packs.py \
        -v -p no:cacheprovider -rf \
        -k "cuda and not emulated and not opcheck and not large_tensor"
      errors=$(grep -o 'ERROR SUMMARY: [0-9]* error' "$OUT/sanitizer.log" | tail -1)
      [ -n "$errors" ] || errors="no error summary; $(grep -c -E '^========= (Invalid|Program hit|Error)' "$OUT/sanitizer.log") error report(s) before the end"
      counts=$(grep -E '^=+ .*(passed|failed).* in ' "$OUT/sanitizer.log" | tail -1 | tr -d '=' | sed 's/^ *//')
      [ -n "$counts" ] || counts="$(grep -c ' PASSED' "$OUT/sanitizer.log") passed before the end"
      if [ "$RC" = 0 ]; then record sanitizer PASS "$SECS" "memcheck: $counts; $errors"
      else record sanitizer FAIL "$SECS" "$(why $RC); memcheck: $counts; $errors"; fi
    fi
  fi
fi

# (g) 2 ranks on Gloo with cuda tensors: a Horovod without GPU operations, if time allows.
if wanted host; then
  if [ "$GPU" != 1 ]; then record host SKIP 0 "skipped: no GPU"
  elif [ "$(left)" -lt 210 ]; then record host SKIP 0 "skipped: $(left)s of the budget left, 210s wanted (STEPS='bundle sparsecomm host' runs it alone)"
  else
    log "== host: Horovod without GPU operations"
    echo "== host: Horovod without GPU operations" >>"$OUT/horovod_build.log"
    run_step 240 "$OUT/run.log" "$PY" -m sparsecomm.install_horovod --sdist "$BUNDLE/horovod-0.28.1.tar.gz" \
      --find-links "$BUNDLE" --cache "$SCRATCH/horovod-host" --without-mpi --gpu-operations none
    cat "$SCRATCH"/horovod-host/wheels/*/build.log >>"$OUT/horovod_build.log" 2>/dev/null
    build_rc=$RC build_secs=$SECS
    finish_sparsecomm
    RC=$build_rc SECS=$build_secs
    if [ "$RC" != 0 ]; then record host FAIL "$SECS" "building Horovod without GPU operations: $(why $RC)"
    else
      HOROVOD_OK=0
      "$PY" -c 'import horovod.torch' 2>/dev/null && HOROVOD_OK=1
      NOTE=" (Horovod without GPU operations built in ${SECS}s)"
      hvd_step host 90 2 cuda --gloo
    fi
  fi
fi

finish_sparsecomm
log "== done in $(elapsed)s (budget ${BUDGET}s)"
echo "total $(elapsed)s of ${BUDGET}s ($MODE)" >>"$SUMMARY"
cat "$SUMMARY"
