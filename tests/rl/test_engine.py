"""DecodeEngine: a first turn equals the sampler, requests are independent of neighbours and of when they
were inserted, continued sequences equal a full recompute (through page-out and page-in, and after a
stop-string cut), sharded == unsharded, few compiled programs, errors name the argument.

One model per module and engines with small slot counts and buckets, so the file compiles a handful
of programs.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl.generation.engine import DecodeEngine
from rl.generation.engine_config import EngineConfig
from rl.generation.sampler import Sampler, SamplerConfig, SamplingParams
from rl.generation.tokenizer import ByteTokenizer
from rl.models import sharding
from tests.rl.test_sampler import _make_model

CONFIG = EngineConfig(slots=4, max_len=128, prefill_buckets=(8, 16, 32), decode_steps=4, window_min=32)
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=20)
MIXED = [
    GREEDY,
    SamplingParams(temperature=0.7, max_new_tokens=20),
    SamplingParams(temperature=1.3, top_k=5, top_p=0.9, max_new_tokens=20),
    SamplingParams(temperature=1.0, top_p=0.6, max_new_tokens=20),
]
REF_LEN = 128


@pytest.fixture(scope="module")
def tok():
    return ByteTokenizer()


@pytest.fixture(scope="module")
def model(single_mesh):
    return _make_model(single_mesh)


@pytest.fixture(scope="module")
def engine(model, tok, single_mesh):
    return DecodeEngine(model, tok, single_mesh, CONFIG)


@pytest.fixture(scope="module")
def prompts(tok):
    texts = ["Hello, world", "a", "The quick brown fox jumps over", "<|im_start|>user\n2+2?<|im_end|>\n"]
    return [tok.encode(t) for t in texts]


@pytest.fixture(scope="module")
def log_probs(model):
    """Full-sequence log-softmax [len, vocab] of one token list, by the plain (cache-free) forward."""
    graphdef = nnx.split(model)[0]
    forward = jax.jit(lambda state, ids: jax.nn.log_softmax(nnx.merge(graphdef, state)(ids)[0][0]))

    def run(ids):
        padded = np.zeros((1, REF_LEN), np.int32)
        padded[0, : len(ids)] = ids
        return np.asarray(forward(nnx.state(model), jnp.asarray(padded)))[: len(ids)]

    return run


def _drain(engine: DecodeEngine) -> dict:
    out = {}
    while not engine.idle:
        for seq_id, completion in engine.step():
            assert seq_id not in out
            out[seq_id] = completion
    return out


def _generate(engine, prompts, params, seeds, first_id=0) -> list:
    """One turn of fresh sequences, released afterwards."""
    ids = list(range(first_id, first_id + len(prompts)))
    for i, p, s, seed in zip(ids, prompts, params, seeds, strict=True):
        engine.add(i, p, s, seed)
    out = _drain(engine)
    for i in ids:
        engine.release(i)
    return [out[i] for i in ids]


def _assert_same(a, b):
    assert a.token_ids == b.token_ids
    assert (a.finish_reason, a.stop, a.text) == (b.finish_reason, b.stop, b.text)
    np.testing.assert_allclose(a.raw_logprobs, b.raw_logprobs, atol=1e-5)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def _check_turn(log_probs, context, completion):
    """The completion's raw log-probs equal the full recompute of ``context + its tokens``."""
    n = len(completion.token_ids)
    lp = log_probs(list(context) + completion.token_ids)[len(context) - 1 : len(context) - 1 + n]
    expected = np.take_along_axis(lp, np.asarray(completion.token_ids)[:, None], -1)[:, 0]
    np.testing.assert_allclose(completion.raw_logprobs, expected, atol=1e-5)


def test_a_first_turn_equals_the_sampler(engine, model, tok, single_mesh, prompts):
    buckets = SamplerConfig(batch_buckets=(4,), prompt_buckets=(32,), new_token_buckets=(24,))
    expected = Sampler(model, tok, single_mesh, buckets).generate(prompts, MIXED, seeds=[1, 2, 3, 4])
    got = _generate(engine, prompts, MIXED, [1, 2, 3, 4])
    assert any(len(c.token_ids) > 4 for c in got)  # decode calls ran, not only the prefill
    for e, g in zip(expected, got, strict=True):
        _assert_same(g, e)


