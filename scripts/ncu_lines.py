#!/usr/bin/env python3
"""ncu_lines.py SOURCE.csv [TOP]: where a kernel's warps wait, by source line: the warp-state
samples of Nsight Compute's source page summed over each CUDA source line (a line's SASS
instructions together), the largest TOP (default 25) first, with each line's share. The CSV is
what this writes for one kernel launch of a build with -lineinfo:

  ncu --clock-control none -k regex:NAME --launch-skip N -c 1 --section WarpStateStats \\
      --section SourceCounters --page source --print-source cuda,sass --csv PROGRAM ARGS > F.csv

(ncu's own lines before the table are skipped.) A line's samples fall where its instructions
wait: a load's latency shows on the line that first uses the value."""
import collections
import csv
import sys


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 25
    samples = collections.Counter()
    cur, col = None, None
    with open(sys.argv[1], errors="replace") as f:
        for row in csv.reader(f):
            if len(row) == 2 and row[0] == "File Path":
                cur = row[1].rsplit("/", 1)[-1]
            elif row and row[0] == "Line No":
                names = [h for h in row if h.startswith("Warp Stall Sampling (All")]
                if not names:
                    sys.exit("%s: no 'Warp Stall Sampling (All Samples)' column: collect "
                             "--section SourceCounters" % sys.argv[1])
                col = row.index(names[0])
            elif col is not None and len(row) > col and row[0].isdigit():
                try:
                    n = int(row[col] or 0)
                except ValueError:
                    continue
                if n:
                    samples[(cur, int(row[0]), row[1].strip())] += n
    total = sum(samples.values())
    if not total:
        sys.exit("%s: no warp-state samples found" % sys.argv[1])
    print("%8s %6s  %s  (%d samples)" % ("samples", "share", "file:line  source", total))
    for (fname, line, src), n in samples.most_common(top):
        print("%8d %5.1f%%  %s:%d  %s" % (n, 100.0 * n / total, fname, line, src[:90]))


if __name__ == "__main__":
    main()
