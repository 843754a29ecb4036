# Throughput against the per-device memory budget, one line per schedule family;
# the dashed verticals mark each family's smallest feasible budget.
# Written by pipefb_sweep: gnuplot sweep.gp
set datafile separator ','
set terminal pngcairo size 1100,650 noenhanced
set output 'sweep.png'
set title 'resnet50 width=0.25 input=32 channels=1 classes=10 on 4x-cpu, batch 32 (analytic cpu)'
set xlabel 'memory budget per device (MiB)'
set ylabel 'throughput (samples/s)'
set logscale x 2
set key outside right top
set grid
set yrange [0:*]
set arrow from 9.08789, graph 0 to 9.08789, graph 1 nohead dashtype 2 linecolor 1
set arrow from 8.99347, graph 0 to 8.99347, graph 1 nohead dashtype 2 linecolor 2
set arrow from 6.68761, graph 0 to 6.68761, graph 1 nohead dashtype 2 linecolor 3
set arrow from 6.73449, graph 0 to 6.73449, graph 1 nohead dashtype 2 linecolor 4
set arrow from 9.30621, graph 0 to 9.30621, graph 1 nohead dashtype 2 linecolor 5
set arrow from 11.2599, graph 0 to 11.2599, graph 1 nohead dashtype 2 linecolor 6
set arrow from 14.8634, graph 0 to 14.8634, graph 1 nohead dashtype 2 linecolor 7
plot \
  'sweep.csv' every ::1 using 3:(strcol(1) eq '1f1b-keep' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 1 pointtype 2 title '1f1b-keep (fits from 9.09 MiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq '1f1b-offload' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 2 pointtype 3 title '1f1b-offload (fits from 8.99 MiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq '1f1b' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 3 pointtype 4 title '1f1b (fits from 6.69 MiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'gpipe' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 4 pointtype 5 title 'gpipe (fits from 6.73 MiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'pipedream' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 5 pointtype 6 title 'pipedream (fits from 9.31 MiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'pipefb-sync' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 6 pointtype 7 title 'pipefb-sync (fits from 11.26 MiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'pipefb-async' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 7 pointtype 8 title 'pipefb-async (fits from 14.86 MiB)'
