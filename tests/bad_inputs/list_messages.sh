#!/bin/bash
# Usage: tests/bad_inputs/list_messages.sh [BUILD_DIR]
# Prints "| `case` | message |" for every bad-input case, the way BadInputsTest runs them.
SRC=$(cd "$(dirname "$0")/../.." && pwd); BIN=$(realpath "${1:-$SRC/build}"); W=$(mktemp -d)/case
for f in $SRC/tests/bad_inputs/*.yaml; do
  n=$(basename $f); rm -rf $W; mkdir -p $W
  sed "s|@SOURCE@|$SRC|g" $f > $W/$n
  args="--config $W/$n"; prog=pipefb_train
  while IFS= read -r line; do
    case "$line" in
      "# copy: "*) d=${line#\# copy: }; cp -r $SRC/tests/bad_inputs/data/$d $W/$d;;
      "# args: "*) a=${line#\# args: }; a=${a//@CASE@/$W/$n}; a=${a//@WORK@/$W}; args=${a//@DATA@/$SRC/tests/bad_inputs/data};;
      "# program: "*) prog=${line#\# program: };;
      "# expect: "*) ;;
      *) break;;
    esac
  done < $f
  msg=$(cd $W && $BIN/$prog $args 2>&1 | head -1)
  msg=${msg#*: error: }; msg=${msg//$W\//}; msg=${msg//$SRC\//}; msg=${msg//|/\\|}
  echo "| \`$n\` | $msg |"
done
rm -rf "$(dirname "$W")"