def test_a_request_does_not_depend_on_neighbours_or_insertion_step(engine, prompts):
    sampled = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=20)
    for params in (GREEDY, sampled):
        alone = _generate(engine, [prompts[0]], [params], [11])[0]
        # Others first, each inserted at a different step; then ours, while they decode.
        engine.add("a", prompts[2], SamplingParams(temperature=0.5, top_k=3, max_new_tokens=6), 5)
        together = dict(engine.step())
        engine.add("b", prompts[1], GREEDY, 6)
        together.update(engine.step())
        engine.add("x", prompts[0], params, 11)
        together.update(engine.step())
        engine.add("c", prompts[3], sampled, 7)
        together.update(_drain(engine))
        for seq_id in "abxc":
            engine.release(seq_id)
        assert set(together) == set("abxc")
        _assert_same(together["x"], alone)


def test_continued_sequences_equal_a_full_recompute_through_page_out(model, tok, single_mesh, prompts, log_probs):
    """Three sequences, three turns each, two slots: idle caches move to the host and back."""
    engine = DecodeEngine(model, tok, single_mesh, dataclasses.replace(CONFIG, slots=2, decode_steps=1))
    params = SamplingParams(temperature=1.0, max_new_tokens=10)
    contexts = {i: list(prompts[i]) for i in range(3)}
    new = dict(contexts)
    for turn in range(3):
        for i in contexts:
            engine.add(i, new[i], params, seed=100 * turn + i)
        out = _drain(engine)
        for i, completion in out.items():
            _check_turn(log_probs, contexts[i], completion)
            observation = tok.encode_observation(completion.token_ids, f"tool says {turn}")
            contexts[i] += completion.token_ids + observation
            new[i] = observation
    stats = engine.stats()
    assert stats["paged_out"] >= 2 and stats["paged_in"] >= 2
    # Every continued turn reused its whole cached context; only new tokens (and the last sampled
    # token of the turn before) were prefilled.
    assert stats["prefill_tokens_reused"] > stats["prefill_tokens"] / 2
    for i in contexts:
        engine.release(i)
    assert engine.stats()["slots_busy"] == 0


def test_a_turn_cut_at_a_stop_string_continues_from_the_cut(engine, prompts, tok, log_probs):
    free = _generate(engine, [prompts[2]], [GREEDY], [0])[0]
    stop_text = tok.decode(free.token_ids[2:4])
    params = SamplingParams(temperature=0.0, max_new_tokens=20, stop_strings=("never-there", stop_text))
    engine.add("s", prompts[2], params, 0)
    cut = _drain(engine)["s"]
    n = next(i for i in range(1, 21) if stop_text in tok.decode(free.token_ids[:i]))
    assert (cut.token_ids, cut.finish_reason, cut.stop) == (free.token_ids[:n], "stop", stop_text)
    observation = tok.encode_observation(cut.token_ids, "go on")
    engine.add("s", observation, SamplingParams(temperature=1.0, max_new_tokens=12), 3)
    after = _drain(engine)["s"]
    engine.release("s")
    _check_turn(log_probs, list(prompts[2]) + cut.token_ids + observation, after)


def test_max_tokens_stop_tokens_and_release_mid_turn(engine, prompts):
    one = _generate(engine, [prompts[2]], [SamplingParams(temperature=0.0, max_new_tokens=1)], [0])[0]
    free = _generate(engine, [prompts[2]], [GREEDY], [0])[0]
    assert one.token_ids == free.token_ids[:1] and one.finish_reason == "length"
    stop_id = free.token_ids[3]
    by_token = SamplingParams(temperature=0.0, max_new_tokens=20, stop_token_ids=(stop_id,))
    got = _generate(engine, [prompts[2]], [by_token], [0])[0]
    cut = free.token_ids.index(stop_id) + 1
    assert (got.token_ids, got.finish_reason, got.stop) == (free.token_ids[:cut], "stop", stop_id)
    engine.add("r", prompts[1], GREEDY, 0)
    engine.step()
    engine.release("r")  # mid-turn: the slot stops decoding at once
    assert engine.idle and engine.step() == []


