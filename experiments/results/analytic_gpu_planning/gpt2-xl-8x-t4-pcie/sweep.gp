# Throughput against the per-device memory budget, one line per schedule family;
# the dashed verticals mark each family's smallest feasible budget.
# Written by pipefb_sweep: gnuplot sweep.gp
set datafile separator ','
set terminal pngcairo size 1100,650 noenhanced
set output 'sweep.png'
set title 'gpt2-xl width=1 input=128 classes=50257 on 8x-t4-pcie, batch 8 (analytic t4-16g)'
set xlabel 'memory budget per device (MiB)'
set ylabel 'throughput (samples/s)'
set logscale x 2
set key outside right top
set grid
set yrange [0:*]
set arrow from 4628.14, graph 0 to 4628.14, graph 1 nohead dashtype 2 linecolor 1
set arrow from 4473.87, graph 0 to 4473.87, graph 1 nohead dashtype 2 linecolor 2
set arrow from 4239.5, graph 0 to 4239.5, graph 1 nohead dashtype 2 linecolor 3
set arrow from 4235.59, graph 0 to 4235.59, graph 1 nohead dashtype 2 linecolor 4
set arrow from 5871.86, graph 0 to 5871.86, graph 1 nohead dashtype 2 linecolor 5
set arrow from 4753.09, graph 0 to 4753.09, graph 1 nohead dashtype 2 linecolor 6
set arrow from 6319.06, graph 0 to 6319.06, graph 1 nohead dashtype 2 linecolor 7
set arrow from 4238.71, graph 0 to 4238.71, graph 1 nohead dashtype 2 linecolor 8
set arrow from 4242.62, graph 0 to 4242.62, graph 1 nohead dashtype 2 linecolor 9
set arrow from 3847.85, graph 0 to 3847.85, graph 1 nohead dashtype 2 linecolor 10
set arrow from 3847.07, graph 0 to 3847.07, graph 1 nohead dashtype 2 linecolor 11
set arrow from 8398.07, graph 0 to 8398.07, graph 1 nohead dashtype 2 linecolor 12
plot \
  'sweep.csv' every ::1 using 3:(strcol(1) eq '1f1b-keep' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 1 pointtype 2 title '1f1b-keep (fits from 4.52 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq '1f1b-offload' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 2 pointtype 3 title '1f1b-offload (fits from 4.37 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'gpipe' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 3 pointtype 4 title 'gpipe (fits from 4.14 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq '1f1b' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 4 pointtype 5 title '1f1b (fits from 4.14 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'pipedream' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 5 pointtype 6 title 'pipedream (fits from 5.73 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'pipefb-sync' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 6 pointtype 7 title 'pipefb-sync (fits from 4.64 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'pipefb-async' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 7 pointtype 8 title 'pipefb-async (fits from 6.17 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'zb-h1' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 8 pointtype 9 title 'zb-h1 (fits from 4.14 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'zb-h2' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 9 pointtype 10 title 'zb-h2 (fits from 4.14 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'zbv' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 10 pointtype 11 title 'zbv (fits from 3.76 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'interleaved-1f1b' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 11 pointtype 12 title 'interleaved-1f1b (fits from 3.76 GiB)', \
  'sweep.csv' every ::1 using 3:(strcol(1) eq 'pipefb-zb' && $4 == 1 ? $11 : 1/0) with linespoints linecolor 12 pointtype 13 title 'pipefb-zb (fits from 8.20 GiB)'
