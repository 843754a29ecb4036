# Throughput against the per-device memory budget, one line per schedule family;
# the dashed verticals mark each family's smallest feasible budget.
# Written by pipefb_sweep: gnuplot sweep.gp
set datafile separator ','
set terminal pngcairo size 1100,650 noenhanced
set output 'sweep.png'
set title 'vgg16 width=1 input=224 channels=3 classes=1000 on 8x-t4-pcie, batch 128 (analytic t4-16g)'
set xlabel 'memory budget per device (MiB)'
set ylabel 'throughput (samples/s)'
set logscale x 2
set key outside right top
set grid
set yrange [0:*]
set arrow from 2352.48, graph 0 to 2352.48, graph 1 nohead dashtype 2 linecolor 1
set arrow from 2352.48, graph 0 to 2352.48, graph 1 nohead dashtype 2 linecolor 2
set arrow from 2364.53, graph 0 to 2364.53, graph 1 nohead dashtype 2 linecolor 3
set arrow from 2352.48, graph 0 to 2352.48, graph 1 nohead dashtype 2 linecolor 4
set arrow from 2671.02, graph 0 to 2671.02, graph 1 nohead dashtype 2 linecolor 5
set arrow from 2352.92, graph 0 to 2352.92, graph 1 nohead dashtype 2 linecolor 6
set arrow from 2352.92, graph 0 to 2352.92, graph 1 nohead dashtype 2 linecolor 7
set arrow from 2352.48, graph 0 to 2352.48, graph 1 nohead dashtype 2 linecolor 8
set arrow from 2352.89, graph 0 to 2352.89, graph 1 nohead dashtype 2 linecolor 9
set arrow from 2385.8, graph 0 to 2385.8, graph 1 nohead dashtype 2 linecolor 10
set arrow from 2389.08, graph 0 to 2389.08, graph 1 nohead dashtype 2 linecolor 11
set arrow from 2353.81, graph 0 to 2353.81, graph 1 nohead dashtype 2 linecolor 12
plot \
  'sweep.csv' every ::1 using 3:(strcol(1) eq '1f1b-keep' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 1 pointtype 2 title '1f1b-keep (fits from 2.30 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq '1f1b-offload' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 2 pointtype 3 title '1f1b-offload (fits from 2.30 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'gpipe' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 3 pointtype 4 title 'gpipe (fits from 2.31 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq '1f1b' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 4 pointtype 5 title '1f1b (fits from 2.30 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'pipedream' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 5 pointtype 6 title 'pipedream (fits from 2.61 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'pipefb-sync' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 6 pointtype 7 title 'pipefb-sync (fits from 2.30 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'pipefb-async' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 7 pointtype 8 title 'pipefb-async (fits from 2.30 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'zb-h1' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 8 pointtype 9 title 'zb-h1 (fits from 2.30 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'zb-h2' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 9 pointtype 10 title 'zb-h2 (fits from 2.30 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'zbv' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 10 pointtype 11 title 'zbv (fits from 2.33 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'interleaved-1f1b' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 11 pointtype 12 title 'interleaved-1f1b (fits from 2.33 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'pipefb-zb' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 12 pointtype 13 title 'pipefb-zb (fits from 2.30 GiB)'
