# Throughput against the per-device memory budget, one line per schedule family;
# the dashed verticals mark each family's smallest feasible budget.
# Written by pipefb_sweep: gnuplot sweep.gp
set datafile separator ','
set terminal pngcairo size 1100,650 noenhanced
set output 'sweep.png'
set title 'gpt2-tiny width=1 input=64 classes=256 on 4x-cpu, batch 16 (analytic cpu)'
set xlabel 'memory budget per device (MiB)'
set ylabel 'throughput (samples/s)'
set logscale x 2
set key outside right top
set grid
set yrange [0:*]
set arrow from 9.52539, graph 0 to 9.52539, graph 1 nohead dashtype 2 linecolor 1
set arrow from 9.52539, graph 0 to 9.52539, graph 1 nohead dashtype 2 linecolor 2
set arrow from 7.15039, graph 0 to 7.15039, graph 1 nohead dashtype 2 linecolor 3
set arrow from 7.15039, graph 0 to 7.15039, graph 1 nohead dashtype 2 linecolor 4
set arrow from 8.66162, graph 0 to 8.66162, graph 1 nohead dashtype 2 linecolor 5
set arrow from 8.0293, graph 0 to 8.0293, graph 1 nohead dashtype 2 linecolor 6
set arrow from 8.91162, graph 0 to 8.91162, graph 1 nohead dashtype 2 linecolor 7
plot \
  'sweep.csv' every ::1 using 3:(strcol(1) eq '1f1b-keep' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 1 pointtype 2 title '1f1b-keep (fits from 9.53 MiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq '1f1b-offload' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 2 pointtype 3 title '1f1b-offload (fits from 9.53 MiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq '1f1b' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 3 pointtype 4 title '1f1b (fits from 7.15 MiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'gpipe' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 4 pointtype 5 title 'gpipe (fits from 7.15 MiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'pipedream' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 5 pointtype 6 title 'pipedream (fits from 8.66 MiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'pipefb-sync' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 6 pointtype 7 title 'pipefb-sync (fits from 8.03 MiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'pipefb-async' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 7 pointtype 8 title 'pipefb-async (fits from 8.91 MiB)'
