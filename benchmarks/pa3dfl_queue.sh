#!/usr/bin/env bash
# The runs issue 24 (Pa3dFL's Table 1 and Table 3, Fashion-MNIST) still needs, in the issue's
# order, one at a time, each run's clients spread over WORKERS processes (default 2, one per core
# of a 2-core machine: the results do not depend on the worker count, flcore/executor.py), so
# that the first cells end as early as they can. Start it in the background, niced:
#
#     (setsid nohup nice -n 10 bash benchmarks/pa3dfl_queue.sh >> ~/pa3dfl-queue.log 2>&1 &)
#
# Every step is resumable: a run resumes from its last checkpoint under
# ~/.cache/fedsweep-runs/pa3dfl/ (every 5 rounds, and on SIGTERM) and a run that ended, there or
# on another machine (its record under benchmarks/records/pa3dfl/), is not run again. So after
# any interruption (a stop, a machine that was laid anew) start it again: it passes over what
# ended and goes on. A step that fails is logged with its exit status and the queue goes on.
# `bash benchmarks/pa3dfl_queue.sh --list` prints the steps.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
T1="$PY benchmarks/reproduce_pa3dfl_table1.py --workers ${WORKERS:-2}"

# 1. phase 1's missing cell: Pa3dFL, Ideal, 500 rounds (~30 s a round on both cores here), and
#    what Algorithm 1's selection does on its best state;
# 2. phase 2: Table 3's ablation with FLANC's decomposition (Hetero, 500 rounds), the same;
# 3. phase 3: the other methods at 200 rounds (labelled r200, never compared with the paper's
#    500), Hetero first, with the 10,000-iteration IG attack on Pa3dFL's round-1 upload, and
#    IG on FedAvg's and Pa3dFL's round-50 uploads (a trained model), and again at round 1 with
#    2,000 iterations (session 51's table, whose JSON was lost with its machine: not in the
#    committed record), before the Ideal ones;
# 4. phase 4: seeds 1-2 of phase 1 (whether Pa3dFL's Ideal miss is within seed noise);
# 5. then the labelled variants, diagnoses beyond the issue's runs (after them since session 55):
#    hn_lr 1.0 and Table 7's hn_lr 0.1 under the paper's plain HN step, which test the Ideal
#    cell's slow start (BENCHMARKS.md sessions 50 and 53), and Algorithm 2's p_min with the
#    step capped.
QUEUE=(
  "$T1 --methods pa3dfl --settings ideal --seeds 0"
  "$PY benchmarks/pa3dfl_selection.py --settings ideal --seeds 0"
  "$T1 --ablation flanc-dec --settings hetero --seeds 0"
  "$PY benchmarks/pa3dfl_selection.py --settings hetero --seeds 0 --ablation flanc-dec"
  "$T1 --methods local lg_fedavg fedrolex pfedgate --settings hetero --seeds 0 --rounds 200"
  "$T1 --methods heterofl --settings hetero --seeds 0 --rounds 200 --set model=pa3dfl_cnn_fmnist_sbn --label sbn"
  "$PY benchmarks/pa3dfl_leakage.py --methods pa3dfl --iterations 10000"
  "$PY benchmarks/pa3dfl_leakage.py --methods fedavg pa3dfl --iterations 2000 --round 50"
  "$PY benchmarks/pa3dfl_leakage.py --methods fedavg pa3dfl --iterations 2000"
  "$T1 --methods ditto pfedhn lg_fedavg local flanc tailorfl pfedgate heterofl fedrolex --settings ideal --seeds 0 --rounds 200"
  "$T1 --methods pa3dfl fjord fedavg --settings hetero ideal --seeds 1 2"
  "$T1 --methods pa3dfl --settings ideal --seeds 0 --set algorithm_params.hn_lr=1.0 --label hnlr1"
  "$T1 --methods pa3dfl --settings ideal --seeds 0 --set algorithm_params.hn_step=plain --label hnplain"
  "$T1 --methods pa3dfl --settings ideal --seeds 0 --set algorithm_params.rank_p_min=clients --set algorithm_params.step_scale_max=1 --label clients-cap1"
)

run_queue() {
  local step
  for step in "${QUEUE[@]}"; do
    echo "[$(date -u +%FT%TZ)] $step"
    bash -c "$step"
    echo "[$(date -u +%FT%TZ)] exit $? ($step)"
  done
  echo "[$(date -u +%FT%TZ)] queue done"
}

case "${1:-}" in
  "") run_queue ;;
  --list) printf '%s\n' "${QUEUE[@]}" ;;
  *) echo "usage: $0 [--list] (issue 24's remaining runs, one at a time)" >&2; exit 2 ;;
esac
