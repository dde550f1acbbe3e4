"""Seeded tiny random checkpoints of every supported family, for tests and examples.

Random weights are enough to test losslessness: a speculative engine must
reproduce greedy decoding for any weights.
"""

from __future__ import annotations

import json
from pathlib import Path

from specc.capture.families import SUPPORTED_FAMILIES as FAMILIES  # noqa: F401  (re-exported for tests)

TINY_VOCAB = 96
_COMMON = dict(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
               bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)


def tiny_config(family: str, **overrides):
    import transformers

    classes = {
        "llama": transformers.LlamaConfig,
        "mistral": transformers.MistralConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
        "phi3": transformers.Phi3Config,
        "gemma3_text": transformers.Gemma3TextConfig,
        "qwen2_interleaved": transformers.Qwen2Config,   # a quirky variant (QUIRKS), not a family of its own
    }
    extra = {"mistral": {"sliding_window": None}, "qwen3": {"head_dim": 16},
             "gemma3_text": {"head_dim": 16, "query_pre_attn_scalar": 16}}.get(family, {})
    return classes[family](**{**_COMMON, **extra, **overrides})


# The quirks real checkpoints of each family carry that matter for capture, masks, caches and
# export: sliding windows shorter than a test prompt plus its generation, Llama-3 rope scaling,
# Phi-3's fused projections with partial rotary, tied embeddings, Qwen3's q/k norms (always
# there), and query/key-value head ratios other than 2: 4 (Llama-3, Mistral), 8 (multi-query),
# 3 (Qwen3) and 1 (multi-head, as Phi-3-mini has).
QUIRKS: dict[str, dict] = {
    "llama": dict(num_attention_heads=8, num_key_value_heads=2,
                  rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0,
                                       high_freq_factor=4.0, original_max_position_embeddings=16)),
    "mistral": dict(sliding_window=6, num_attention_heads=8, num_key_value_heads=2),
    "qwen2": dict(use_sliding_window=True, sliding_window=6, max_window_layers=0, num_attention_heads=8,
                  num_key_value_heads=1, tie_word_embeddings=True),
    "qwen3": dict(num_attention_heads=6, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True),
    "phi3": dict(sliding_window=6, num_key_value_heads=4,
                 rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5)),
    # Gemma 3: sliding layers around a full one (as 5:1 in real checkpoints), a window shorter than a
    # prompt plus its generation, head_dim 32 where hidden/heads is 16, a query scale of its own,
    # multi-query attention, tied embeddings (always).
    "gemma3_text": dict(sliding_window=5, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                        num_attention_heads=4, num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=24),
    # Qwen2 with max_window_layers: its first layer attends fully, the later ones through a window.
    "qwen2_interleaved": dict(use_sliding_window=True, sliding_window=5, max_window_layers=1, num_attention_heads=8,
                              num_key_value_heads=2, tie_word_embeddings=True),
}
QUIRKY_MODELS = (*FAMILIES, "qwen2_interleaved")   # the exactness matrix's rows: every family and its variants


def quirky_config(family: str, **overrides):
    """`tiny_config` with the quirks real checkpoints of `family` carry (`QUIRKS`)."""
    return tiny_config(family, **{**QUIRKS[family], **overrides})


def build_quirky_checkpoint(family: str, directory: Path, seed: int = 0, **overrides) -> Path:
    """`build_tiny_checkpoint` of `family` with its real checkpoints' quirks (`QUIRKS`)."""
    return build_tiny_checkpoint(family, directory, seed=seed, **{**QUIRKS[family], **overrides})


def build_tiny_checkpoint(family: str, directory: Path, seed: int = 0, noise_from: Path | None = None,
                          noise: float = 0.0, **overrides) -> Path:
    """Write a seeded random model of `family` plus a word-level tokenizer.

    With `noise_from`, the model is that checkpoint's weights plus Gaussian
    noise of std `noise`: a draft model that agrees with it most of the time.
    """
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    if noise_from is not None:
        model = AutoModelForCausalLM.from_pretrained(noise_from)
        config = model.config
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * noise)
    else:
        config = tiny_config(family, **overrides)
        model = AutoModelForCausalLM.from_config(config)
        # Random init is tiny; widen the logits so greedy decoding is not a near-tie everywhere.
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 2:
                    p.normal_(0.0, 0.2)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tiny_tokenizer(config.vocab_size).save_pretrained(directory)
    return directory


