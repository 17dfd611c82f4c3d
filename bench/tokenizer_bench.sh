#!/usr/bin/env bash
# Single-thread encode throughput: fsdp.c's tokenizer (build/bench/tokenizer_bench) against Hugging
# Face's tokenizers (tests/lib/tokenizers_oracle.js, the Rust library as a Node module) on the same
# text (the Brown corpus, 6.2 MB), the same chunks (of at least 64 KiB and of at least 1 KiB of whole
# lines), the same CPU core, interleaved ROUNDS times, for the real Llama 3 and Llama 2 tokenizer.json
# files. Writes bench/results/DATE-cpu-tokenizer.md.
#   bench/tokenizer_bench.sh [ROUNDS]        (after tools/fixtures.sh and a build in build/)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
fx=$(tools/fixtures.sh | tail -1)
text=$fx/brown.txt
repeats=3
core=${FSDP_BENCH_CORE:-0}
out=bench/results/$(date +%Y-%m-%d)-cpu-tokenizer.md
raw=$(mktemp)
export RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false UV_THREADPOOL_SIZE=1
for r in $(seq "$rounds"); do
  for chunk in 65536 1024; do
    for model in llama3 llama2; do
      tok=$fx/$model/tokenizer.json
      echo "$model $chunk fsdp.c $(taskset -c "$core" build/bench/tokenizer_bench "$tok" "$text" $chunk $repeats)" >> "$raw"
      echo "$model $chunk tokenizers $(taskset -c "$core" node tests/lib/tokenizers_oracle.js "$fx/node" "$tok" bench "$text" $chunk $repeats)" >> "$raw"
    done
  done
  echo "round $r of $rounds done" >&2
done
/usr/bin/python3 - "$raw" "$out" "$rounds" <<'PY'
import json, platform, statistics, subprocess, sys
raw, out, rounds = sys.argv[1], sys.argv[2], sys.argv[3]
rows = [l.split(" ", 3) for l in open(raw).read().splitlines()]
cpu = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")][0]
lines = ["# Tokenizer encode throughput, one thread: fsdp.c against Hugging Face tokenizers", "",
         "Machine: %s (%s), shared with other jobs while it ran: the two programs ran interleaved, "
         "%s rounds, on the same core (taskset), each encoding the whole text 3 times per round." % (cpu, platform.node(), rounds),
         "Text: the Brown corpus (tools/fixtures.sh, part-of-speech tags stripped), cut into chunks of whole lines "
         "of at least 64 KiB (95 chunks) or 1 KiB (about 6,000), one encode call per chunk, add_special_tokens off. tokenizers: @anush008/tokenizers "
         "0.6.0 (tokenizers 0.22.2), RAYON_NUM_THREADS=1, UV_THREADPOOL_SIZE=1.", "",
         "Command: `bench/tokenizer_bench.sh %s`" % rounds, "",
         "| tokenizer.json | chunks of | program | MB/s (median of all repeats) | best MB/s | tokens |",
         "|---|---|---|---|---|---|"]
for chunk in ("65536", "1024"):
    for model in ("llama3", "llama2"):
        for prog in ("fsdp.c", "tokenizers"):
            recs = [json.loads(r[3]) for r in rows if r[0] == model and r[1] == chunk and r[2] == prog]
            secs = [s for rec in recs for s in rec["seconds"]]
            mb = recs[0]["bytes"] / 1e6
            lines.append("| %s | %s B | %s | %.1f | %.1f | %d |" % (model, chunk, prog, mb / statistics.median(secs),
                                                                     mb / min(secs), recs[0]["tokens"]))
lines += ["", "Raw records (model, chunk bytes, program, JSON: bytes, chunks, seconds per repeat, tokens):", "", "```"]
lines += [" ".join(r) for r in rows] + ["```", ""]
open(out, "w").write("\n".join(lines))
print("\n".join(lines))
PY
rm -f "$raw"