def test_sharded_engine_equals_unsharded(engine, tok, prompts):
    mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    sharded = DecodeEngine(_make_model(mesh), tok, mesh, CONFIG)
    assert sharded.slots == 4 and sharded._cache.k[0].sharding.spec[0] == ("data", "fsdp")
    expected = _generate(engine, prompts, MIXED, [1, 2, 3, 4])
    got = _generate(sharded, prompts, MIXED, [1, 2, 3, 4])
    for e, g in zip(expected, got, strict=True):
        _assert_same(g, e)


def test_few_programs_are_compiled(engine):
    """Programs are keyed by buckets only: decode by (window, steps, rows), rows a power of two up to the
    slots; prefill by (rows, chunk, window). No request's own length or count makes a new one."""
    kinds = {key[0] for key in engine.compiled_programs}
    assert kinds <= {"head", "prefill", "decode", "page_out", "page_in"}
    windows, rows = set(CONFIG.windows()), {1, 2, 4}
    for key in engine.compiled_programs:
        if key[0] == "decode":
            assert key[1] in windows and key[2] == CONFIG.decode_steps and key[3] in rows, key
        if key[0] == "prefill":
            assert key[1] in rows and key[2] in CONFIG.prefill_buckets and key[3] in windows, key
    assert len(engine.compiled_programs) <= 20
    assert engine.stats()["compiled_programs"] == len(engine.compiled_programs)


def test_update_weights_and_in_place_updates_are_seen(engine, model, prompts):
    before = _generate(engine, prompts[:1], [GREEDY], [0])[0].token_ids
    original = jax.tree.map(lambda x: x, nnx.state(model))
    engine.update_weights(jax.tree.map(lambda x: -x, original))
    assert _generate(engine, prompts[:1], [GREEDY], [0])[0].token_ids != before
    engine.update_weights(model)
    assert _generate(engine, prompts[:1], [GREEDY], [0])[0].token_ids == before
    try:
        nnx.update(model, jax.tree.map(lambda x: -x, original))
        assert _generate(engine, prompts[:1], [GREEDY], [0])[0].token_ids != before
    finally:
        nnx.update(model, original)
    assert _generate(engine, prompts[:1], [GREEDY], [0])[0].token_ids == before


def test_errors_name_the_argument(engine, model, tok, single_mesh, prompts):
    with pytest.raises(ValueError, match="token_ids"):
        engine.add("e", [], GREEDY, 0)
    with pytest.raises(ValueError, match="max_len"):
        engine.add("e", prompts[0], SamplingParams(max_new_tokens=200), 0)
    with pytest.raises(TypeError, match="params"):
        engine.add("e", prompts[0], {"temperature": 0.0}, 0)
    engine.add("e", prompts[0], GREEDY, 0)
    with pytest.raises(ValueError, match="already has a turn"):
        engine.add("e", prompts[1], GREEDY, 0)
    engine.release("e")
    with pytest.raises(KeyError, match="seq_id"):
        engine.release("e")
    with pytest.raises(ValueError, match=r"EngineConfig\.slots"):
        EngineConfig(slots=-1)
    with pytest.raises(ValueError, match=r"EngineConfig\.slots is derived"):
        DecodeEngine(model, tok, single_mesh, EngineConfig(max_len=64))
    with pytest.raises(ValueError, match=r"EngineConfig\.prefill_buckets"):
        EngineConfig(prefill_buckets=(32, 16))
    full = DecodeEngine(model, tok, single_mesh, dataclasses.replace(CONFIG, slots=1, page_out=False))
    full.add(0, prompts[0], SamplingParams(temperature=0.0, max_new_tokens=2), 0)
    _drain(full)
    full.add(1, prompts[1], GREEDY, 0)
    with pytest.raises(RuntimeError, match="page_out"):
        full.step()


