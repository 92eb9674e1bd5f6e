"""The Llama family: RMSNorm, RoPE, SwiGLU and grouped-query attention, no biases.

    blocks.py   LlamaDecoder and its parts (the RoPE families built on it reuse them)
    rotary.py   RoPE with Llama-3.1's frequency scaling
    hf.py       LlamaForCausalLM's config and tensor names, both ways
    rules.py    its config rules
    spec.py     FAMILY
"""
