"""The Llama family: RMSNorm, RoPE, SwiGLU and grouped-query attention, no biases.

    blocks.py   LlamaDecoder and its parts (the RoPE families built on it reuse them)
    rotary.py   RoPE with Llama-3.1's frequency scaling
    hf.py       LlamaForCausalLM's config and tensor names, both ways
    args.py     LlamaArgs: its own config fields (tying, RoPE), shared by the families built on it
    rules.py    ARGS and its config rules
    spec.py     FAMILY
"""
