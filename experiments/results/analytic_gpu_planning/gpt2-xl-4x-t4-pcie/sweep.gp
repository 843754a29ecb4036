# Throughput against the per-device memory budget, one line per schedule family;
# the dashed verticals mark each family's smallest feasible budget.
# Written by pipefb_sweep: gnuplot sweep.gp
set datafile separator ','
set terminal pngcairo size 1100,650 noenhanced
set output 'sweep.png'
set title 'gpt2-xl width=1 input=128 classes=50257 on 4x-t4-pcie, batch 8 (analytic t4-16g)'
set xlabel 'memory budget per device (MiB)'
set ylabel 'throughput (samples/s)'
set logscale x 2
set key outside right top
set grid
set yrange [0:*]
set arrow from 7054.44, graph 0 to 7054.44, graph 1 nohead dashtype 2 linecolor 1
set arrow from 6963.29, graph 0 to 6963.29, graph 1 nohead dashtype 2 linecolor 2
set arrow from 6651.01, graph 0 to 6651.01, graph 1 nohead dashtype 2 linecolor 3
set arrow from 6653.35, graph 0 to 6653.35, graph 1 nohead dashtype 2 linecolor 4
set arrow from 8658.06, graph 0 to 8658.06, graph 1 nohead dashtype 2 linecolor 5
set arrow from 12973.9, graph 0 to 12973.9, graph 1 nohead dashtype 2 linecolor 6
plot \
  'sweep.csv' every ::1 using 3:(strcol(1) eq '1f1b-keep' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 1 pointtype 2 title '1f1b-keep (fits from 6.89 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq '1f1b-offload' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 2 pointtype 3 title '1f1b-offload (fits from 6.80 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq '1f1b' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 3 pointtype 4 title '1f1b (fits from 6.50 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'gpipe' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 4 pointtype 5 title 'gpipe (fits from 6.50 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'pipedream' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 5 pointtype 6 title 'pipedream (fits from 8.46 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'pipefb-sync' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 6 pointtype 7 title 'pipefb-sync (fits from 12.67 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'pipefb-async' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 7 pointtype 8 title 'pipefb-async (never fits)'
