#!/usr/bin/env bash
# Makes docs/img/report-tiny.png, the picture on README.md: the loss and learning-rate charts of
# `atoll report` for a real run, rendered by headless Chromium (as tests/cli/report_test.cc
# renders the page).
#
#   scripts/readme_picture.sh [RUN_DIR]
#
# Without RUN_DIR it trains one first (into a temporary folder): configs/tiny.toml on 2 islands,
# 240 steps, H = 10, with island 1's worker killed (kill -9) at about step 100 so that the run
# has a restart and a rejoin in it (about 3 minutes on a quiet 2-core machine). The page itself
# is atoll's; only the screenshot's view leaves out what comes before the charts (the summary
# and the timeline), by a script added to a copy of the page.
set -euo pipefail
cd "$(dirname "$0")/.."
atoll=build/atoll
[[ -x $atoll ]] || { echo "readme_picture: no $atoll; fix: run scripts/setup.sh first" >&2; exit 1; }
command -v chromium >/dev/null || { echo "readme_picture: no chromium; fix: apt-get install chromium" >&2; exit 1; }
work=$(mktemp -d /tmp/atoll-readme-picture.XXXXXX)
trap 'rm -rf "$work"' EXIT
run=${1:-}
if [[ -z $run ]]; then
  run=$work/run
  $atoll launch --islands 2 --config configs/tiny.toml --set train.steps=240 --set diloco.inner_steps=10 \
    --set train.eval_every=40 --set fault.timeout_s=10 --run-dir "$run" >"$work/launch.log" 2>&1 &
  launcher=$!
  # Island 1's worker dies once the islands have logged 200 rows (step 100 of each).
  for _ in $(seq 1 7200); do
    rows=$(grep -c '"loss"' "$run/metrics.jsonl" 2>/dev/null || true)
    ((${rows:-0} >= 200)) && break
    kill -0 $launcher 2>/dev/null || break
    sleep 0.5
  done
  victim=$(pgrep -P $launcher -f "worker.*--island 1" | head -1 || true)
  [[ -n $victim ]] && kill -9 "$victim"
  wait $launcher || { tail -5 "$work/launch.log" >&2; exit 1; }
fi
$atoll report "$run" --out "$work/report.html"
# The view: drop the page's children before the "metrics" heading once the charts are drawn.
sed 's#</body>#<script>addEventListener("load",()=>setTimeout(()=>{const r=document.getElementById("report");const k=[...r.children];const i=k.findIndex(e=>e.tagName==="H2"\&\&e.textContent==="metrics");k.slice(0,i+1).forEach(e=>e.remove());},0))</script></body>#' \
  "$work/report.html" >"$work/view.html"
mkdir -p docs/img
timeout 120 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --virtual-time-budget=10000 \
  --window-size=1300,352 --screenshot="$PWD/docs/img/report-tiny.png" "file://$work/view.html" 2>/dev/null
echo "readme_picture: wrote docs/img/report-tiny.png ($(stat -c %s docs/img/report-tiny.png) bytes) from $run"
