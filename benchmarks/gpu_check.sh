#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py): SmolLM2-135M-Instruct bfloat16 engines on one CUDA GPU
# against Hugging Face generate with a static cache, specc's kernels against SDPA, then
# `pytest -m gpu`. Results and logs go to $OUT/gpu-check (or ./gpu-check-out without $OUT).
#
# The lent GPU machine has torch, transformers, triton and pytest but no network and no gguf
# package; a command carries at most 64 MiB (the checkout, ~13 MiB, included), and the SmolLM2
# GGUF is 98 MB. Everything that does not need the GPU is done beforehand, on a machine with the
# package index (a specc checkout with its venv):
#
#     bash benchmarks/gpu_check.sh prepare
#
# compiles the headline engines (none, prompt-lookup, eagle with lookup=true; inductor,
# bfloat16) here on the CPU -- an inductor engine compiles its kernels at load, on the device it
# is loaded on -- and packs them without their target weights (benchmarks/gpu_carry.py: a few
# MiB), encodes the 8 code and 8 chat prompts, downloads the wheels, and splits the GGUF into
# sha256-checked parts, leaving under .gpu_carry/ (git-ignored):
#   part1/      the GGUF's first bytes
#   part2/      the rest, the wheels, the packed engines and the prompt ids
# each, with the checkout, at most 64 MiB (CALL_LIMIT bytes).
# Then, on the GPU machine, back to back (files outside the checkout survive between calls only
# while the machine stays up, about 30 s idle):
#
#     1. bash benchmarks/gpu_check.sh stash      carry: .gpu_carry/part1
#        (seconds: the machine's versions, part 1 kept in /tmp/specc-gpu, and the kernels
#        benchmark started in the background, KERNELS_BUDGET=90 s)
#     2. bash benchmarks/gpu_check.sh headline   carry: .gpu_carry/part2
#        (joins and checks the GGUF, converts it, rebuilds the engines' weights byte for byte,
#        benchmarks them against HF generate's static cache, BUDGET=330 s; copies the kernels
#        results in; if the engines do not rebuild, compiles none and prompt-lookup there)
#     3. bash benchmarks/gpu_check.sh smollm2    (CHECK_GROUPS, e.g. aoti or kernels; BUDGET=500 s)
#        bash benchmarks/gpu_check.sh tests      (pytest -m gpu, SELECT as its -k expression)
#
# `CHECK_DEVICE=cpu` rehearses the smollm2 and headline stages on a CPU (PROMPTS, NEW_TOKENS and
# REPEATS shorten the headline's benchmark); SPECC_GPU_CARRY and SPECC_GPU_KEEP move .gpu_carry
# and /tmp/specc-gpu, and SPECC_GPU_ENGINE_NAMES names the packed engines. With the device tool:
# run(command="bash benchmarks/gpu_check.sh stash", carry=[".gpu_carry/part1"], timeout_s=120), then at
# once run(command="BUDGET=330 bash benchmarks/gpu_check.sh headline", carry=[".gpu_carry/part2"],
# timeout_s=480), then, with what the loan has left and again at once (part 2 and the unpacked
# wheels stay on the machine while it is up), the tests that have not passed on a GPU yet:
# run(command="BUDGET=N SELECT='aoti or kernels or trained_method_in_bfloat16 or compiled_for_the_cpu
# or too_large or none_engine_on_cuda' bash benchmarks/gpu_check.sh tests"), and in a later loan
# `CHECK_GROUPS=kernels,aoti bash benchmarks/gpu_check.sh smollm2` (after stash and headline).
set -euo pipefail
cd "$(dirname "$0")/.."

KEEP=${SPECC_GPU_KEEP:-/tmp/specc-gpu}
OUT_DIR=${OUT:-$PWD/gpu-check-out}/gpu-check
CARRY=${SPECC_GPU_CARRY:-.gpu_carry}
MODEL=SmolLM2-135M-Instruct.Q4_1.gguf
if ! command -v python > /dev/null; then   # the GPU image names its interpreter python3 only
    mkdir -p /tmp/specc-bin && ln -sf "$(command -v python3)" /tmp/specc-bin/python && export PATH="/tmp/specc-bin:$PATH"
fi
read -ra HEADLINE_ENGINES <<< "${SPECC_GPU_ENGINE_NAMES:-none-inductor prompt-lookup-inductor eagle+lookup-inductor}"

install_wheels() {
    if [ -d "$CARRY/part2/wheels" ]; then
        # pure-Python wheels unpacked onto the path: no pip or network needed; their .dist-info
        # carries the entry point that registers prompt-lookup
        python -c "import glob, zipfile; [zipfile.ZipFile(w).extractall('.gpu_site') for w in glob.glob('$CARRY/part2/wheels/*.whl')]"
        # the checkout's code first: the wheels may be older than the working tree
        export PYTHONPATH="$PWD:$PWD/examples/prompt_lookup:$PWD/.gpu_site${PYTHONPATH:+:$PYTHONPATH}"
    fi
    mkdir -p "$OUT_DIR"
    { nvidia-smi || true; python -c "import torch, transformers, triton; print('torch', torch.__version__,
'transformers', transformers.__version__, 'triton', triton.__version__, 'cuda', torch.cuda.is_available())" || true; } > "$OUT_DIR/machine.txt" 2>&1
}

