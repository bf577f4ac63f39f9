#!/usr/bin/env bash
# The GPU figures of issues 23-28 in one go, on a machine with a CUDA GPU, PyTorch and this checkout, and
# without Ray, MLflow or Optuna (flcore alone). Each stage has its own time limit and writes to
# $OUT as it goes, so a stage that runs over still leaves the ones before it.
#
#   OUT=/tmp/gpu WHEELS=.whl FMNIST_GZ=.gpudata STAGES="1 2 3 4 5 6 7 8 9 10 11 12" bash benchmarks/gpu_session.sh
#   (stage 8 for the methods issue 23 still owes: T3_METHODS="ppsgd pfedhn" T3_ROUNDS="first 51 middle last")
#
# WHEELS: a folder of wheels to install first (pydantic, pydantic-core, annotated-types,
#   typing-inspection, typing-extensions, opacus, dp-accounting, dm-tree where absent);
# FMNIST_GZ: a folder holding Fashion-MNIST's four .gz files, copied where flcore looks for
#   Debian's dataset-fashion-mnist.
# Stages run in this file's order (1, 9, 2, 3, 4, 6, 10, 11, 12, 5, 7, 8): the long runs last, in the
# time left.
# A GPU machine is lent for 15 minutes a session: pick a few stages (issue order), not all.
set -u
OUT=${OUT:-/tmp/fedsweep-gpu}
mkdir -p "$OUT"
if [ -n "${WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$WHEELS"/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if [ -n "${FMNIST_GZ:-}" ]; then
  mkdir -p /usr/share/datasets/fashion-mnist && cp "$FMNIST_GZ"/*.gz /usr/share/datasets/fashion-mnist/
fi
export FEDSWEEP_DATA_ROOT=${FEDSWEEP_DATA_ROOT:-/tmp/fedsweep-data}
# the records of runs that end here (benchmarks/_runs.py) come back in results.tgz, records/<kind>/;
# gpu_unpack.py copies them into benchmarks/records/ (the GPU machine named in them)
export FEDSWEEP_RECORDS="$OUT/records"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/nvidia-smi.txt" 2>&1
B=benchmarks/gpu_rounds.py
STAGES=${STAGES:-1 2 3 4}
stage() { [[ " $STAGES " == *" $1 "* ]]; }
# 1. per-round times: loop against vectorized (FedAvg 20/100), HyperFL and DP-FedAvg against FedAvg
#    (EXECUTORS="vectorized": the vectorized cases alone, stages 1 and 4)
EXECUTORS=${EXECUTORS:-loop vectorized}
stage 1 && timeout "${T_ROUNDS:-150}" python3 $B --parts rounds --rounds 2 --deterministic 0 --executors $EXECUTORS \
  --out "$OUT/rounds.json" > "$OUT/rounds.log" 2>&1
# 9. where a vectorized round's time goes (FedAvg, DP-FedAvg, HyperFL, 20 clients): device time in
#    kernels against the round's wall, kernel launches, the ops with the most device time
stage 9 && timeout "${T_PROFILE:-90}" python3 $B --parts profile --cases fedavg dp_fedavg hyperfl --clients 20 \
  --out "$OUT/profile.json" > "$OUT/profile.log" 2>&1
# 2. the memory cap and the chunk it leaves; trial packing (1, 4, 8 processes on the GPU)
stage 2 && timeout "${T_PACK:-80}" python3 $B --parts cap packing --out "$OUT/packing.json" > "$OUT/packing.log" 2>&1
# 3. the contract suite on CUDA
stage 3 && timeout "${T_TESTS:-100}" python3 -m pytest -q -m gpu tests/contract/test_cuda.py -p no:cacheprovider \
  -n 8 > "$OUT/pytest-gpu.log" 2>&1
# 4. what deterministic algorithms cost (stage 1 has the same cases without them), and
#    repeatability of the vectorized HyperFL with and without them
stage 4 && timeout "${T_DET:-150}" python3 $B --parts rounds repeatable --cases fedavg dp_fedavg hyperfl \
  --clients 20 --rounds 2 --deterministic 1 0 --executors $EXECUTORS --out "$OUT/deterministic.json" \
  > "$OUT/deterministic.log" 2>&1
# 6. Pa3dFL (its Table 1 Hetero config, every client every round): loop against vectorized
#    (every width zero-padded into one full-width stack since session 24), P6_CLIENTS (20 and 100)
stage 6 && timeout "${T_PA3DFL:-240}" python3 $B --parts rounds --cases pa3dfl --clients ${P6_CLIENTS:-20 100} --rounds 2 \
  --deterministic 0 --out "$OUT/pa3dfl.json" > "$OUT/pa3dfl.log" 2>&1
# 10. LoDMeta's image leakage under a stronger IG (issue 26: 10,000 iterations, HyperFL's
#     protocol, where the CPU could afford 1,000) at the walk's first visit, LoDMeta-basic (whose
#     step releases the exact meta-gradient) first, then LoDMeta; finished cases are skipped, so
#     carrying the JSON back in (LEAK_IN) resumes it
if stage 10; then
  [ -n "${LEAK_IN:-}" ] && cp "$LEAK_IN" "$OUT/lodmeta-leakage.json"
  timeout "${T_LEAK:-300}" python3 benchmarks/lodmeta_leakage.py --methods lodmeta_basic lodmeta --at first \
    --steps 300 --images 2 --iterations 10000 --set device=cuda --label gpu-10k \
    --out "$OUT/lodmeta-leakage.json" > "$OUT/lodmeta-leakage.log" 2>&1
fi
# Many small runs side by side, one process each (the GPU machine has 16 cores; a small model's
# round leaves the GPU mostly idle): each line of the file $1 is one run, a script and its
# arguments, at most JOBS (default 12) at a time, each stopped by T_END (its --max-minutes at
# a checkpoint every $3 rounds, then a hard timeout). The run folders, under $OUT/$2 and without
# checkpoints (a LoDMeta checkpoint holds every visited client's m and v: tens of MB), come
# back in results.tgz: metrics.jsonl, summary.json ("rounds": how far it got) and spent.json.
# Read them with the script's --summary --out DIR, never into the CPU queue's folders (there a
# folder without its checkpoint restarts from round 0). Each run's JSON: $OUT/$2-<n>.json.
# The list of runs stays beside them: $OUT/$2-jobs.txt. (SBS_DEVICE: another device, for a check on
# a CPU; L11_EXTRA, F12_EXTRA: more arguments.)
side_by_side() {
  local jobs=$1 dest=$2 every=$3 n=0 left line
  mkdir -p "$OUT/$dest"
  while IFS= read -r line; do
    n=$((n + 1))
    while [ "$(jobs -rp | wc -l)" -ge "${JOBS:-12}" ]; do wait -n; done
    left=$(( ${T_END:-570} - SECONDS - 40 ))
    [ "$left" -gt 90 ] || break
    # shellcheck disable=SC2086
    timeout "$left" python3 $line --workers 1 --device "${SBS_DEVICE:-cuda}" --out "$OUT/$dest" \
      --checkpoint-every "$every" --max-minutes "$(( (left - 40) / 60 ))" \
      > "$OUT/$dest-$n.json" 2> "$OUT/$dest-$n.log" &
  done < "$jobs"
  wait
  find "$OUT/$dest" -name 'checkpoint*.pt' -delete
}
# Measured in session 27 (BENCHMARKS.md, "Session 27 on an H100"): 18 such processes at once ran
# a LoDMeta step in ~1.1 s and a FedHKD-DP round in ~30 s, no faster than one CPU core (0.63 s,
# 20 s), and finished nothing in a call; stages 11 and 12 are for a machine with the cores to
# spare, and the CPU queue is where those runs belong.
# 11. LoDMeta's core comparison (issue 26, section 5 claims 1-3: FMNIST 5-way 5-shot, 3-regular
#     walk, 2,000 steps), L11_METHODS x L11_SEEDS (default: all six methods, seeds 0 1 2)
if stage 11; then
  for s11 in ${L11_SEEDS:-0 1 2}; do
    for m11 in ${L11_METHODS:-lodmeta lodmeta_basic lodmeta_sgd fedmaml fedalt l2c}; do
      echo "benchmarks/reproduce_lodmeta.py --settings ${L11_SETTING:-regular-5shot} --methods $m11 --seeds $s11 ${L11_EXTRA:-}"
    done
  done > "$OUT/lodmeta-jobs.txt"
  side_by_side "$OUT/lodmeta-jobs.txt" lodmeta 100
fi
# 12. FedHKD's runs still owed (issue 25): F12_SETTINGS x F12_METHODS x F12_SEEDS (default: the
#     baselines at beta 0.2 and 5, seed 0, fedhkd_dp included; 50 rounds each)
if stage 12; then
  for s12 in ${F12_SEEDS:-0}; do
    for g12 in ${F12_SETTINGS:-n10-b0.2 n10-b5}; do
      for m12 in ${F12_METHODS:-fedhkd_dp fedprox moon fedmd fedgen fedalign}; do
        echo "benchmarks/reproduce_fedhkd.py --settings $g12 --methods $m12 --seeds $s12 ${F12_EXTRA:-}"
      done
    done
  done > "$OUT/fedhkd-jobs.txt"
  side_by_side "$OUT/fedhkd-jobs.txt" fedhkd 5
fi
# 5. a long run in the time left (T_LONG, default: up to 570 s after the start): HyperFL's Table 1
#    at 100 clients, seed 2, vectorized; its per-round metrics come back, its checkpoints stay
if stage 5; then
  left=$(( ${T_END:-570} - SECONDS )); T_LONG=${T_LONG:-$left}
  if [ "$T_LONG" -gt 30 ]; then
    timeout "$T_LONG" python3 benchmarks/reproduce_table1.py --methods hyperfl --clients 100 --seeds 2 \
      --workers 1 --set device=cuda --set executor=vectorized --label gpu --keep --out /tmp/t1 \
      > "$OUT/table1.json" 2> "$OUT/table1.log"
    cp /tmp/t1/*/metrics.jsonl "$OUT/table1-metrics.jsonl"; cp /tmp/t1/*/spent.json "$OUT/table1-spent.json"
  fi
fi
# 7. Pa3dFL's Table 1 phase 1 (issue 24: Pa3dFL, FedAvg, FjORD, seed 0, 500 rounds) in the time
#    left, one process per run side by side (a round leaves the GPU idle much of the time:
#    session 24 measured 7.8 s a Pa3dFL round, evaluated every round, for one run alone, with
#    the launch-bound per-width stacks since replaced by one padded stack), P1_SETTINGS (default hetero) x P1_METHODS (default pa3dfl fedavg
#    fjord). Resumed from P1_IN (run folders an earlier session brought back, carried in; mind
#    the 64 MiB a call carries: the Ideal runs' checkpoints are the largest, so carry one
#    setting a session); the folders come back as pieces of an archive (the end of this script).
#    P1_EXTRA: more arguments, e.g. Table 3's ablations: P1_METHODS=pa3dfl P1_EXTRA="--ablation
#    flanc-dec" (one ablation a call: its runs share the stage's time). FjORD trains vectorized
#    since session 27 (1.08 s a round against the loop's 6.98 s on an H100).
if stage 7; then
  mkdir -p "$OUT/pa3dfl-t1"
  [ -n "${P1_IN:-}" ] && cp -r "$P1_IN"/. "$OUT/pa3dfl-t1/"
  left=$(( ${T_END:-570} - SECONDS ))
  if [ "$left" -gt 150 ]; then
    for s7 in ${P1_SETTINGS:-hetero}; do
      for m7 in ${P1_METHODS:-pa3dfl fedavg fjord}; do
        timeout "$(( left - 20 ))" python3 benchmarks/reproduce_pa3dfl_table1.py --methods "$m7" \
          --settings "$s7" --seeds 0 --workers 1 --device cuda --out "$OUT/pa3dfl-t1" \
          --checkpoint-every 5 --max-minutes "$(( (left - 100) / 60 ))" ${P1_EXTRA:-} \
          > "$OUT/pa3dfl-t1-$s7-$m7.json" 2> "$OUT/pa3dfl-t1-$s7-$m7.log" &
      done
    done
    wait
  fi
fi
# 8. HyperFL's Table 3 rerun (issue 23) for the methods T3_METHODS (default: hyperfl; ppsgd is its
#    paper protocol, run folder ppsgd-paper-protocol-20-s0, as reproduce_table3.py's RUNS): each
#    one's 20-client Table 1 run trained on the GPU (seed 0, the checkpoints IG attacks kept),
#    then IG (10,000 iterations, 10 records) at the rounds T3_ROUNDS (default: first and 51), one
#    JSON a round back in $OUT/table3 (reused when carried in T3_IN). T1_IN: Table 1 run folders
#    trained elsewhere (the CPU queue), carried in so that only the attack runs here; a finished
#    run needs checkpoint.pt, spent.json, metrics.jsonl and checkpoint-r50.pt, checkpoint-r99.pt
#    (round 200 is attacked from checkpoint.pt); each run's metrics.jsonl comes back
if stage 8; then
  mkdir -p "$OUT/table3" /tmp/t1-20
  [ -n "${T3_IN:-}" ] && cp -r "$T3_IN"/. "$OUT/table3/"
  [ -n "${T1_IN:-}" ] && cp -r "$T1_IN"/. /tmp/t1-20/
  for m in ${T3_METHODS:-hyperfl}; do
    left=$(( ${T_END:-570} - SECONDS ))
    [ "$left" -gt 120 ] || break
    case $m in
      ppsgd) t1=(--methods ppsgd --set algorithm_params.personal_dp=false --label paper-protocol) ;;
      *) t1=(--methods "$m") ;;
    esac
    timeout "$(( left - 10 ))" python3 benchmarks/reproduce_table1.py "${t1[@]}" --clients 20 --seeds 0 \
      --workers 1 --device cuda --keep 50 99 199 --out /tmp/t1-20 > "$OUT/table3-t1-$m.json" \
      2> "$OUT/table3-t1-$m.log"
    t1ok=$?
    for d in /tmp/t1-20/*/; do cp "$d/metrics.jsonl" "$OUT/table3-t1-$(basename "$d")-metrics.jsonl" 2>/dev/null; done
    [ "$t1ok" -eq 0 ] || continue
    left=$(( ${T_END:-570} - SECONDS ))
    [ "$left" -gt 30 ] || break
    timeout "$(( left - 10 ))" python3 benchmarks/reproduce_table3.py --methods "$m" --device cuda \
      --table1 /tmp/t1-20 --out "$OUT/table3" --attack-rounds ${T3_ROUNDS:-first 51} \
      > "$OUT/table3-$m.json" 2> "$OUT/table3-$m.log"
  done
fi
tail -n 3 "$OUT"/*.log
# A device call brings back at most 8 files of 16 MiB each (64 MiB in all), two folders down:
# everything but stage 7's run folders goes into results.tgz, those folders (checkpoints) into
# 15 MiB pieces pa3dfl-t1.tgz.NN. Unpack here with
#   tar xzf results.tgz -C DIR; cat pa3dfl-t1.tgz.* | tar xz -C DIR   (DIR/pa3dfl-t1: P1_IN)
# or, unpacking every archive of a call and handing stage 7's folders to the CPU queue where
# they are further along: python benchmarks/gpu_unpack.py FILES_AT --to DIR --merge QUEUE_DIR
cd "$OUT" || exit 1
if [ -d pa3dfl-t1 ]; then
  tar cz pa3dfl-t1 | split -b 15M -d - pa3dfl-t1.tgz. && rm -rf pa3dfl-t1
fi
# the archive is built outside OUT (it archives OUT), in a file of its own: two sessions at
# once (the tests run in parallel) must not share it
packed=$(mktemp /tmp/results.XXXXXX) || exit 1
tar czf "$packed" --exclude='pa3dfl-t1.tgz.*' . && find . -mindepth 1 -maxdepth 1 \
  ! -name 'pa3dfl-t1.tgz.*' -exec rm -rf {} + && mv "$packed" results.tgz
ls -la "$OUT"
exit 0
