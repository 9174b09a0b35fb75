#!/bin/sh
# The torchrun table of docs/beyond-one-machine.md: one run each, wall time with start-up.
#   sh docs/data/torchrun.sh
set -e
export OMP_NUM_THREADS=1
run="collapse gpt2 --init random --sequences 16 --tokens 32 --batch-size 4 -q --out ${OUT:-probe-reports/torchrun}"
/usr/bin/time -f "1 process: %e s" .venv/bin/python -m probe.cli $run
/usr/bin/time -f "2 processes: %e s" .venv/bin/torchrun --standalone --nproc-per-node 2 -m probe.cli $run
/usr/bin/time -f "4 processes: %e s" .venv/bin/torchrun --standalone --nproc-per-node 4 -m probe.cli $run