split_model() {   # the file $1 as part1/ (its first $2 bytes, default half) and part2/ (the rest), sha256-checked
    local model
    model=$(realpath "$1")
    mkdir -p "$CARRY/part1" "$CARRY/part2"
    split -b "${2:-$(( ($(stat -c %s "$model") + 1) / 2 ))}" -d -a 1 "$model" "$CARRY/model."
    [ -f "$CARRY/model.1" ] || : > "$CARRY/model.1"
    mv "$CARRY/model.0" "$CARRY/part1/model.gguf.0" && mv "$CARRY/model.1" "$CARRY/part2/model.gguf.1"
    (cd "$CARRY" && sha256sum part1/model.gguf.0 part2/model.gguf.1 > parts.sha256 && sha256sum "$model" | cut -d' ' -f1 > whole.sha256)
    cp "$CARRY/parts.sha256" "$CARRY/whole.sha256" "$CARRY/part1/" && cp "$CARRY/whole.sha256" "$CARRY/part2/"
}

part1_bytes() {   # how much of the model $1 goes with call 1 so that each call carries at most CALL_LIMIT
    local checkout extras room_per_call part1
    checkout=$(git ls-files -co --exclude-standard -z | xargs -0 stat -c %s | awk '{s += $1} END {print s}')
    extras=$(du -sb "$CARRY/part2" | cut -f1)
    room_per_call=$(( ${CALL_LIMIT:-67108864} - checkout - 262144 ))   # 64 MiB less the checkout and a margin
    part1=$(( $(stat -c %s "$1") - (room_per_call - extras) ))
    if [ "$part1" -gt "$room_per_call" ]; then
        echo "gpu_check: the model and part 2's $extras bytes do not fit two calls of $room_per_call bytes each" >&2
        return 1
    fi
    echo $(( part1 > 0 ? part1 : 1 ))
}

join_model() {   # part1 (kept by `stash`) and part2 (carried now) as $KEEP/$MODEL, checked
    [ -f "$KEEP/$MODEL" ] && return 0
    cp "$CARRY"/part2/model.gguf.1 "$KEEP/"
    (cd "$KEEP" && mkdir -p part1 part2 && cp model.gguf.0 part1/ && cp model.gguf.1 part2/ && sha256sum -c parts.sha256)
    cat "$KEEP/model.gguf.0" "$KEEP/model.gguf.1" > "$KEEP/$MODEL.partial"
    echo "$(cat "$KEEP/whole.sha256")  $KEEP/$MODEL.partial" | sha256sum -c
    mv "$KEEP/$MODEL.partial" "$KEEP/$MODEL"
}

start_kernels_bench() {   # in a session of its own (it outlives the call), from a copy of the code (the next call
    # replaces the checkout); `done` holds its exit status once it ends
    mkdir -p "$KEEP/kernels" "$KEEP/code"
    cp -r specc benchmarks "$KEEP/code/"
    KEEP="$KEEP" setsid nohup bash -c 'cd "$KEEP/code" && PYTHONPATH="$KEEP/code" timeout "$0" \
        python benchmarks/kernels_bench.py --quick --out "$KEEP/kernels" > "$KEEP/kernels/kernels-bench.log" 2>&1;
        echo "rc $?" > "$KEEP/kernels/done"' "${KERNELS_BUDGET:-90}" < /dev/null > /dev/null 2>&1 &
}

