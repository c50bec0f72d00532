# Helpers of gpu-kit/run.sh (sourced): time slices, results as JSON lines, the summary, and
# reading what each check left (gtest's console, metrics.jsonl, bench lines). Only bash,
# coreutils, grep, sed, awk and iconv: a minimal Debian root has no python.
export LC_ALL=C.UTF-8

# --- time: each part has a deadline; each command within it gets what is left ----------------
part_start() {  # NAME LIMIT_S
  PART=$1
  PART_END=$((SECONDS + $2))
  echo "== $PART (at most $2 s)"
}
part_left() { local l=$((PART_END - SECONDS)); echo $((l > 0 ? l : 0)); }
bench_slice() { local l; l=$(part_left); echo $((l < $1 ? l : $1)); }
part_timeout() {  # SECONDS CMD...: the command, killed at its slice (exit 124) or at once if none is left
  local s=$1; shift
  ((s >= 2)) || { echo "not run: the part's time was spent"; return 124; }
  timeout -k 5 "$s" "$@"
}

# --- results: one JSON object per line in $REC (default $RESULTS) -----------------------------
json_str() {  # TEXT -> a JSON string, valid UTF-8, at most 400 characters
  local s
  s=$(printf '%s' "$1" | iconv -c -f UTF-8 -t UTF-8 2>/dev/null | tr -d '\000-\010\013\014\016-\037')
  s=${s:0:400}
  s=${s//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\t'/\\t}
  s=${s//$'\n'/\\n}
  s=${s//$'\r'/}
  printf '"%s"' "$s"
}
record() {  # PART CHECK RESULT(pass|fail|skip) DETAIL [RAW_JSON_DATA]
  local line
  line="{\"part\":$(json_str "$1"),\"check\":$(json_str "$2"),\"result\":$(json_str "$3"),\"detail\":$(json_str "$4")"
  [[ -n "${5:-}" ]] && line+=",\"data\":$5"
  echo "$line}" >>"${REC:-$RESULTS}"
  printf '  %-5s %s: %s\n' "$3" "$2" "$(head -c 200 <<<"$4" | head -1)"
}
summary_counts() {
  awk '{ if (match($0, /"result":"[a-z]+"/)) n[substr($0, RSTART + 10, RLENGTH - 11)]++ }
       END { printf "%d pass, %d fail, %d skip", n["pass"], n["fail"], n["skip"] }' "$RESULTS"
}
# summary.json (every check), summary.md (a table of them) and logs.tar.gz, rewritten each time.
write_summary() {
  local counts; counts=$(summary_counts)
  {
    printf '{"kit":%s,"elapsed_s":%d,"steps":%d,"has_gpu":%d,"counts":%s,"checks":[\n' \
      "$(json_str "$(cat "$KIT/manifest/commit")")" $((SECONDS - T0)) "$STEPS" "${HAS_GPU:-0}" "$(json_str "$counts")"
    awk 'NR > 1 { printf ",\n" } { printf "%s", $0 } END { printf "\n" }' "$RESULTS"
    printf ']}\n'
  } >"$OUT/summary.json.tmp" && mv "$OUT/summary.json.tmp" "$OUT/summary.json"
  {
    echo "# atoll GPU kit: $(cat "$KIT/manifest/commit")"
    echo
    echo "$counts, $((SECONDS - T0)) s, ${STEPS} training steps per twin."
    echo
    echo "| part | check | result | detail |"
    echo "|---|---|---|---|"
    awk '
      function field(name,   re, s) {
        re = "\"" name "\":\"([^\"\\\\]|\\\\.)*\""
        if (!match($0, re)) return ""
        s = substr($0, RSTART + length(name) + 4, RLENGTH - length(name) - 5)
        gsub(/\\n/, " ", s); gsub(/\\"/, "\"", s); gsub(/\\\\/, "\\", s); gsub(/\|/, "\\|", s)
        return s
      }
      { printf "| %s | %s | %s | %s |\n", field("part"), field("check"), field("result"), field("detail") }' "$RESULTS"
  } >"$OUT/summary.md"
  tar -C "$WORK" -czf "$OUT/logs.tar.gz.tmp" logs results.jsonl 2>/dev/null && mv "$OUT/logs.tar.gz.tmp" "$OUT/logs.tar.gz"
}

# --- the machine -------------------------------------------------------------------------------
version_ge() { [[ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -1)" == "$2" ]]; }
host_has_glibcxx() {  # VERSION: the host's libstdc++ provides GLIBCXX_VERSION
  local lib
  lib=$( (ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null) | awk '/libstdc\+\+\.so\.6 .*x86-64/ { print $NF; exit }')
  [[ -n "$lib" && -r "$lib" ]] && grep -qa "GLIBCXX_$1" "$lib"
}
# The folders that hold the CUDA libraries the kit's binaries need (manifest/cuda_needed): the
# toolkit's usual places first, then PyTorch's nvidia-* wheels, then a bounded search.
find_cuda_lib_dirs() {
  local dirs=() soname d found
  local places=(/usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib /usr/local/nvidia/lib64)
  for d in /usr/lib/python3*/site-packages/nvidia/*/lib /usr/local/lib/python3*/dist-packages/nvidia/*/lib \
           /opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib /opt/*/lib/python3*/site-packages/nvidia/*/lib; do
    [[ -d "$d" ]] && places+=("$d")
  done
  while read -r soname; do
    [[ -z "$soname" ]] && continue
    found=""
    for d in "${places[@]}"; do [[ -e "$d/$soname" ]] && { found=$d; break; }; done
    [[ -z "$found" ]] && found=$(timeout 20 find /usr /opt -xdev -name "$soname" 2>/dev/null | head -1 | xargs -r dirname)
    [[ -n "$found" && " ${dirs[*]} " != *" $found "* ]] && dirs+=("$found")
  done <"$KIT/manifest/cuda_needed"
  local IFS=:
  echo "${dirs[*]}"
}

# --- reading what the checks left -------------------------------------------------------------
# gtest's console output (stdin) -> one record per test: pass, fail with the message, skip with
# the reason; a test that started and never ended was killed (its slice) or crashed.
gtest_results() {  # BINARY_NAME EXIT_CODE
  local name=$1 rc=$2 test result msg n=0
  while IFS=$'\t' read -r test result msg; do
    n=$((n + 1))
    if [[ "$result" == open ]]; then
      if [[ $rc -eq 124 || $rc -eq 137 ]]; then msg="no result: the binary was stopped at its time limit (a hang?) ${msg}"
      else msg="no result: the binary ended with exit $rc (a crash?) ${msg}"; fi
      result=fail
    fi
    record tests "$name.$test" "$result" "$msg"
  done < <(awk '
    /^\[ RUN      \] / { cur = $4; msg = ""; grab = 0; next }
    cur != "" && /: Failure$/ { grab = 2; next }
    cur != "" && /: Skipped$/ { grab = 1; next }
    grab > 0 && NF > 0 { msg = msg (msg == "" ? "" : " / ") $0; grab--; next }
    /^\[       OK \] / && $4 == cur { print cur "\tpass\t"; cur = ""; next }
    /^\[  FAILED  \] / && $4 == cur { print cur "\tfail\t" msg; cur = ""; next }
    /^\[  SKIPPED \] / && $4 == cur { print cur "\tskip\t" msg; cur = ""; next }
    { last = $0 }
    END { if (cur != "") print cur "\topen\t" last }')
  if ((n == 0)); then  # nothing ran: the binary did not load, or had no tests
    record tests "$name" fail "exit $rc before any test: $(head -3 "$LOGS/tests/$name.log" | tr '\n' ' ')"
  fi
}

# step -> loss of a metrics.jsonl, "step loss" per line (rows of rank 0 of island 0 or no island)
losses_of() {
  awk '{ s = ""; l = ""
         if (match($0, /"step":[0-9]+/)) s = substr($0, RSTART + 7, RLENGTH - 7)
         if (match($0, /"loss":[-0-9.eE+]+/)) l = substr($0, RSTART + 7, RLENGTH - 7)
         if (s != "" && l != "") print s, l }' "$1" 2>/dev/null
}
# The CPU run of a twin, and the GPU run against it. Bounds per logged loss, relative: fp32 1e-3
# (tests/backend_cuda/island_cuda_test.cpp: the fp32 step on the GPU tracks the CPU's to ~1e-6 per
# step, and 1e-3 leaves room for the drift of many steps); bf16 2e-2 (device_model_bf16_test.cpp
# holds 30 bf16 steps within 1e-2 of the CPU, whose own bf16 mode rounds q, k, v and the
# probabilities that the GPU keeps in fp32: twice that for 50 steps).
twin_result() {  # NAME(config-precision) HAS_GPU
  local t=$1 cpu=$WORK/runs/$1-cpu/metrics.jsonl gpu=$WORK/runs/$1-cuda/metrics.jsonl
  local prec=${t##*-} bound rc line
  [[ $prec == fp32 ]] && bound=1e-3 || bound=2e-2
  rc=$(cat "$WORK/runs/$t-cpu.rc" 2>/dev/null || echo "?")
  line=$(losses_of "$cpu" | awk 'NR == 1 { f = $2 } { l = $2; n++ } END { if (n) printf "loss %.4f -> %.4f over %d steps", f, l, n }')
  if [[ $rc == 0 && -n "$line" ]]; then
    record twins "cpu $t" pass "$line"
  else
    record twins "cpu $t" fail "exit $rc: $(tail -1 "$LOGS/runs/$t-cpu.log" 2>/dev/null)"
  fi
  if (($2 == 0)); then
    record twins "cuda $t" skip "no CUDA device; the CPU twin: ${line:-no losses}"
    return
  fi
  rc=$(cat "$WORK/runs/$t-cuda.rc" 2>/dev/null || echo "?")
  if [[ $rc != 0 ]]; then
    record twins "cuda $t" fail "exit $rc: $(tail -1 "$LOGS/runs/$t-cuda.log" 2>/dev/null)"
    return
  fi
  local cmp
  cmp=$(join <(losses_of "$cpu" | sort -k1,1) <(losses_of "$gpu" | sort -k1,1) | sort -n | awk -v b="$bound" '
    { d = $3 - $2; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2); n++
      if (r > worst) { worst = r; at = $1 } if (r > b) bad++ }
    END { printf "%d %d %.3g %s", n, bad, worst, at }')
  read -r n bad worst at <<<"$cmp"
  local detail="$n steps compared, max relative difference $worst (step ${at:-none}), bound $bound; cpu $line"
  if ((n >= STEPS && bad == 0)); then record twins "cuda $t" pass "$detail"; else record twins "cuda $t" fail "$detail"; fi
}
# Two islands through `atoll launch`: exit 0, and one θ hash per outer step across the islands.
islands_result() {  # EXIT_CODE DEVICE METRICS
  local REC=$WORK/islands.jsonl stats
  stats=$(awk '{ if (match($0, /"theta_hash":"[0-9a-f]+"/)) { h = substr($0, RSTART + 14, RLENGTH - 15)
                  if (match($0, /"outer_step":[0-9]+/)) { o = substr($0, RSTART + 13, RLENGTH - 13); k = o SUBSEP h
                    if (!(k in seen)) { seen[k] = 1; n[o]++ } } } }
               END { for (o in n) { steps++; if (n[o] > 1) split_++ } printf "%d %d", steps, split_ }' "$3" 2>/dev/null)
  read -r steps split <<<"${stats:-0 0}"
  local detail="2 islands on $2, exit $1: $steps outer steps, $split with differing θ hashes"
  if [[ $1 == 0 && $steps -ge 4 && $split == 0 ]]; then record islands "launch 2 islands ($2)" pass "$detail"
  else record islands "launch 2 islands ($2)" fail "$detail; $(tail -1 "$LOGS/runs/islands.log" 2>/dev/null)"; fi
}
# A benchmark's JSON line (the last line starting with PREFIX) as the record's data.
declare -A BENCH_TOKS
bench_result() {  # NAME EXIT_CODE LOG PREFIX_REGEX
  local json
  json=$(grep -E "$4" "$3" 2>/dev/null | tail -1 | sed -E 's/^RESULT //')
  if [[ $2 != 0 || -z "$json" ]]; then
    record bench "$1" fail "exit $2: $(grep -v '^step ' "$3" 2>/dev/null | tail -2 | tr '\n' ' ')"
    return
  fi
  local tps mfu mem
  tps=$(grep -oE '"tokens_per_s":[-0-9.eE+]+' <<<"$json" | cut -d: -f2)
  mfu=$(grep -oE '"mfu":[-0-9.eE+]+' <<<"$json" | cut -d: -f2)
  mem=$(grep -oE '"(device_mib|peak_device_mib)":[-0-9.eE+]+' <<<"$json" | cut -d: -f2)
  BENCH_TOKS[$1]=$tps
  record bench "$1" pass "$(awk -v t="$tps" -v m="$mfu" -v g="$mem" \
    'BEGIN { printf "%.0f tokens/s, MFU %.1f%%, device memory %.0f MiB", t, 100 * m, g }')" "$json"
}
bench_ratios() {
  local cfg mode a p
  for cfg in small medium; do for mode in eager compile; do
    a=${BENCH_TOKS["atoll $cfg bf16"]:-}
    p=${BENCH_TOKS["pytorch $cfg bf16 $mode"]:-}
    [[ -n "$a" && -n "$p" ]] || continue
    record ratio "atoll bf16 / pytorch bf16 $mode, $cfg" pass "$(awk -v a="$a" -v p="$p" 'BEGIN { printf "%.2fx", a / p }')"
  done; done
}