def tiny_tokenizer(vocab_size: int = TINY_VOCAB):
    """Word-level tokenizer: 'w5 w17' ↔ ids [5, 17] (0 pad, 1 bos, 2 eos, 3 unk)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    vocab = {tok: i for i, tok in enumerate(specials)}
    vocab.update({f"w{i}": i for i in range(len(specials), vocab_size)})
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##")
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>")


# Word-level chat template: "w5 w6" as one user turn becomes "w10 w5 w6 w11 w12" (ids [10, 5, 6, 11, 12]).
WORD_CHAT_TEMPLATE = ("{% for m in messages %}w10 {{ m['content'] }} w11 {% endfor %}"
                      "{% if add_generation_prompt %}w12{% endif %}")


def tiny_chat_tokenizer(vocab_size: int = TINY_VOCAB):
    """`tiny_tokenizer` with `WORD_CHAT_TEMPLATE` as its chat template."""
    tokenizer = tiny_tokenizer(vocab_size)
    tokenizer.chat_template = WORD_CHAT_TEMPLATE
    return tokenizer


def set_eos_to_a_generated_token(checkpoint: Path, prompts: list[list[int]], max_new_tokens: int) -> int:
    """Make some (not all) greedy generations stop early: pick a token that
    greedy decoding emits mid-way for a few prompts and declare it EOS."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    counts: dict[int, int] = {}
    for ids in prompts:
        out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=max_new_tokens,
                             attention_mask=torch.ones(1, len(ids), dtype=torch.long))[0, len(ids):].tolist()
        for token in set(out[3:max_new_tokens - 2]):
            counts[token] = counts.get(token, 0) + 1
    share = {t: c / len(prompts) for t, c in counts.items()}
    eos = min(share, key=lambda t: abs(share[t] - 0.3))
    for name in ("config.json", "generation_config.json"):
        path = checkpoint / name
        data = json.loads(path.read_text())
        data["eos_token_id"] = eos
        path.write_text(json.dumps(data))
    return eos


def varied_prompts(count: int, vocab: int, seed: int = 0) -> list[list[int]]:
    import torch

    generator = torch.Generator().manual_seed(seed)
    lengths = [1, 2, 3, 5, 8, 13, 21, 34] * (count // 8 + 1)
    return [torch.randint(4, vocab, (lengths[i],), generator=generator).tolist() for i in range(count)]


# --- pass-test helpers -----------------------------------------------------

PASS_TEST_MAX_LEN = 64


def captured_tiny(family: str = "llama", dtype: str = "float32", **overrides):
    """(HF model, CapturedProgram) of a seeded tiny model of `family`, its weights in `dtype`."""
    import torch
    from transformers import AutoModelForCausalLM

    from specc.capture.export import capture

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(family, **overrides)).eval().to(getattr(torch, dtype))
    return model, capture(model, PASS_TEST_MAX_LEN)


def non_matching_graph():
    """A graph with no attention, no rotary embedding and no decoder layers."""
    import torch
    import torch.fx as fx

    mlp = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    exported = torch.export.export(mlp, (torch.randn(2, 8),))
    return fx.GraphModule(exported.module(), exported.module().graph)


def run_cached_steps(gm, ids, chunks: list[tuple[int, int]], arch, *extra_inputs, caches: list | None = None):
    """Run `ids` through a cached decoding graph chunk by chunk; return all logits.
    `extra_inputs` follow the caches; pass `caches` (filled by `empty_caches`) to inspect them after."""
    import torch

    caches = empty_caches(arch) if caches is None else caches
    outputs = []
    with torch.inference_mode():
        for start, end in chunks:
            slots = torch.arange(start, end)
            mask = (torch.arange(end)[None, :] <= slots[:, None])[None, None]
            outputs.append(gm(ids[:, start:end], slots[None], mask, slots, *caches, *extra_inputs)[0])
    return torch.cat(outputs, dim=1)


def empty_caches(arch) -> list:
    """Zeroed K and V caches of every layer for `run_cached_steps`."""
    import torch

    return [torch.zeros(1, arch.num_key_value_heads, PASS_TEST_MAX_LEN + 1, arch.head_dim)
            for _ in range(2 * arch.num_layers)]


# --- losslessness helpers ---------------------------------------------------

_GREEDY_REFERENCES: dict[tuple, list[list[int]]] = {}


