#!/bin/sh
# SPDX-License-Identifier: MIT
# Every test of a build RUNS times in a row, each stopping at its first
# failure, with a busy loop on one core beside them: the timing a loaded
# machine gives, which a test that waits on time instead of the event it
# checks does not survive. The campaigns (labelled soak) run LONG times.
#   repeat.sh BUILD RUNS LONG
set -eu
build=$1 runs=$2 long=$3
sh -c 'while :; do :; done' &
busy=$!
trap 'kill $busy' EXIT INT TERM
cd "$build"
status=0
ctest -j 2 --output-on-failure --repeat "until-fail:$runs" -LE soak || status=1
ctest -j 2 --output-on-failure --repeat "until-fail:$long" -L soak || status=1
exit $status