def test_a_request_gives_the_same_tokens_in_any_batch_and_window(model, tok, single_mesh):
    """The fast path: the same request alone, among 3 and among 8, in an engine whose smallest window is
    small (buckets of 32..) or the whole cache, greedy and sampled with a seed: the same tokens, and
    log-probs equal up to the float rounding a matmul of another row count gives. The request grows
    past a window while it decodes, so a call must pick the window its last step needs."""
    rng = np.random.default_rng(0)
    others = [rng.integers(1, 250, size=n).tolist() for n in (90, 17, 45, 130, 9, 64, 33)]
    request = rng.integers(1, 250, size=61).tolist()  # decodes across the 64-token window's edge
    wide = EngineConfig(slots=8, max_len=256, prefill_buckets=(16, 32, 64, 128), decode_steps=4, window_min=32)
    for params in (GREEDY, SamplingParams(temperature=1.0, max_new_tokens=40)):
        runs = []
        for window_min in (32, wide.max_len):
            config = dataclasses.replace(wide, window_min=window_min)
            for n_others in (0, 2, 7):
                engine = DecodeEngine(model, tok, single_mesh, config)
                prompts = [request, *others[:n_others]]
                mixed = [params, *[MIXED[i % 4] for i in range(n_others)]]
                runs.append(_generate(engine, prompts, mixed, [5, *range(100, 100 + n_others)])[0])
        assert any(len(r.token_ids) > 8 for r in runs)  # decode calls ran, not only the prefill
        for other in runs[1:]:
            _assert_same(other, runs[0])


def test_compacted_decode_gives_the_same_tokens_as_decoding_every_slot(model, tok, single_mesh, prompts):
    """Turns finishing at different lengths leave few slots decoding: gathered into a smaller row count,
    they sample the same tokens as when every slot rides along, and the cache they leave continues
    the same (a second turn after an observation)."""
    config = dataclasses.replace(CONFIG, slots=8, max_len=128)
    lengths = [SamplingParams(temperature=1.0, max_new_tokens=n) for n in (3, 30, 8, 20)]
    results = {}
    for compact in (False, True):
        engine = DecodeEngine(model, tok, single_mesh, dataclasses.replace(config, compact_decode=compact))
        for i, (prompt, params) in enumerate(zip(prompts, lengths, strict=True)):
            engine.add(i, prompt, params, seed=i)
        first = _drain(engine)
        for i in range(4):
            engine.add(i, tok.encode_observation(first[i].token_ids, f"obs {i}"), lengths[3 - i], seed=10 + i)
        second = _drain(engine)
        results[compact] = (first, second, engine.stats())
    for turn in (0, 1):
        for i in range(4):
            _assert_same(results[True][turn][i], results[False][turn][i])
    full, compact = results[False][2], results[True][2]
    assert full["decode_tokens"] == compact["decode_tokens"]
    # Every slot rides along without compaction; compacted calls compute far fewer rows.
    assert full["decode_tokens_padded"] == full["decode_steps"] * 8
    assert compact["decode_tokens_padded"] < full["decode_tokens_padded"] / 2


def test_stats_count_real_and_padded_tokens_and_time(model, tok, single_mesh, prompts):
    engine = DecodeEngine(model, tok, single_mesh, CONFIG)
    _generate(engine, prompts[:3], [SamplingParams(temperature=0.0, max_new_tokens=6)] * 3, [0, 1, 2])
    stats = engine.stats()
    real = sum(len(p) for p in prompts[:3])
    assert stats["prefill_tokens"] == real
    assert real <= stats["prefill_tokens_padded"] <= 4 * 32 * stats["prefill_calls"]
    assert stats["decode_tokens"] == 3 * 5  # the first token of each turn comes from its prefill
    assert stats["decode_tokens"] <= stats["decode_tokens_padded"]
    assert stats["prefill_s"] > 0 and stats["decode_s"] > 0


