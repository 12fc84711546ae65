"""Sampler behaviour: greedy == argmax of the full forward, log-probs, batch invariance, sharding, stops.

One model and one sampler per module, with small fixed buckets, so the whole file compiles only
a handful of programs.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl.generation import sampler as sampler_module
from rl.generation.sampler import Sampler, SamplerConfig, SamplingParams, _segment_ends, _stop_string_cut
from rl.generation.token_selection import filter_logits, gumbel_noise
from rl.generation.tokenizer import ByteTokenizer
from rl.models import Transformer, get_model_config, sharding

REF_LEN = 64  # fixed length of the reference forward pass (right-padded; causal => exact)
BUCKETS = SamplerConfig(batch_buckets=(1, 4), prompt_buckets=(16, 32), new_token_buckets=(8, 24))
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=20)


def _make_model(mesh, **overrides):
    """The tiny preset with its embedding scaled up: peaked logits (no argmax near-ties), still ~1.5 nats of entropy."""
    config = get_model_config("tiny", **overrides)
    model = sharding.create_sharded_model(lambda: Transformer(config, nnx.Rngs(7)), mesh)
    model.embed[...] = model.embed[...] * 3.0
    return model


@pytest.fixture(scope="module")
def tok():
    return ByteTokenizer()


@pytest.fixture(scope="module")
def model(single_mesh):
    return _make_model(single_mesh)


@pytest.fixture(scope="module")
def sampler(model, tok, single_mesh):
    return Sampler(model, tok, single_mesh, BUCKETS)


@pytest.fixture(scope="module")
def prompts(tok):
    texts = ["Hello, world", "a", "The quick brown fox jumps over", "<|im_start|>user\n2+2?<|im_end|>\n"]
    return [tok.encode(t) for t in texts]


@pytest.fixture(scope="module")
def reference_logits(model):
    return _reference_logits(model)


def _reference_logits(model):
    """Full-sequence logits [len, vocab] of one token list, by the plain (cache-free) forward."""
    graphdef = nnx.split(model)[0]
    forward = jax.jit(lambda state, ids: nnx.merge(graphdef, state)(ids)[0][0])

    def run(ids):
        padded = np.zeros((1, REF_LEN), np.int32)
        padded[0, : len(ids)] = ids
        return np.asarray(forward(nnx.state(model), jnp.asarray(padded)))[: len(ids)]

    return run


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_greedy_equals_stepwise_argmax_of_full_forward(sampler, prompts, reference_logits, tok):
    completions = sampler.generate(prompts, GREEDY)
    for prompt, c in zip(prompts, completions, strict=True):
        ids = list(prompt)
        for _ in range(len(c.token_ids)):
            ids.append(int(np.argmax(reference_logits(ids)[-1, : tok.vocab_size])))
        assert c.token_ids == ids[len(prompt) :]
        assert c.finish_reason == ("stop" if c.token_ids[-1] in tok.stop_token_ids else "length")
        assert c.logprobs == [0.0] * len(c.token_ids)  # greedy samples from a point mass


def test_segmented_decode_equals_the_full_forward(model, tok, single_mesh, prompts, reference_logits, monkeypatch):
    """The decode loop in segments over growing caches: same tokens and log-probs as the forward."""
    monkeypatch.setattr(sampler_module, "MIN_SEGMENT_STEPS", 4)
    assert _segment_ends(24) == [6, 12, 18, 24]
    segmented = Sampler(model, tok, single_mesh, BUCKETS)
    params = [GREEDY, SamplingParams(temperature=1.0, max_new_tokens=20)] * 2
    completions = segmented.generate(prompts, params, seeds=[1, 2, 3, 4])
    for prompt, p, c in zip(prompts, params, completions, strict=True):
        n = len(c.token_ids)
        assert n > 12 or c.finish_reason == "stop"
        logits = reference_logits(list(prompt) + c.token_ids)[len(prompt) - 1 : len(prompt) - 1 + n]
        if p.temperature == 0:
            assert c.token_ids == np.argmax(logits[:, : tok.vocab_size], -1).tolist()
        raw = np.take_along_axis(_log_softmax(logits), np.asarray(c.token_ids)[:, None], -1)[:, 0]
        np.testing.assert_allclose(c.raw_logprobs, raw, atol=1e-5)


def test_gumbel_noise_is_jax_random_gumbel():
    """Bit for bit, so that a seed samples what jax.random.categorical-style Gumbel-max would."""
    keys = jax.vmap(lambda s: jax.random.fold_in(jax.random.key(s), 3))(jnp.arange(5, dtype=jnp.uint32))
    for vocab in (7, 272, 4099):
        expected = jax.vmap(lambda key, v=vocab: jax.random.gumbel(key, (v,), jnp.float32))(keys)
        np.testing.assert_array_equal(jax.jit(gumbel_noise, static_argnums=1)(keys, vocab), expected)


def test_logprobs_equal_forward_without_head_groups(tok, single_mesh, prompts):
    """num_kv_heads == num_heads (the quickstart's model) decodes by a different attention path.

    Log-probs, not greedy tokens: this model's argmax barely depends on attention.
    """
    model = _make_model(single_mesh, num_kv_heads=4)
    reference_logits = _reference_logits(model)
    params = SamplingParams(temperature=1.0, max_new_tokens=16)
    completions = Sampler(model, tok, single_mesh, BUCKETS).generate(prompts, params, seeds=[1, 2, 3, 4])
    for prompt, c in zip(prompts, completions, strict=True):
        n = len(c.token_ids)
        assert n > 1  # decode steps ran, not only the prefill's first token
        logits = reference_logits(list(prompt) + c.token_ids)[len(prompt) - 1 : len(prompt) - 1 + n]
        raw = np.take_along_axis(_log_softmax(logits), np.asarray(c.token_ids)[:, None], -1)[:, 0]
        np.testing.assert_allclose(c.raw_logprobs, raw, atol=1e-5)


def test_logprobs_equal_a_recomputing_forward_pass(sampler, prompts, reference_logits, tok):
    params = [
        SamplingParams(temperature=0.0, max_new_tokens=12),
        SamplingParams(temperature=0.7, max_new_tokens=12),
        SamplingParams(temperature=1.3, top_k=5, top_p=0.9, max_new_tokens=12),
        SamplingParams(temperature=1.0, top_p=0.6, max_new_tokens=12),
    ]
    completions = sampler.generate(prompts, params, seeds=[1, 2, 3, 4])
    for prompt, p, c in zip(prompts, params, completions, strict=True):
        n = len(c.token_ids)
        logits = reference_logits(list(prompt) + c.token_ids)[len(prompt) - 1 : len(prompt) - 1 + n]
        chosen = np.asarray(c.token_ids)[:, None]
        raw = np.take_along_axis(_log_softmax(logits), chosen, -1)[:, 0]
        np.testing.assert_allclose(c.raw_logprobs, raw, atol=1e-5)
        if p.temperature > 0:
            scaled = np.where(np.arange(logits.shape[-1]) < tok.vocab_size, logits, -np.inf) / p.temperature
            k, top_p = jnp.full((n,), p.top_k), jnp.full((n,), p.top_p)
            filtered = np.asarray(filter_logits(jnp.asarray(scaled), k, top_p))
            assert np.isfinite(np.take_along_axis(filtered, chosen, -1)).all()  # never outside the filter
            expected = np.take_along_axis(_log_softmax(filtered), chosen, -1)[:, 0]
            np.testing.assert_allclose(c.logprobs, expected, atol=1e-5)


def test_a_prompt_alone_equals_the_prompt_in_a_mixed_batch(sampler, prompts):
    """Batch invariance: other rows (different lengths, other settings) do not change a request."""
    sampled = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=20)
    for params in (GREEDY, sampled):
        alone = sampler.generate([prompts[0]], params, seeds=[11])[0]
        others = [SamplingParams(temperature=0.5, top_k=3, max_new_tokens=6), GREEDY, sampled]
        batch = [prompts[2], prompts[1], prompts[0], prompts[3]]
        together = sampler.generate(batch, [*others[:2], params, others[2]], seeds=[5, 6, 11, 7])[2]
        assert together.token_ids == alone.token_ids
        np.testing.assert_allclose(together.raw_logprobs, alone.raw_logprobs, atol=1e-5)
        np.testing.assert_allclose(together.logprobs, alone.logprobs, atol=1e-5)


def test_sharded_sampler_equals_unsharded(sampler, tok, prompts, model):
    mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    sharded_model = _make_model(mesh)
    for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(sharded_model)), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert sharded_model.layers[0].mlp.up[...].sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor")
    sharded = Sampler(sharded_model, tok, mesh, BUCKETS)
    params = [GREEDY, SamplingParams(temperature=0.9, top_k=20, max_new_tokens=20)] * 2
    expected = sampler.generate(prompts, params, seeds=[1, 2, 3, 4])
    got = sharded.generate(prompts, params, seeds=[1, 2, 3, 4])
    for e, g in zip(expected, got, strict=True):
        assert e.token_ids == g.token_ids
        np.testing.assert_allclose(e.raw_logprobs, g.raw_logprobs, atol=1e-5)


def test_chunked_prefill_matches_single_pass(sampler, model, tok, single_mesh, prompts):
    chunked = Sampler(model, tok, single_mesh, dataclasses.replace(BUCKETS, prefill_chunk=8))
    params = [GREEDY, SamplingParams(temperature=1.0, max_new_tokens=20)] * 2
    expected = sampler.generate(prompts, params, seeds=[1, 2, 3, 4])
    got = chunked.generate(prompts, params, seeds=[1, 2, 3, 4])
    assert {shape[1] for shape in chunked.compiled_shapes} == {32}  # 4 chunks of 8
    for e, g in zip(expected, got, strict=True):
        assert e.token_ids == g.token_ids
        np.testing.assert_allclose(e.raw_logprobs, g.raw_logprobs, atol=1e-5)


def test_stop_token_stop_string_and_max_tokens(sampler, prompts, tok):
    free = sampler.generate([prompts[2]], GREEDY)[0]
    assert len(free.token_ids) >= 6
    # Stop token: the 4th greedy token (its first occurrence) ends the completion, kept as last.
    stop_id = free.token_ids[3]
    cut = free.token_ids.index(stop_id) + 1
    by_token = sampler.generate(
        [prompts[2]], SamplingParams(temperature=0.0, max_new_tokens=20, stop_token_ids=(stop_id,))
    )[0]
    assert (by_token.token_ids, by_token.finish_reason, by_token.stop) == (free.token_ids[:cut], "stop", stop_id)
    # Max tokens (not a bucket size) ends with "length".
    short = sampler.generate([prompts[2]], SamplingParams(temperature=0.0, max_new_tokens=5))[0]
    assert (short.token_ids, short.finish_reason, short.stop) == (free.token_ids[:5], "length", None)
    # Stop string: the text of greedy tokens 2..3; cut after the token that completes it first.
    stop_text = tok.decode(free.token_ids[2:4])
    params = SamplingParams(temperature=0.0, max_new_tokens=20, stop_strings=("never-there", stop_text))
    by_string = sampler.generate([prompts[2]], params)[0]
    n = next(i for i in range(1, 21) if stop_text in tok.decode(free.token_ids[:i]))
    assert (by_string.token_ids, by_string.finish_reason, by_string.stop) == (free.token_ids[:n], "stop", stop_text)
    assert len(by_string.logprobs) == len(by_string.raw_logprobs) == n
    assert by_string.text == tok.decode(by_string.token_ids)


def test_stop_string_cut_keeps_the_completing_token(tok):
    ids = tok.encode("abc</answer>tail")
    assert _stop_string_cut(tok, ids, ("</answer>", "c<")) == (4, "c<")
    assert _stop_string_cut(tok, ids, ("</answer>",)) == (12, "</answer>")
    assert _stop_string_cut(tok, ids, ("zzz",)) is None


def test_top_k_1_equals_greedy_and_seeds_reproduce(sampler, prompts):
    greedy = sampler.generate(prompts, GREEDY)
    top1 = sampler.generate(prompts, SamplingParams(temperature=1.0, top_k=1, max_new_tokens=20), seeds=[9, 8, 7, 6])
    assert [c.token_ids for c in top1] == [c.token_ids for c in greedy]
    assert all(lp == pytest.approx(0.0, abs=1e-6) for c in top1 for lp in c.logprobs)
    hot = SamplingParams(temperature=2.0, max_new_tokens=20)
    a = sampler.generate(prompts[:2], hot, seeds=[123, 456])
    b = sampler.generate(prompts[:2], hot, seeds=[123, 456])
    c = sampler.generate(prompts[:2], hot, seeds=[124, 457])
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    assert [x.token_ids for x in a] != [x.token_ids for x in c]


def test_shapes_are_bucketed(sampler, prompts):
    for n in (1, 2, 3, 4, 6):
        sampler.generate(prompts[:1] * n, SamplingParams(temperature=0.0, max_new_tokens=3))
    batches = {b for b, _, _ in sampler.compiled_shapes}
    assert batches <= {1, 4}  # 2 and 3 round up to 4; 6 runs as chunks of 4
    assert len(sampler.compiled_shapes) <= 8


def test_update_weights_and_in_place_updates_are_seen(sampler, model, prompts):
    before = sampler.generate(prompts[:1], GREEDY)[0].token_ids
    original = jax.tree.map(lambda x: x, nnx.state(model))  # a snapshot: nnx.state shares Variables
    sampler.update_weights(jax.tree.map(lambda x: -x, original))  # a learner's separate state
    assert sampler.generate(prompts[:1], GREEDY)[0].token_ids != before
    sampler.update_weights(model)  # back to reading the module itself on every call
    assert sampler.generate(prompts[:1], GREEDY)[0].token_ids == before
    try:
        nnx.update(model, jax.tree.map(lambda x: -x, original))  # an in-place optimizer step
        assert sampler.generate(prompts[:1], GREEDY)[0].token_ids != before
    finally:
        nnx.update(model, original)
    assert sampler.generate(prompts[:1], GREEDY)[0].token_ids == before


def test_filter_logits_by_hand():
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]] * 4))
    kept = np.isfinite(np.asarray(filter_logits(logits, jnp.array([0, 2, 0, 3]), jnp.array([0.7, 1.0, 0.5, 0.9]))))
    assert kept.tolist() == [
        [True, True, False, False],
        [True, True, False, False],
        [True, False, False, False],
        [True, True, True, False],
    ]


def test_invalid_requests_are_named(sampler, prompts):
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match=r"prompts\[1\]: empty"):
        sampler.generate([prompts[0], []])
    with pytest.raises(ValueError, match="seeds"):
        sampler.generate(prompts[:2], GREEDY, seeds=[1])
    with pytest.raises(ValueError, match="max_position_embeddings"):
        sampler.generate(prompts[:1], SamplingParams(max_new_tokens=5000))
