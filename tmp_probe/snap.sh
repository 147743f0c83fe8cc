#!/usr/bin/env bash
# snapshot = HEAD (+ _quantize.py from 4bf9150 while HEAD lacks it) + the listed working-tree files -> tmp_probe/snap.tar
set -e
cd /work/main
rm -rf /tmp/snap && mkdir -p /tmp/snap
git archive ${BASE:-HEAD} | tar x -C /tmp/snap
if [ ! -f /tmp/snap/src/mxkit/kernels/quantize_details/_quantize.py ] && grep -q "_quantize," /tmp/snap/src/mxkit/kernels/quantize.py; then
  git show 4bf9150:src/mxkit/kernels/quantize_details/_quantize.py > /tmp/snap/src/mxkit/kernels/quantize_details/_quantize.py
fi
for f in "$@"; do mkdir -p /tmp/snap/$(dirname $f); cp $f /tmp/snap/$f; done
tar cf tmp_probe/snap.tar -C /tmp/snap .
ls -la tmp_probe/snap.tar
