"""The Gemma family (Gemma 1): Llama's attention (RoPE, grouped or multi-query K/V heads, an
explicit ``head_dim``) with a GeGLU FFN (tanh GELU), an RMSNorm that scales by 1 + w, and
token embeddings multiplied by √d_model; the head is usually the embedding.

    blocks.py   GemmaDecoder: LlamaDecoder with Gemma's norm, FFN and embedding
    hf.py       GemmaForCausalLM's config and tensor names, both ways
    rules.py    its config rules (Llama's fields and rules)
    spec.py     FAMILY
"""
