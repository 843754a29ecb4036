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
set arrow from 8695.4, graph 0 to 8695.4, graph 1 nohead dashtype 2 linecolor 1
set arrow from 8557.63, graph 0 to 8557.63, graph 1 nohead dashtype 2 linecolor 2
set arrow from 8231.77, graph 0 to 8231.77, graph 1 nohead dashtype 2 linecolor 3
set arrow from 8224.73, graph 0 to 8224.73, graph 1 nohead dashtype 2 linecolor 4
set arrow from 10536.4, graph 0 to 10536.4, graph 1 nohead dashtype 2 linecolor 5
set arrow from 8974.69, graph 0 to 8974.69, graph 1 nohead dashtype 2 linecolor 6
set arrow from 12612, graph 0 to 12612, graph 1 nohead dashtype 2 linecolor 7
set arrow from 8228.64, graph 0 to 8228.64, graph 1 nohead dashtype 2 linecolor 8
set arrow from 8230.98, graph 0 to 8230.98, graph 1 nohead dashtype 2 linecolor 9
set arrow from 7519.06, graph 0 to 7519.06, graph 1 nohead dashtype 2 linecolor 10
set arrow from 7342.75, graph 0 to 7342.75, graph 1 nohead dashtype 2 linecolor 11
plot \
  'sweep.csv' every ::1 using 3:(strcol(1) eq '1f1b-keep' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 1 pointtype 2 title '1f1b-keep (fits from 8.49 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq '1f1b-offload' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 2 pointtype 3 title '1f1b-offload (fits from 8.36 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'gpipe' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 3 pointtype 4 title 'gpipe (fits from 8.04 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq '1f1b' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 4 pointtype 5 title '1f1b (fits from 8.03 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'pipedream' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 5 pointtype 6 title 'pipedream (fits from 10.29 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'pipefb-sync' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 6 pointtype 7 title 'pipefb-sync (fits from 8.76 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'pipefb-async' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 7 pointtype 8 title 'pipefb-async (fits from 12.32 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'zb-h1' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 8 pointtype 9 title 'zb-h1 (fits from 8.04 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'zb-h2' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 9 pointtype 10 title 'zb-h2 (fits from 8.04 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'zbv' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 10 pointtype 11 title 'zbv (fits from 7.34 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'interleaved-1f1b' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 11 pointtype 12 title 'interleaved-1f1b (fits from 7.17 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'pipefb-zb' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 12 pointtype 13 title 'pipefb-zb (never fits)'
