"""The Qwen3 family: Llama's blocks with an RMSNorm on every query and key head (before
RoPE) and an explicit ``head_dim``; no q/k/v biases. Sliding-window attention is refused.

    blocks.py   Qwen3Decoder: LlamaDecoder whose attention norms each head's q and k
    hf.py       Qwen3ForCausalLM's config and tensor names, both ways
    rules.py    its config rules (Llama's)
    spec.py     FAMILY
"""
