"""From a model to text: the chat format, tokenizers, token selection and the batched sampler.

  - :mod:`rl.generation.chat_format`: Qwen2.5's ChatML + Hermes tool calls, rendered in Python,
    piece by piece (prompt, completion, continuation).
  - :mod:`rl.generation.tokenizer`: the byte-level default and Hugging Face tokenizers, encoding a
    conversation turn by turn so a trajectory is never re-tokenized (no JAX).
  - :mod:`rl.generation.gguf_tokenizer`: the tokenizer and chat template a GGUF file carries.
  - :mod:`rl.generation.token_selection`: pure per-row temperature / top-k / top-p / greedy choice
    of the next token, with its log-probs.
  - :mod:`rl.generation.sampler`: jitted, bucketed, batch-invariant generation (``Sampler``).
  - :mod:`rl.generation.engine`: the default path of a rollout: a slot-based decode engine
    (``DecodeEngine``) that takes turns as they come and keeps each episode's KV cache across turns.
    Its parts: :mod:`rl.generation.engine_config` (``EngineConfig``, its sizes),
    :mod:`rl.generation.engine_programs` (its pure device programs: prefill, decode, page out/in),
    :mod:`rl.generation.engine_weights` (the parameter sets it decodes with, by key) and
    :mod:`rl.generation.engine_seqs` (one sequence's host state and how its turn ends).

Modules are imported explicitly; this file imports none of them.
"""
