#!/usr/bin/env bash
# The runs issue 24 (Pa3dFL's Table 1 and Table 3, Fashion-MNIST) still needs, in the issue's
# order, split into two lanes for a 2-core machine (two one-process runs are its fastest layout,
# ../shared/ENVIRONMENT.md). Start each lane in the background, niced:
#
#     (setsid nohup nice -n 10 bash benchmarks/pa3dfl_queue.sh a >> ~/pa3dfl-a.log 2>&1 &)
#     (setsid nohup nice -n 10 bash benchmarks/pa3dfl_queue.sh b >> ~/pa3dfl-b.log 2>&1 &)
#
# Every step is resumable: a run resumes from its last checkpoint under
# ~/.cache/fedsweep-runs/pa3dfl/ (every 5 rounds) and a run that ended, there or on another
# machine (its record under benchmarks/records/pa3dfl/), is not run again. So after any
# interruption (a stop, a machine that was laid anew) start the same lanes again: they pass over
# what ended and go on. A step that fails is logged with its exit status and the lane goes on.
# `bash benchmarks/pa3dfl_queue.sh --list` prints both lanes' steps.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
T1="$PY benchmarks/reproduce_pa3dfl_table1.py --workers 1"

# lane a: phase 1's missing cell (Pa3dFL, Ideal, 500 rounds: ~60 s a round here) and Algorithm
# 1's selection analysis of it, then its labelled variants (hn_lr 1.0; Algorithm 2's p_min with
# the step capped), then phase 1's Ideal seeds 1-2.
LANE_A=(
  "$T1 --methods pa3dfl --settings ideal --seeds 0"
  "$PY benchmarks/pa3dfl_selection.py --settings ideal --seeds 0"
  "$T1 --methods pa3dfl --settings ideal --seeds 0 --set algorithm_params.hn_lr=1.0 --label hnlr1"
  "$T1 --methods pa3dfl --settings ideal --seeds 0 --set algorithm_params.rank_p_min=clients --set algorithm_params.step_scale_max=1 --label clients-cap1"
  "$T1 --methods pa3dfl fjord fedavg --settings ideal --seeds 1 2"
)

# lane b: phase 2 (Table 3's ablation with FLANC's decomposition, Hetero, 500 rounds) and its
# selection analysis; phase 3 (the other methods at 200 rounds, labelled r200 and never compared
# with the paper's 500: Hetero first, runs of about an hour each here), with the 10,000-iteration
# IG attack on Pa3dFL's round-1 upload between the settings; then phase 4's Hetero seeds 1-2.
LANE_B=(
  "$T1 --ablation flanc-dec --settings hetero --seeds 0"
  "$PY benchmarks/pa3dfl_selection.py --settings hetero --seeds 0 --ablation flanc-dec"
  "$T1 --methods local lg_fedavg fedrolex pfedgate --settings hetero --seeds 0 --rounds 200"
  "$T1 --methods heterofl --settings hetero --seeds 0 --rounds 200 --set model=pa3dfl_cnn_fmnist_sbn --label sbn"
  "$PY benchmarks/pa3dfl_leakage.py --methods pa3dfl --iterations 10000"
  "$T1 --methods ditto pfedhn lg_fedavg local flanc tailorfl pfedgate heterofl fedrolex --settings ideal --seeds 0 --rounds 200"
  "$T1 --methods pa3dfl fjord --settings hetero --seeds 1 2"
)

run_lane() {
  local name=$1
  shift
  local step
  for step in "$@"; do
    echo "[$(date -u +%FT%TZ)] lane $name: $step"
    bash -c "$step"
    echo "[$(date -u +%FT%TZ)] lane $name: exit $? ($step)"
  done
  echo "[$(date -u +%FT%TZ)] lane $name: done"
}

case "${1:-}" in
  a) run_lane a "${LANE_A[@]}" ;;
  b) run_lane b "${LANE_B[@]}" ;;
  --list) printf 'a: %s\n' "${LANE_A[@]}"; printf 'b: %s\n' "${LANE_B[@]}" ;;
  *) echo "usage: $0 a|b|--list (the two lanes of issue 24's remaining runs)" >&2; exit 2 ;;
esac