def test_fixed_shapes_make_a_request_bit_identical_whatever_arrived_with_it(model, tok, single_mesh, prompts):
    """Every shape fixed (``EngineConfig.exact``, what ``rollout.reproducible`` runs): exact equality, not 1e-5."""
    config = dataclasses.replace(CONFIG.exact(), prefill_rows=2)
    params = SamplingParams(temperature=1.0, max_new_tokens=24)
    alone = _generate(DecodeEngine(model, tok, single_mesh, config), [prompts[2]], [params], [3])[0]
    crowded = DecodeEngine(model, tok, single_mesh, config)
    for i, p in enumerate(prompts):
        crowded.add(i, p, params if i == 2 else MIXED[i], 3 if i == 2 else i)
        crowded.step()
    out = _drain(crowded)
    got = out.get(2)
    if got is None:  # finished during the staggered steps
        pytest.fail("the request finished before the drain: raise max_new_tokens")
    assert got.token_ids == alone.token_ids and got.raw_logprobs == alone.raw_logprobs


def test_two_weight_versions_decode_side_by_side_bit_identical(model, tok, single_mesh, prompts):
    """Asynchronous RL's case: turns of an older policy still decode while a newer one's start. Each
    turn equals the same turn decoded alone with its own weights, bit for bit, across two turns."""
    config = dataclasses.replace(CONFIG.exact(), prefill_rows=2)
    params = SamplingParams(temperature=1.0, max_new_tokens=12)
    old = jax.tree.map(lambda x: x, nnx.state(model))
    new = jax.tree.map(lambda x: x * 0.9, old)

    def two_turns(engine, seq_id, prompt, seed, key):
        engine.add(seq_id, prompt, params, seed, weights=key)
        first = _drain(engine)[seq_id]
        engine.add(seq_id, tok.encode(" obs"), params, seed + 1, weights=key)
        second = _drain(engine)[seq_id]
        engine.release(seq_id)
        return first, second

    expected = {}
    for i, key, state in ((0, "old", old), (1, "new", new), (2, "old", old), (3, "new", new)):
        alone = DecodeEngine(model, tok, single_mesh, config)
        alone.load_weights(key, state)
        expected[i] = two_turns(alone, i, prompts[i], 10 + i, key)
    assert (
        expected[0][0].token_ids != expected[1][0].token_ids
        or expected[0][0].raw_logprobs != expected[1][0].raw_logprobs
    )

    engine = DecodeEngine(model, tok, single_mesh, config)
    engine.load_weights("old", old)
    engine.load_weights("new", new)
    got: dict = {}
    turn: dict = {}
    for i in range(4):  # staggered: each version's turns start while the other's decode
        engine.add(i, prompts[i], params, 10 + i, weights="old" if i % 2 == 0 else "new")
        turn[i] = 0
        for seq_id, completion in engine.step():
            got.setdefault(seq_id, []).append(completion)
    while not engine.idle or any(len(got.get(i, [])) < 2 for i in range(4)):
        for i in range(4):  # a finished first turn continues with an observation at once
            if len(got.get(i, [])) == 1 and turn[i] == 0:
                engine.add(i, tok.encode(" obs"), params, 11 + i, weights="old" if i % 2 == 0 else "new")
                turn[i] = 1
        for seq_id, completion in engine.step():
            got.setdefault(seq_id, []).append(completion)
    for i in range(4):
        for g, e in zip(got[i], expected[i], strict=True):
            assert g.token_ids == e.token_ids and g.raw_logprobs == e.raw_logprobs and g.logprobs == e.logprobs
    with pytest.raises(KeyError, match="weights"):
        engine.add(9, prompts[0], params, 0, weights="missing")
    engine.add(9, prompts[0], params, 0, weights="old")
    with pytest.raises(ValueError, match="in flight"):
        engine.unload_weights("old")
    engine.release(9)
    engine.unload_weights("old")
    assert engine.weights_keys == {None, "new"}
