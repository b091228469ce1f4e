"""Tests for the CPU smoke fixtures: the tiny random model builder and the synthetic task.

The key property checked last: sampling the *random* model gives mixed groups (0 < c < k) with
success rates that differ across prompts, which is what the GAPO smoke run needs.
"""

import json

import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

from gapo.smoke import task
from gapo.smoke.task import compute_score, expected_success_rate, make_dataset, make_rows
from gapo.smoke.tiny_model import CHAR_TOKENS, SPECIAL_TOKENS, VOCAB_SIZE, build_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="module")
def tok_and_model(model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    return tok, model


# --- builder ---------------------------------------------------------------------------------


def test_builder_is_deterministic_and_idempotent(model_dir, tmp_path):
    weights = load_file(model_dir / "model.safetensors")
    same = load_file(build_tiny_model(tmp_path / "again", seed=0) / "model.safetensors")
    other = load_file(build_tiny_model(tmp_path / "seed1", seed=1) / "model.safetensors")
    assert weights.keys() == same.keys() == other.keys()
    assert all(torch.equal(weights[k], same[k]) for k in weights)
    assert not torch.equal(weights["model.embed_tokens.weight"], other["model.embed_tokens.weight"])

    # Same settings: reused untouched. Different settings: rebuilt in place.
    mtime = (model_dir / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_model(model_dir, seed=0) == model_dir
    assert (model_dir / "model.safetensors").stat().st_mtime_ns == mtime
    build_tiny_model(tmp_path / "again", seed=0, hidden_size=32)
    cfg = json.loads((tmp_path / "again" / "config.json").read_text())
    assert cfg["hidden_size"] == 32


def test_loads_with_auto_classes_and_ids_match(tok_and_model, model_dir):
    from transformers import GenerationConfig

    tok, model = tok_and_model
    gen = GenerationConfig.from_pretrained(model_dir)
    # 4 specials + 10 digits + 26 letters + ":,.?" + space + newline.
    assert VOCAB_SIZE == 46 == len(tok) == model.config.vocab_size
    assert tok.convert_ids_to_tokens([0, 1, 2, 3]) == list(SPECIAL_TOKENS)
    for name in ("pad_token_id", "eos_token_id", "bos_token_id"):
        assert getattr(tok, name) == getattr(model.config, name) == getattr(gen, name)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert not model.config.tie_word_embeddings
    n_params = sum(p.numel() for p in model.parameters())
    assert 50_000 < n_params < 150_000


def test_round_trip_one_token_per_char(tok_and_model):
    tok, _ = tok_and_model
    texts = [r["prompt"][0]["content"] for r in make_rows(20, seed=0, split="train")]
    texts += ["".join(CHAR_TOKENS), " a\n\nb, c. d? e: ", "  7"]
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False)
        assert len(ids) == len(text)  # char-level: no merges
        assert tok.decode(ids) == text
    # Specials vanish under skip_special_tokens, which is how verl decodes responses.
    ids = tok.encode(" b7", add_special_tokens=False) + [tok.eos_token_id, tok.pad_token_id]
    assert tok.decode(ids, skip_special_tokens=True) == " b7"
    assert tok.encode("x", add_special_tokens=True) == tok.encode("x", add_special_tokens=False)


def test_chat_template(tok_and_model):
    tok, _ = tok_and_model
    msgs = [{"role": "user", "content": "answer with one of: a b"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nanswer with one of: a b<|im_end|>\n<|im_start|>assistant\n"
    no_gen = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False)
    assert no_gen == "<|im_start|>user\nanswer with one of: a b<|im_end|>\n"
    # 19 template tokens around the content, as assumed by task.MAX_PROMPT_TOKENS.
    assert len(tok(text, add_special_tokens=False).input_ids) == 19 + len(msgs[0]["content"])


# --- reward ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "response, expected",
    [
        ("a", 1.0),
        ("c,zz", 1.0),
        (" \n b", 1.0),  # leading whitespace is skipped
        ("x", 0.0),
        ("xa", 0.0),  # only the first visible character counts
        (",a", 0.0),
        ("", 0.0),  # "" is a substring of everything: must still fail
        ("  \n", 0.0),
        (None, 0.0),
    ],
)
def test_compute_score_hand_cases(response, expected):
    out = compute_score("gapo_smoke", response, "abc", extra_info={"index": 0}, unused_kwarg=1)
    assert out == {"score": expected, "acc": expected == 1.0}


def test_expected_success_rate_hand_computed():
    # V = 46; 5 tokens (space, newline, pad, bos, im_start) decode to nothing; EOS ends the text.
    gt = "0123456789abcdefghijklm"  # 23 allowed
    assert expected_success_rate(gt, max_new_tokens=1) == pytest.approx(23 / 46)
    assert expected_success_rate(gt, max_new_tokens=2) == pytest.approx(23 / 46 * (1 + 5 / 46))
    assert expected_success_rate(gt) == pytest.approx(23 / 41)


# --- dataset ---------------------------------------------------------------------------------


def test_dataset_schema_and_determinism(tmp_path):
    paths = make_dataset(tmp_path / "a", n_train=10, n_val=4, seed=0)
    again = make_dataset(tmp_path / "b", n_train=10, n_val=4, seed=0)
    train = pq.read_table(paths["train"]).to_pylist()
    val = pq.read_table(paths["val"]).to_pylist()
    assert len(train) == 10 and len(val) == 4
    assert pq.read_table(again["train"]).to_pylist() == train
    assert pq.read_table(again["val"]).to_pylist() == val
    assert [r["reward_model"] for r in make_rows(10, seed=1, split="train")] != [
        r["reward_model"] for r in train
    ]
    # Pinned content: catches silent changes to the generator (seeded by the string "0/train").
    assert train[0]["reward_model"] == {"style": "rule", "ground_truth": "015defginpqw"}
    assert train[0]["prompt"] == [{"role": "user", "content": "answer with one of: 0 1 5 d e f g i n p q w"}]

    for split, rows in (("train", train), ("val", val)):
        for i, row in enumerate(rows):
            assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
            assert row["data_source"] == "gapo_smoke" and row["ability"] == "char_choice"
            assert row["extra_info"] == {"index": i, "split": split}
            gt = row["reward_model"]["ground_truth"]
            assert row["reward_model"]["style"] == "rule"
            assert list(gt) == sorted(set(gt)) and set(gt) <= set(task.CHOICE_POOL)
            assert task.MIN_SET_SIZE <= len(gt) <= task.MAX_SET_SIZE
            assert row["prompt"] == [{"role": "user", "content": "answer with one of: " + " ".join(gt)}]
            assert 19 + len(row["prompt"][0]["content"]) <= task.MAX_PROMPT_TOKENS


# --- the random model on the task ------------------------------------------------------------


def test_random_model_gives_mixed_groups_with_spread_rates(tok_and_model):
    tok, model = tok_and_model
    k, n_prompts = 8, 16
    rows = make_rows(n_prompts, seed=0, split="val")
    texts = [tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in rows]
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(0)
        out = model.generate(**enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                             max_new_tokens=6, num_return_sequences=k)
    responses = tok.batch_decode(out[:, enc.input_ids.shape[1]:], skip_special_tokens=True)

    counts, sizes = [], []
    for i, row in enumerate(rows):
        gt = row["reward_model"]["ground_truth"]
        group = responses[i * k:(i + 1) * k]  # num_return_sequences keeps a prompt's samples together
        counts.append(sum(compute_score("gapo_smoke", r, gt)["score"] for r in group))
        sizes.append(len(gt))
    rates = [c / k for c in counts]

    mixed = sum(0 < c < k for c in counts)
    assert mixed >= 12, counts  # measured 14-16 of 16 over several model/sampling/data seeds
    assert max(rates) - min(rates) >= 0.3, rates
    assert 0.25 <= sum(rates) / n_prompts <= 0.65, rates
    # Rates track |S|: the big-set half of the prompts succeeds clearly more often.
    by_size = [r for _, r in sorted(zip(sizes, rates))]
    half = n_prompts // 2
    assert sum(by_size[half:]) / half - sum(by_size[:half]) / half >= 0.1, (sizes, rates)


def test_skewed_sets_favour_frequent_characters_and_stay_deterministic():
    from gapo.smoke.task import FREQUENCY_ORDER

    def has_top(rows):
        return sum(FREQUENCY_ORDER[0] in r["reward_model"]["ground_truth"] for r in rows) / len(rows)

    uniform = make_rows(2000, seed=0, split="train", min_size=1, max_size=4)
    skewed = make_rows(2000, seed=0, split="train", min_size=1, max_size=4, skew=1.0)
    # uniform: a given character is in a set of 1-4 of 36 with probability 2.5 / 36 = 0.069; Zipf(1): near one half
    assert 0.05 < has_top(uniform) < 0.09 and has_top(skewed) > 0.4
    assert all(len(set(r["reward_model"]["ground_truth"])) == len(r["reward_model"]["ground_truth"]) for r in skewed)
    assert skewed == make_rows(2000, seed=0, split="train", min_size=1, max_size=4, skew=1.0)
    assert make_rows(5, seed=0, split="train", skew=0.0) == make_rows(5, seed=0, split="train")
    for bad in (-1, float("nan"), "1"):
        with pytest.raises(ValueError, match="skew must be a finite number >= 0"):
            make_rows(1, seed=0, split="train", skew=bad)