collect_kernels_bench() {
    if [ -d "$KEEP/kernels" ]; then
        [ -f "$KEEP/kernels/done" ] || echo "kernels bench still running or stopped early" >> "$KEEP/kernels/kernels-bench.log"
        cp "$KEEP"/kernels/* "$OUT_DIR/" 2>/dev/null || true
    fi
}

prepare() {
    local gguf checkpoint engines
    gguf=$(python -m specc.refmodels fetch smollm2-135m | tail -n 1)
    [ -f "$gguf" ] || gguf=$(ls "$HOME"/.cache/specc/downloads/smollm2-135m/*.gguf)
    checkpoint=$(python -c "from specc.capture.gguf import convert_gguf; print(convert_gguf('$gguf'))")
    engines=${SPECC_GPU_ENGINES:-build/gpu}
    compile_on_cpu "$checkpoint" "$engines/none-inductor" none
    compile_on_cpu "$checkpoint" "$engines/prompt-lookup-inductor" prompt-lookup
    compile_on_cpu "$checkpoint" "$engines/eagle+lookup-inductor" eagle --set lookup=true
    rm -rf "$CARRY" && mkdir -p "$CARRY/part2/wheels"
    python -m pip wheel --quiet --no-deps -w "$CARRY/part2/wheels" . examples/prompt_lookup
    python -m pip download --quiet --no-deps -d "$CARRY/part2/wheels" gguf
    python benchmarks/gpu_carry.py pack "${HEADLINE_ENGINES[@]/#/$engines/}" --checkpoint "$checkpoint" \
        --into "$CARRY/part2/engines.tar.xz"
    python benchmarks/gpu_check.py prompt-ids --engine "$engines/none-inductor" --out "$CARRY/part2"
    split_model "$gguf" "$(part1_bytes "$gguf")"
    du -sb "$CARRY"/part1 "$CARRY"/part2
}

compile_on_cpu() {   # checkpoint, engine directory, method and settings: kept if already built
    local checkpoint=$1 output=$2
    shift 2
    [ -f "$output/manifest.json" ] && return 0
    specc compile "$checkpoint" --method "$@" --backend inductor --dtype bfloat16 --device cpu \
        --max-seq-len 1024 -o "$output" --force
}

headline() {   # the carried engines against HF generate; compiled here instead if they do not rebuild or load
    local engines="$KEEP/engines" checkpoint budget=${BUDGET:-330} start=$SECONDS
    mkdir -p "$OUT_DIR/logs"
    join_model
    checkpoint=$(python -c "from specc.capture.gguf import convert_gguf; print(convert_gguf('$KEEP/$MODEL'))")
    if python benchmarks/gpu_carry.py unpack "$CARRY/part2/engines.tar.xz" --checkpoint "$checkpoint" \
            --into "$engines" > "$OUT_DIR/logs/unpack.log" 2>&1; then
        local pairs=()
        for name in "${HEADLINE_ENGINES[@]}"; do
            point_at_checkpoint "$engines/$name/manifest.json" "$checkpoint"
            pairs+=("$name=$engines/$name")
        done
        timeout "$budget" python -X faulthandler benchmarks/gpu_check.py bench --group headline --hf \
            --out "$OUT_DIR" --device "${CHECK_DEVICE:-cuda}" --budget "$budget" \
            --prompt-ids "$CARRY/part2/prompt-ids.json" --engines "${pairs[@]}" --prompts "${PROMPTS:-8}" \
            --max-new-tokens "${NEW_TOKENS:-128}" --repeats "${REPEATS:-2}" \
            > "$OUT_DIR/logs/bench-headline.log" 2>&1 || echo "headline bench failed or ran out of time"
    fi
    if ! python -c "import json, sys; sys.exit(not json.load(open('$OUT_DIR/bench-headline.json')).get('sets'))" 2> /dev/null; then
        echo "no headline from the carried engines (logs/unpack.log, logs/bench-headline.log): compiling here"
        python benchmarks/gpu_check.py smollm2 --gguf "$KEEP/$MODEL" --out "$OUT_DIR" --groups inductor \
            --budget $(( budget - (SECONDS - start) )) --prompt-ids "$CARRY/part2/prompt-ids.json" \
            ${CHECK_DEVICE:+--device "$CHECK_DEVICE"} || true
    fi
    collect_kernels_bench
    cat "$OUT_DIR"/bench-headline.md "$OUT_DIR"/gpu-check.md 2> /dev/null || true
    bundle_out
}

bundle_out() {   # a device call brings back at most 8 files: the logs travel in one archive
    tar -czf "$OUT_DIR.tgz" -C "$(dirname "$OUT_DIR")" "$(basename "$OUT_DIR")"
    rm -rf "$OUT_DIR/logs" && rm -f "$OUT_DIR"/*.log "$OUT_DIR/done"
}

point_at_checkpoint() {   # the HF reference reads source_checkpoint; the manifest itself is not hashed
    python - "$1" "$2" <<'PY'
import json, sys
path, checkpoint = sys.argv[1:]
manifest = json.load(open(path))
manifest["source_checkpoint"] = checkpoint
json.dump(manifest, open(path, "w"), indent=1)
PY
}

case "${1:-}" in
prepare)
    prepare ;;
split)
    split_model "$2" ;;
stash)
    install_wheels
    cat "$OUT_DIR/machine.txt"
    mkdir -p "$KEEP" && cp "$CARRY"/part1/* "$KEEP/"
    start_kernels_bench ;;
headline)
    install_wheels
    headline ;;
tests)
    install_wheels
    python benchmarks/gpu_check.py tests --out "$OUT_DIR" --budget "${BUDGET:-200}" \
        ${SELECT:+--select "$SELECT"} || echo "pytest -m gpu failed"
    tail -n 40 "$OUT_DIR/logs/pytest-gpu.log"
    bundle_out ;;
smollm2)
    install_wheels
    join_model
    status=0
    python benchmarks/gpu_check.py smollm2 --gguf "$KEEP/$MODEL" --out "$OUT_DIR" \
        --budget "${BUDGET:-500}" ${CHECK_GROUPS:+--groups "$CHECK_GROUPS"} ${CHECK_DEVICE:+--device "$CHECK_DEVICE"} \
        --prompt-ids "$CARRY/part2/prompt-ids.json" || status=$?
    bundle_out
    exit $status ;;
*)
    echo "usage: bash benchmarks/gpu_check.sh prepare|split GGUF|stash|headline|smollm2|tests" >&2; exit 2 ;;
esac