def hf_greedy(checkpoint: Path, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Hugging Face `generate(do_sample=False)` continuations, memoised per checkpoint."""
    key = (str(checkpoint), tuple(map(tuple, prompts)), max_new_tokens)
    if key not in _GREEDY_REFERENCES:
        import torch
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
        _GREEDY_REFERENCES[key] = [
            model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=max_new_tokens,
                           attention_mask=torch.ones(1, len(ids), dtype=torch.long))[0, len(ids):].tolist()
            for ids in prompts
        ]
    return _GREEDY_REFERENCES[key]


def assert_matches_hf_greedy(generate_ids, checkpoint: Path, prompts: list[list[int]], max_new_tokens: int) -> list:
    """Assert `generate_ids(ids)` reproduces HF greedy on every prompt, and that
    the prompts still cover both stopping rules (EOS and max length)."""
    expected = hf_greedy(checkpoint, prompts, max_new_tokens)
    results = [generate_ids(ids) for ids in prompts]
    for ids, want, got in zip(prompts, expected, results):
        assert got.token_ids == want, f"prompt {ids}: engine {got.token_ids} != HF {want}"
    assert any(len(w) < max_new_tokens for w in expected), "no prompt hit EOS; the test lost coverage"
    assert any(len(w) == max_new_tokens for w in expected), "no prompt hit max length"
    return results


def reusing_turns(engine, prompt: list[int], max_new_tokens: int, turns: int = 3) -> list[tuple[list[int], object]]:
    """(prompt, result) of `turns` generations of a `LoadedEngine` reusing its cache
    (`reuse_prefix`), each prompt the last one plus its reply plus the reply's first tokens
    again (so lookups find something)."""
    done = []
    for _ in range(turns):
        if done:
            last_prompt, last = done[-1]
            prompt = last_prompt + last.token_ids + last.token_ids[:4]
        done.append((prompt, engine.generate_ids(prompt, max_new_tokens, reuse_prefix=True)))
    return done


def assert_turns_reusing_match_hf_greedy(engine, checkpoint: Path, prompt: list[int], max_new_tokens: int,
                                         turns: int = 3) -> list[int]:
    """Assert `reusing_turns` reproduce HF greedy, every turn after the first prefilling only
    what the last one did not feed the target; returns each turn's reused prompt tokens."""
    assert engine.reuses_prefixes
    done = reusing_turns(engine, prompt, max_new_tokens, turns)
    for prompt, result in done:
        assert result.token_ids == hf_greedy(checkpoint, [prompt], max_new_tokens)[0], f"prompt {prompt}"
    for (last_prompt, last), (_, result) in zip(done, done[1:]):
        assert result.stats.reused_prompt_tokens == len(last_prompt) + len(last.token_ids) - 1
    reused = [result.stats.reused_prompt_tokens for _, result in done]
    assert reused[-1] > 0
    return reused


# --- sampling-distribution helpers -------------------------------------------


def exact_marginals(model, prompt: list[int], sampling):
    """Distributions of the 2nd and 3rd sampled tokens, summed over the earlier ones."""
    import torch

    from specc.runtime.sampling import probabilities

    with torch.no_grad():
        p1 = probabilities(model(torch.tensor([prompt])).logits[0, -1], sampling)
        vocab = p1.numel()
        seconds = torch.tensor([prompt + [a] for a in range(vocab)])
        p2 = probabilities(model(seconds).logits[:, -1], sampling)
        thirds = torch.tensor([prompt + [a, b] for a in range(vocab) for b in range(vocab)])
        p3 = probabilities(model(thirds).logits[:, -1], sampling).view(vocab, vocab, vocab)
    joint = p1[:, None] * p2
    return joint.sum(0), (joint[:, :, None] * p3).sum((0, 1))


def assert_distribution(counts, expected, label: str) -> None:
    """Chi-square goodness of fit; cells expecting fewer than 5 samples are pooled."""
    import torch
    from scipy.stats import chisquare

    n = counts.sum()
    impossible = expected == 0
    assert counts[impossible].sum() == 0, f"{label}: sampled a token the target gives probability 0"
    frequent = expected * n >= 5
    rare = ~frequent & ~impossible
    observed = torch.cat([counts[frequent], counts[rare].sum()[None]]).double()
    wanted = torch.cat([expected[frequent], expected[rare].sum()[None]]).double()
    observed, wanted = observed[wanted > 0], wanted[wanted > 0]
    result = chisquare(observed.numpy(), (wanted / wanted.sum() * n).numpy())
    assert result.pvalue > 1e-3, f"{label}: chi-square p={result.pvalue:.2e}, observed {counts.tolist()}"


def trained_engines(method: str, checkpoints, tmp_path_factory, training: list[str], max_seq_len: int,
                    temperature: float = 1.0):
    """(family, backend) -> (engine of `method` trained with `training` on text the target
    samples, target checkpoint), compiled once each. The tiny qwen2 checkpoint's tokenizer
    loads as Qwen2Tokenizer, which encodes its word-level text to nothing, so qwen2 engines
    stay untrained (losslessness does not depend on the training)."""
    from specc.compiler import CompileRequest, compile_engine
    from specc.engine.loaded import load_engine

    built = {}

    def get(family: str, backend: str = "eager"):
        if (family, backend) not in built:
            target = checkpoints(family)[0]
            root = tmp_path_factory.mktemp(f"{method}-{family}-{backend}")
            calib = sample_calibration_text(target, root / "calib.txt", sequences=32, temperature=temperature)
            settings = ["train_steps=0"] if family == "qwen2" else [*training, f"calib_data={calib}"]
            compile_engine(CompileRequest(model=str(target), method=method, output=root / "engine",
                                          backend=backend, max_seq_len=max_seq_len, settings=settings))
            built[family, backend] = (load_engine(root / "engine"), target)
        return built[family, backend]

    return get


def recording_rounds(built):
    """A method runtime's (target, drafter, rounds): `rounds` records (tree, accepted path)
    of every speculative round the drafter observes."""
    rounds = []
    observe = built.drafter.observe

    def record(draft, acceptance, verification):
        if draft is not None:
            rounds.append((draft.tree, acceptance.path))
        observe(draft, acceptance, verification)

    built.drafter.observe = record
    return built.target, built.drafter, rounds


def recording_drafted_tokens(drafter) -> list[int]:
    """Every token `drafter` proposes from now on (the draft trees' nodes below the root)."""
    drafted = []
    propose = drafter.propose

    def record(*args):
        draft = propose(*args)
        if draft is not None:
            drafted.extend(draft.node_tokens[1:].tolist())
        return draft

    drafter.propose = record
    return drafted


def assert_samples_the_target(model, target, drafter, rounds: list, sampling, max_seq_len: int,
                              samples: int = 1200, new_tokens: int = 3) -> None:
    """Sampled generation through a speculative runtime reproduces the target's exact
    distribution of the 2nd and 3rd tokens after a fixed prompt, while acceptance varies.
    With `new_tokens` = 4 the first round after the prefill may draft two deep, so both
    tokens can come from one round (what a drafter's stop rule changes)."""
    import torch

    from specc.runtime.generate import generate
    from specc.contract.sampling import SamplingConfig

    prompt = [5, 9, 7]
    counts = torch.zeros(2, model.config.vocab_size)
    for seed in range(samples):
        run = SamplingConfig(sampling.temperature, sampling.top_p, seed=seed)
        tokens = generate(target, drafter, prompt, new_tokens, run, max_seq_len).token_ids
        counts[0, tokens[1]] += 1
        counts[1, tokens[2]] += 1
    second, third = exact_marginals(model, prompt, sampling)
    assert_distribution(counts[0], second, "second token")
    assert_distribution(counts[1], third, "third token")
    accepted = [len(path) - 1 for _, path in rounds]
    assert 0 < sum(accepted) < sum(tree.spec.depth for tree, _ in rounds), "acceptance never varied"


def sample_calibration_text(checkpoint: Path, path: Path, sequences: int, length: int = 64,
                            temperature: float = 1.0) -> Path:
    """Text the target itself samples, written as the tiny tokenizer's words (training data a
    method's compile-time step can learn the target from)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    torch.manual_seed(1)
    starts = torch.randint(4, model.config.vocab_size, (sequences, 2))
    with torch.no_grad():
        rows = model.generate(starts, do_sample=True, temperature=temperature, max_new_tokens=length,
                              pad_token_id=0, attention_mask=torch.ones_like(starts)).tolist()
    path.write_text("\n\n".join(" ".join(f"w{t}" for t in row if t >= 4) for row in rows))
    return path
