#!/bin/bash
# Interleaved A/B of `dmover bench net` (memory-to-memory) on loopback.
for i in 1 2 3 4 5; do
  for v in A M; do
    ./dmover-$v bench net --rtt loopback --streams 4 --seconds 3 --repeats 1 \
      --zerocopy off,on --direction push,pull --iperf3 off --known-hosts ./kh-$v \
      --out ./out-$v-$i > ./log-$v-$i 2>&1
  done
done
echo finished
