"""Tiny random Qwen2 causal LM + char-level tokenizer, built offline for the CPU smoke run.

The smoke run needs a real HF checkpoint directory that verl can load (AutoTokenizer /
AutoModelForCausalLM / generation_config) but no model hub and no GPU. This module builds one
from nothing: a character-level ``tokenizers`` tokenizer (every printable token is exactly one
character, so ``decode`` is faithful and the reward can parse the response text) and a randomly
initialised ~80k-parameter ``Qwen2ForCausalLM``. With the default small init the model's
next-token distribution is near-uniform over the vocabulary, which is what the synthetic task in
:mod:`gapo.smoke.task` relies on for its intermediate success rates.

Build is deterministic given the seed and idempotent: a stamp file records the settings, and a
directory that already holds a build with the same settings is reused as is.

CLI: ``python -m gapo.smoke.tiny_model --out DIR``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import string
import tempfile
from pathlib import Path

# --- vocabulary ------------------------------------------------------------------------------
# Kept importable without torch/transformers: the reward module (loaded by verl from its file
# path inside Ray workers) reads these constants.

# Qwen2 names: <|endoftext|> is its pad token, and transformers' Qwen2Tokenizer uses it as the
# default unk token (it would *add* it, past the model's vocab, if it were missing).
PAD_TOKEN = "<|endoftext|>"
UNK_TOKEN = PAD_TOKEN  # declared only: the BPE model has no unk, unknown chars are dropped
BOS_TOKEN = "<|bos|>"  # declared (verl/HF read it) but never prepended, as in Qwen2
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"  # doubles as EOS, as in Qwen chat models: generation stops at end of turn
EOS_TOKEN = IM_END
# Order fixes the ids: pad=0, bos=1, im_start=2, im_end=3.
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, IM_START, IM_END)

WHITESPACE_CHARS = (" ", "\n")  # real tokens: the chat template needs "\n", prompts need " "
PUNCT_CHARS = tuple(":,.?")
ALNUM_CHARS = tuple(string.digits + string.ascii_lowercase)
# Every non-special token is a single character, so decode(encode(s)) == s for s over this set.
# Characters outside it are dropped by the tokenizer (its BPE has no unk, as in Qwen2).
CHAR_TOKENS = ALNUM_CHARS + PUNCT_CHARS + WHITESPACE_CHARS
VOCAB_SIZE = len(SPECIAL_TOKENS) + len(CHAR_TOKENS)

# GPT-2/Qwen byte-level alphabet: printable ASCII maps to itself; of our chars only space and
# newline are remapped (to U+0120 "Ġ" and U+010A "Ċ").
_BYTE_LEVEL = {" ": "\u0120", "\n": "\u010a"}
# Qwen2's pre-tokenization split (same as transformers' Qwen2Tokenizer).
_QWEN2_SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# ChatML, the format Qwen models use; supports add_generation_prompt like the real template.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)

_STAMP = "gapo_tiny_model.json"
_BUILD_VERSION = 1  # bump when the build recipe changes so stale directories are rebuilt


def build_tokenizer():
    """Return a ``PreTrainedTokenizerFast`` over the char-level vocabulary above.

    The pipeline mirrors Qwen2's byte-level BPE exactly (NFC, Qwen split regex, ByteLevel
    pre-tokenizer and decoder), only with a 1-char-per-token vocab and no merges. That matters:
    for ``model_type == "qwen2"`` transformers 5 always loads ``Qwen2Tokenizer``, which rebuilds
    this pipeline around the saved vocab, so a different pipeline would tokenize differently once
    reloaded.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({_BYTE_LEVEL.get(c, c): len(SPECIAL_TOKENS) + i for i, c in enumerate(CHAR_TOKENS)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        chat_template=CHAT_TEMPLATE,
        # transformers' cleanup rewrites e.g. " ," -> ","; it would break faithful decoding.
        clean_up_tokenization_spaces=False,
        model_max_length=1024,
        padding_side="left",
    )


def build_tiny_model(
    out_dir: str | os.PathLike,
    *,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,  # head_dim 32: vLLM's CPU attention accepts head sizes 32..512 only (16 fails)
    num_kv_heads: int = 1,
    intermediate_size: int = 128,
    max_position_embeddings: int = 1024,
    initializer_range: float = 0.02,
    tie_word_embeddings: bool = False,
) -> Path:
    """Build (or reuse) the tiny model + tokenizer in ``out_dir`` and return its path.

    ``initializer_range`` is Qwen2's default; it keeps logits ~N(0, 0.2) so sampling is
    near-uniform. Untied embeddings avoid any shared-parameter special cases in FSDP wrapping
    and checkpoint merging.
    """
    out = Path(out_dir)
    # Everything the weights depend on, in the stamp that decides whether out_dir can be reused.
    settings = {"build_version": _BUILD_VERSION, "vocab": list(SPECIAL_TOKENS + CHAR_TOKENS), "seed": seed,
                "hidden_size": hidden_size, "num_layers": num_layers, "num_heads": num_heads,
                "num_kv_heads": num_kv_heads, "intermediate_size": intermediate_size,
                "max_position_embeddings": max_position_embeddings, "initializer_range": initializer_range,
                "tie_word_embeddings": tie_word_embeddings}
    stamp = out / _STAMP
    if stamp.is_file() and json.loads(stamp.read_text()) == settings:
        return out

    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_tokenizer()
    ids = dict(pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
               eos_token_id=tokenizer.eos_token_id)
    config = Qwen2Config(
        vocab_size=VOCAB_SIZE,  # == len(tokenizer): every sampled id decodes to something
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        initializer_range=initializer_range,
        tie_word_embeddings=tie_word_embeddings,
        use_cache=True,
        **ids,
    )
    # fork_rng: seed the init without disturbing the caller's global RNG stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(do_sample=True, temperature=1.0, top_p=1.0, **ids)

    # Write into a sibling temp dir and swap it in, so a crashed or concurrent build never
    # leaves a half-written directory that looks complete.
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        # Name the class real Qwen2 checkpoints use: transformers 5 writes its generic
        # "TokenizersBackend", a class transformers 4.x lacks (only 5.x is tested here).
        tok_cfg_path = tmp / "tokenizer_config.json"
        tok_cfg = json.loads(tok_cfg_path.read_text())
        tok_cfg["tokenizer_class"] = "Qwen2Tokenizer"
        tok_cfg_path.write_text(json.dumps(tok_cfg, indent=2))
        (tmp / _STAMP).write_text(json.dumps(settings, indent=1))
        tmp.chmod(0o755)  # mkdtemp creates 0700; other users / containers may read the model
        if out.exists():
            shutil.rmtree(out)
        try:
            os.replace(tmp, out)
        except OSError:
            # A concurrent build won the race; fine if it built the same thing.
            if not (stamp.is_file() and json.loads(stamp.read_text()) == settings):
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> None:
    """CLI entry: build (or reuse) the tiny model under ``--out`` and print its folder."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    path = build_tiny_model(args.out, seed=args.seed)
    print(path)


if __name__ == "__main__":
    main()
